// Portable (sm80 and newer) block-sparse attention backward (SPEC 1, "Backward"), after the
// FlashAttention-2 backward: KV-major CTAs over the GPU-built key-to-query reverse map, dK/dV in
// fp32 registers, mma.sync tensor cores, Q/dO tiles double-buffered with cp.async.
//
// Steps, all on the caller's stream, no host synchronisation and no host read of a metadata
// value (the whole call can be captured in a CUDA graph and replayed with new metadata values):
//   1. memset of the fp32 accumulators in the workspace (dQ; dK/dV when rows may be shared);
//      preprocess: delta = rowsum(dO * o), lse2 = lse * log2(e)           (bsa_backward_aux.cu)
//   2. the reverse map (reverse_map_gpu.hpp), rows split into groups of `bucket` entries
//   3. the main kernel: a CTA per work item, dK/dV for its KV block, dQ by red.global.add into
//      the fp32 accumulator                                            (bsa_backward_kernel.cuh)
//   4. dq = scale * dQ accumulator -> dtype of q
//   5. rows with several groups only: dk, dv from their fp32 accumulators. Rows with one group
//      (the "single owner" case, empty rows included) were written by the main kernel itself.
//
// Bucket (entries per group), chosen from SHAPES only:
//   options.bucket_size > 0: that size. 0 (automatic): one group per row (single owners, no dK/dV
//   workspace, no conversion pass) when the rows alone give at least 2 CTAs per CTA slot of the
//   GPU; otherwise rows are split so that there are about 4 work items per slot, assuming every
//   query block lists min(K_max, N_kv) blocks (at least 4 entries per group).
// Deterministic mode (options.deterministic): one group per row whatever bucket_size says (dK/dV
// accumulated by one CTA in a fixed order), and dQ computed query-major without atomics by
// bsa_backward_dq_kernel.cuh instead of step 3's red.global.add. Gradients are then bitwise
// identical from run to run; dQ costs 3 extra GEMMs per (query tile, key tile) pair.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "common/problem.hpp"
#include "cuda/bsa_backward_plan.hpp"
#include "cuda/reverse_map_gpu.hpp"

namespace sa::portable {

// "" when bsa_backward serves `p` (a CUDA problem on a device of compute capability >= 8.0,
// which the caller checks), otherwise the reason.
std::string bsa_backward_unsupported(const BsaBwdProblem& p);

// Device workspace bytes bsa_backward needs for `p` (shapes and options only; any alignment of
// the pointer is accepted). Queries the SM count of p.device_index; CUB's size query looks at the
// current device, so call it with p.device_index current.
size_t bsa_backward_workspace_bytes(const BsaBwdProblem& p);

// Writes every element of p.dq, p.dk, p.dv; launches on `stream`, no host sync. `workspace` holds
// at least bsa_backward_workspace_bytes(p) bytes; its contents need not be initialised.
// Throws sa::Error (SA_ERROR_UNSUPPORTED) when bsa_backward_unsupported(p) is not empty.
void bsa_backward(const BsaBwdProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream);

// A backward's main kernel (step 3): dK/dV of every reverse-map work item, and dQ into
// buf.dq_accum when the plan has one. Returns true when it has also launched dq's conversion
// (the Hopper path converts beside its main kernel), false to leave dq to step 4.
using BsaBackwardMainKernel = bool (*)(const BsaBwdProblem& p, const BsaBwdPlan& plan,
                                       const BsaBwdBuffers& buf, const ReverseMapDevice& map,
                                       cudaStream_t stream);

// Steps 1, 2, 4 and 5 of the BSA backward around `main` (step 3), shared by the portable and the
// Hopper backwards: the workspace carved by `plan` (SA_ERROR_WORKSPACE naming `op`), the
// accumulators zeroed, the preprocess, the reverse map; after `main`, unless it has converted dq
// itself, dq from the accumulator (`dq_tiled`: in the fragment-tile order of the Hopper kernel's
// bulk reductions, whose own conversion runs beside its kernel when it can) or, without
// one (deterministic mode), from the query-major kernel (bsa_backward_dq_kernel.cuh, no atomics;
// bsa_backward_unsupported's limits apply), and dk, dv of the rows with several groups. The
// caller checks support first.
void bsa_backward_around(const BsaBwdProblem& p, const BsaBwdPlan& plan, void* workspace,
                         size_t workspace_bytes, const char* op, bool dq_tiled,
                         BsaBackwardMainKernel main, cudaStream_t stream);

}  // namespace sa::portable
