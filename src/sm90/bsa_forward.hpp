// Hopper (sm_90a) block-sparse attention forward (SPEC 1): TMA loads of Q and of the K/V blocks
// each query block lists, wgmma, an mbarrier pipeline, one producer warp and one or two consumer
// warpgroups (bsa_forward_kernel.cuh has the design and its timeline).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "common/problem.hpp"

namespace sa::sm90 {

// "" when bsa_forward serves `p` (a CUDA problem on an sm_90 device, which the caller checks),
// otherwise the reason, e.g. "D = 96, D_v = 96 (sm90 forward supports D == D_v in {64, 128})".
std::string bsa_forward_unsupported(const BsaFwdProblem& p);

// Workspace bytes bsa_forward needs for `p`: 0 unless split-KV runs (bf16 calls whose query
// blocks cannot fill the GPU; bsa_forward.cu, forward_splits), then the per-split fp32 O and LSE.
size_t bsa_forward_workspace_bytes(const BsaFwdProblem& p);

// Writes every element of p.o (rows < S_q) and p.lse; launches on `stream`, no host sync.
// Throws sa::Error (SA_ERROR_UNSUPPORTED) when bsa_forward_unsupported(p) is not empty, and
// SA_ERROR_WORKSPACE when split-KV runs without bsa_forward_workspace_bytes(p) of workspace.
void bsa_forward(const BsaFwdProblem& p, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream);

}  // namespace sa::sm90
