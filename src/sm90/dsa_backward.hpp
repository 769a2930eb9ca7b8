// Hopper (sm_90a) DSA backward, top-k sparse MLA (SPEC 2): the main kernel (dq, and dkv rows
// into an fp32 workspace by reductions or, deterministic mode, into an int64 one by fixed-point
// reductions; dsa_backward_kernel.cuh has the design) as a policy of the shared driver
// (src/cuda/dsa_backward_driver.hpp: accumulator, fixed-point scale, dkv conversion, d_sink).
// AUTO's choice: src/sm90/sm90_impl.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "common/problem.hpp"

namespace sa::sm90 {

// "" when dsa_backward serves `p` (a CUDA problem on an sm_90 device, which the caller checks),
// otherwise the reason, e.g. "H = 16 (sm90 DSA backward supports 64, 128)".
std::string dsa_backward_unsupported(const DsaBwdProblem& p);

// Device workspace bytes for `p` (the driver's plan at 64 heads per work item). `slice_tokens`
// > 0 pins the token groups' slice (tests; deterministic mode has no slices).
size_t dsa_backward_workspace_bytes(const DsaBwdProblem& p, int64_t slice_tokens = 0);

// Writes every element of p.dq, p.dkv and p.d_sink (when given); launches on `stream` (device
// p.device_index current), no host sync. Throws sa::Error (SA_ERROR_UNSUPPORTED) when
// dsa_backward_unsupported(p) is not empty, SA_ERROR_WORKSPACE when the workspace is short.
void dsa_backward(const DsaBwdProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream, int64_t slice_tokens = 0);

}  // namespace sa::sm90
