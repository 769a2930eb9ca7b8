// Hopper (sm_90a) DSA forward, top-k sparse MLA prefill (SPEC 2): a producer warpgroup gathers
// the selected kv rows with cp.async, two consumer warpgroups run wgmma on them
// (dsa_forward_kernel.cuh has the design and its timeline).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/problem.hpp"

namespace sa::sm90 {

// "" when dsa_forward serves `p` (a CUDA problem on an sm_90 device, which the caller checks),
// otherwise the reason, e.g. "H = 48 (sm90 DSA forward supports 16, 32, 64, 128)".
std::string dsa_forward_unsupported(const DsaFwdProblem& p);

// Writes every element of p.out and p.lse; launches on `stream` (device p.device_index must be
// current), no host sync. Throws sa::Error (SA_ERROR_UNSUPPORTED) when
// dsa_forward_unsupported(p) is not empty.
void dsa_forward(const DsaFwdProblem& p, cudaStream_t stream);

}  // namespace sa::sm90
