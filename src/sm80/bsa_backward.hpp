// Portable (sm80 and newer) block-sparse attention backward (SPEC 1, "Backward"), after the
// FlashAttention-2 backward: KV-major CTAs over the GPU-built key-to-query reverse map, dK/dV in
// fp32 registers, mma.sync tensor cores, Q/dO tiles double-buffered with cp.async.
//
// The steps (accumulators, preprocess, reverse map, dq and dk/dv conversions) are the driver's
// (cuda/bsa_backward_driver.hpp, which lists them); this path supplies its kernel policy:
//   - the main kernel (bsa_backward_kernel.cuh): a CTA per work item, dK/dV for its KV block, dQ
//     by red.global.add into the fp32 accumulator, in natural order; no tail order;
//   - CTA slots for the automatic bucket: as many CTAs as fit an SM's shared memory, at most 1
//     per SM at block 128 and 2 at block 64;
//   - the query-major dQ kernel of deterministic mode (bsa_backward_dq_kernel.cuh, no atomics;
//     dQ costs 3 extra GEMMs per (query tile, key tile) pair), which the Hopper policy uses too.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "common/problem.hpp"

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

}  // namespace sa::portable
