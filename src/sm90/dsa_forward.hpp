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

// Workspace that speeds dsa_forward up: with topk_length (items of different lengths), a 4-byte
// counter (256 bytes asked) from which persistent CTAs take the items (dynamic scheduling); 0
// otherwise. Optional: without it those problems run one CTA per item.
size_t dsa_forward_workspace_bytes(const DsaFwdProblem& p);

// Writes every element of p.out and p.lse; launches on `stream` (device p.device_index must be
// current), no host sync. `workspace` may be null (or smaller than dsa_forward_workspace_bytes):
// then without dynamic scheduling. Throws sa::Error (SA_ERROR_UNSUPPORTED) when
// dsa_forward_unsupported(p) is not empty.
void dsa_forward(const DsaFwdProblem& p, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream);

}  // namespace sa::sm90
