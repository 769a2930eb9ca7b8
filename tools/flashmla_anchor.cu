// The FlashMLA anchor (flashmla_anchor.hpp): fills FlashMLA's argument struct and calls its own
// sm90 dispatcher. Built only with -DSA_FLASHMLA_DIR (C++20, FlashMLA's headers and sources).
#include "flashmla_anchor.hpp"

#include "params.h"                      // FlashMLA: SparseAttnFwdParams
#include "sm90/prefill/sparse/fwd.h"     // FlashMLA: sm90::run_fwd_kernel

namespace sa_tool {

bool flashmla_anchor_built() { return true; }

const char* flashmla_unsupported(const FlashMlaFwdCall& c, int major, int minor) {
  if (major != 9 || minor != 0) return "FlashMLA's sparse prefill anchor runs on sm_90 only";
  if (c.h != 64 && c.h != 128) return "FlashMLA's sm90 sparse prefill supports H 64 and 128";
  if (c.d_qk != 512 && c.d_qk != 576) return "FlashMLA's sparse prefill supports D_qk 512, 576";
  if (c.topk <= 0 || c.topk % 128 != 0) return "FlashMLA's sparse prefill needs topk % 128 == 0";
  return "";
}

cudaError_t flashmla_sparse_fwd(const FlashMlaFwdCall& c, int num_sms, cudaStream_t stream) {
  SparseAttnFwdParams p{};
  p.s_q = c.s_q;
  p.s_kv = c.s_kv;
  p.h_q = c.h;
  p.h_kv = 1;
  p.d_qk = c.d_qk;
  p.d_v = 512;
  p.topk = c.topk;
  p.sm_scale = c.scale;
  p.sm_scale_div_log2 = c.scale * 1.4426950408889634f;  // FlashMLA's name: scale * log2(e)
  p.q = static_cast<cutlass::bfloat16_t*>(const_cast<void*>(c.q));
  p.kv = static_cast<cutlass::bfloat16_t*>(const_cast<void*>(c.kv));
  p.indices = const_cast<int*>(c.topk_idx);
  p.attn_sink = const_cast<float*>(c.sink);
  p.topk_length = const_cast<int*>(c.topk_length);
  p.stride_q_s_q = c.h * c.d_qk;
  p.stride_q_h_q = c.d_qk;
  p.stride_kv_s_kv = c.d_qk;
  p.stride_kv_h_kv = c.d_qk;
  p.stride_indices_s_q = c.topk;
  p.stride_indices_h_kv = c.topk;
  p.out = static_cast<cutlass::bfloat16_t*>(c.out);
  p.max_logits = c.max_logits;
  p.lse = c.lse;
  p.num_sm = num_sms;
  p.stream = stream;
  sm90::run_fwd_kernel(p);
  return cudaGetLastError();
}

}  // namespace sa_tool
