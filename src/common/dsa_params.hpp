// The fields that every DSA kernel's argument struct shares, under the same names (portable
// forward and backward, Hopper forward and backward): the tensors both directions read, the index
// metadata, the sink, their element strides, S_kv, topk and scale * log2(e). One filler for all,
// from a forward or backward problem; each struct's own fields are set by its caller. Host only.
#pragma once

#include "common/host_numeric.hpp"
#include "common/narrow.hpp"
#include "common/problem.hpp"

namespace sa {

template <class Params, class Problem>
void fill_dsa_common_params(Params& prm, const Problem& p) {
  prm.q = p.q.data;
  prm.kv = p.kv.data;
  prm.out = p.out.data;
  prm.lse = p.lse;
  prm.idx = p.meta.topk_idx.data;
  prm.len = p.meta.topk_length.data;
  prm.sink = p.meta.sink;
  prm.q_ss = p.q.ss;
  prm.q_sh = p.q.sh;
  prm.kv_ss = p.kv.ss;
  prm.o_ss = p.out.ss;
  prm.o_sh = p.out.sh;
  prm.lse_ss = p.lse_stride[0];
  prm.lse_sh = p.lse_stride[1];
  prm.idx_ss = p.meta.topk_idx.stride[0];
  prm.idx_si = p.meta.topk_idx.stride[1];
  prm.len_s = p.meta.topk_length.stride[0];
  prm.sink_s = p.meta.sink_stride;
  prm.skv = p.dims.Skv;
  prm.topk = narrow_i32(p.dims.topk, "topk");
  prm.scale_log2 = scale_times_log2e(p.scale);
}

}  // namespace sa
