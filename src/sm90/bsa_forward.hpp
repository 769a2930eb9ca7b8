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

// Workspace bytes bsa_forward asks for `p`: when split-KV runs (bf16 calls whose query blocks
// cannot fill the GPU; bsa_forward.cu, forward_splits), the per-split fp32 O and LSE; for masked
// and packed calls (which never split), a tile counter (256 bytes: dynamic tiles); else 0.
size_t bsa_forward_workspace_bytes(const BsaFwdProblem& p);

// True when the workspace only speeds `p` up (no split-KV: at most the tile counter, without which
// the masked and packed kernels take their tiles in the static order, same results).
bool bsa_forward_workspace_optional(const BsaFwdProblem& p);

// Writes every element of p.o (rows < S_q) and p.lse; launches on `stream`, no host sync.
// Throws sa::Error (SA_ERROR_UNSUPPORTED) when bsa_forward_unsupported(p) is not empty, and
// SA_ERROR_WORKSPACE when split-KV runs without bsa_forward_workspace_bytes(p) of workspace (or
// when the internal tuning forces dynamic tiles, Tuning::sm90_fwd_dyn = 2, without the counter's).
void bsa_forward(const BsaFwdProblem& p, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream);

}  // namespace sa::sm90
