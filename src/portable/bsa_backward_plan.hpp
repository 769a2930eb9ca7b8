// The plan of a BSA backward call, shared by the portable and Hopper backwards: the reverse map's
// bucket (one owner per KV tile unless the rows are too few to fill the GPU), and the carve-up of
// the caller's workspace (LSE in log2 units, Delta, the fp32 dQ accumulator, the fp32 dK/dV
// accumulators when some row has several owners, the reverse map). Shapes and the GPU's size
// only: a captured graph replays with new metadata values.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/problem.hpp"

namespace sa::portable {

struct BsaBwdPlan {
  int32_t bucket = 0;           // asked of the reverse map; 0: one group per row
  bool several_owners = false;  // some row may have several groups: dK/dV accumulators
  bool dq_accumulator = true;   // false: dQ comes from a query-major pass (deterministic mode)
  int64_t Sq_pad = 0, Skv_pad = 0;
  // Byte offsets from the 256-byte aligned base.
  size_t lse2 = 0, delta = 0, dq_accum = 0, dk_accum = 0, dv_accum = 0, map = 0;
  size_t dq_bytes = 0, dkv_bytes = 0, map_bytes = 0;
  size_t total = 0;  // what the caller provides: everything plus the alignment slack
};

// The workspace pointers of a plan (null where the plan has no such buffer).
struct BsaBwdBuffers {
  float* lse2 = nullptr;
  float* delta = nullptr;
  float* dq_accum = nullptr;
  float* dk_accum = nullptr;
  float* dv_accum = nullptr;
  void* map = nullptr;
};

// `cta_slots`: main-kernel CTAs resident on the whole GPU at once (the automatic bucket aims at
// about 4 work items per slot when the rows alone give fewer than 2). `single_owner` forces one
// group per row whatever options.bucket_size says (deterministic mode); `dq_accumulator` false
// leaves the dQ accumulator out.
BsaBwdPlan make_bsa_backward_plan(const BsaBwdProblem& p, int64_t cta_slots, bool single_owner,
                                  bool dq_accumulator);

// Checks the caller's workspace against the plan (SA_ERROR_WORKSPACE naming `op`) and carves it.
BsaBwdBuffers carve_bsa_backward_workspace(const BsaBwdPlan& plan, void* workspace, size_t bytes,
                                           const char* op);

// Zeroes the accumulators of the plan on `stream`.
void zero_bsa_backward_accumulators(const BsaBwdPlan& plan, const BsaBwdBuffers& buf,
                                    cudaStream_t stream);

}  // namespace sa::portable
