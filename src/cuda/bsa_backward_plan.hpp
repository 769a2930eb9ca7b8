// The plan of a BSA backward call, shared by the portable and Hopper backwards: the reverse map's
// bucket (one owner per KV tile unless the rows are too few to fill the GPU), and the carve-up of
// the caller's workspace (LSE in log2 units, Delta, the fp32 dQ accumulator, the fp32 dK/dV
// accumulators when some row has several owners, the reverse map). Shapes and the GPU's size
// only: a captured graph replays with new metadata values. Packed batches (meta.varlen()): the
// per-head layouts of cuda/bsa_packed_rows.hpp (Sq_pad = packed_stat_rows(T_q, B, block) rows of
// stats and dQ per head, Skv_pad = T_kv keys of dK/dV per KV head, no batch dimension).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/fast_divisor.hpp"
#include "common/host_numeric.hpp"
#include "common/narrow.hpp"
#include "common/problem.hpp"
#include "cuda/reverse_map_gpu.hpp"

namespace sa::portable {

struct BsaBwdPlan {
  int32_t bucket = 0;           // asked of the reverse map; 0: one group per row
  int32_t tail_items = 0;       // asked of the reverse map (its step 6); 0: none
  bool several_owners = false;  // some row may have several groups: dK/dV accumulators
  bool dq_accumulator = true;   // false: dQ comes from a query-major pass (deterministic mode)
  int64_t Sq_pad = 0, Skv_pad = 0;
  // Byte offsets from the 256-byte aligned base.
  size_t lse2 = 0, delta = 0, dq_accum = 0, dk_accum = 0, dv_accum = 0, map = 0;
  // dq_bytes covers the dQ accumulator and, right after it, dq_ready: B * H_kv + 1 counters
  // for a dQ conversion that runs beside the main kernel (the Hopper path).
  size_t dq_bytes = 0, dq_ready = 0, dkv_bytes = 0, map_bytes = 0;
  int64_t dq_ready_count = 0;  // B * H_kv + 1
  size_t total = 0;  // what the caller provides: everything plus the alignment slack
};

// The workspace pointers of a plan (null where the plan has no such buffer).
struct BsaBwdBuffers {
  float* lse2 = nullptr;
  float* delta = nullptr;
  float* dq_accum = nullptr;
  uint32_t* dq_ready = nullptr;  // [B * H_kv + 1]
  float* dk_accum = nullptr;
  float* dv_accum = nullptr;
  void* map = nullptr;
};

// `cta_slots`: main-kernel CTAs resident on the whole GPU at once (the automatic bucket aims at
// about 4 work items per slot when the rows alone give fewer than 2). `single_owner` forces one
// group per row whatever options.bucket_size says (deterministic mode); `dq_accumulator` false
// leaves the dQ accumulator out.
BsaBwdPlan make_bsa_backward_plan(const BsaBwdProblem& p, int64_t cta_slots, bool single_owner,
                                  bool dq_accumulator, int32_t tail_items = 0);

// Checks the caller's workspace against the plan (SA_ERROR_WORKSPACE naming `op`) and carves it.
BsaBwdBuffers carve_bsa_backward_workspace(const BsaBwdPlan& plan, void* workspace, size_t bytes,
                                           const char* op);

// Zeroes the dK/dV accumulators of the plan on `stream` (the dQ accumulator and its counters are
// zeroed by the preprocess kernel, in the same pass as Delta).
void zero_bsa_backward_accumulators(const BsaBwdPlan& plan, const BsaBwdBuffers& buf,
                                    cudaStream_t stream);

// The fields that the portable and Hopper BSA backward kernels' argument structs share under the
// same names: the shapes (padded row counts from the plan), the metadata, the scale and the
// workspace's buffers (null where the plan has none). Each struct's own fields (tensors or TMA
// descriptors) are set by its caller. Host only.
template <class Params>
void fill_bsa_bwd_common_params(Params& prm, const BsaBwdProblem& p, const BsaBwdPlan& plan,
                                const BsaBwdBuffers& buf) {
  const BsaDims& d = p.dims;
  prm.lse2 = buf.lse2;
  prm.delta = buf.delta;
  prm.dq_accum = buf.dq_accum;
  prm.dk_accum = buf.dk_accum;
  prm.dv_accum = buf.dv_accum;
  prm.dims = d;
  prm.meta = p.meta;
  prm.Sq = narrow_i32(d.Sq, "S_q");
  prm.Skv = narrow_i32(d.Skv, "S_kv");
  prm.Sq_pad = narrow_i32(plan.Sq_pad, "S_q padded");
  prm.Skv_pad = narrow_i32(plan.Skv_pad, "S_kv padded");
  prm.group = narrow_i32(d.group(), "H_q / H_kv");
  prm.Hq = narrow_i32(d.Hq, "H_q");
  prm.Hkv = narrow_i32(d.Hkv, "H_kv");
  prm.Nq = narrow_i32(d.Nq, "N_q");
  prm.Nkv = narrow_i32(d.Nkv, "N_kv");
  prm.nq_div = FastDivisor::make(prm.Nq);
  prm.scale = p.scale;
  prm.scale_log2 = scale_times_log2e(p.scale);
}

// The reverse map's work items, for the main kernels.
template <class Params>
void fill_bsa_bwd_map_params(Params& prm, const ReverseMapDevice& map) {
  prm.entries = map.entries;
  prm.row_groups = map.row_groups;
  prm.item_row = map.item_row;
  prm.item_begin = map.item_begin;
  prm.item_end = map.item_end;
  prm.num_items = map.num_items;
}

}  // namespace sa::portable
