// Portable (sm80 and newer) block-sparse attention forward, FlashAttention-2 style (SPEC 1):
// one CTA per (query block, query head, batch), mma.sync tensor cores, online softmax in
// registers, K/V tiles of 64 keys double-buffered with cp.async.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/problem.hpp"

namespace sa::portable {

// "" when bsa_forward serves `p` (a CUDA problem on a device of compute capability >= 8.0,
// which the caller checks), otherwise the reason, e.g.
// "D = 96, D_v = 96 (portable forward supports D == D_v in {64, 128})".
std::string bsa_forward_unsupported(const BsaFwdProblem& p);

// Writes every element of p.o (rows < S_q) and p.lse; launches on `stream`, no host sync.
// Throws sa::Error (SA_ERROR_UNSUPPORTED) when bsa_forward_unsupported(p) is not empty.
void bsa_forward(const BsaFwdProblem& p, cudaStream_t stream);

}  // namespace sa::portable
