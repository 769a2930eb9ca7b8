// Hopper (sm_90a) block-sparse attention backward (SPEC 1, "Backward"): the driver's steps
// (preprocess, GPU reverse map, dK/dV conversion: cuda/bsa_backward_driver.hpp) around a
// main kernel with TMA loads, wgmma and a producer warp (bsa_backward_kernel.cuh has the design)
// and the dQ conversion that runs beside it (bsa_dq_convert.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "common/problem.hpp"

namespace sa::sm90 {

// "" when bsa_backward serves `p` (a CUDA problem on an sm_90 device, which the caller checks),
// otherwise the reason, e.g. "block size 96 (sm90 backward supports 64 and 128)".
std::string bsa_backward_unsupported(const BsaBwdProblem& p);

// Device workspace bytes for `p` (shapes and options only). Call with p.device_index current.
size_t bsa_backward_workspace_bytes(const BsaBwdProblem& p);

// Writes every element of p.dq, p.dk, p.dv; launches on `stream`, no host sync, no host read of
// a metadata value (graph-capturable). Throws sa::Error (SA_ERROR_UNSUPPORTED) when
// bsa_backward_unsupported(p) is not empty, SA_ERROR_WORKSPACE when the workspace is too small.
void bsa_backward(const BsaBwdProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream);

}  // namespace sa::sm90
