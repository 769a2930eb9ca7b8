// Portable (sm80 and newer) DSA forward, top-k sparse MLA prefill (SPEC 2): one CTA per
// (query token, group of 64 heads) gathers the token's selected kv rows with cp.async and runs
// Q K^T, an online softmax and P V on mma.sync tensor cores. See dsa_forward.cu for the design.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/problem.hpp"

namespace sa::portable {

// Knobs that tests and benchmarks may pin; the defaults pick the fastest variant the device
// allows.
struct DsaForwardTuning {
  // Keys per chunk: 64 (needs ~227 KB of shared memory per block: sm90), 32 (~150 KB: sm80),
  // or 0 for the largest the device offers (dsa_forward_smem_bytes says how much each needs).
  int block_n = 0;
};

// Dynamic shared memory of the kernel with chunks of `block_n` (32 or 64) keys, in bytes.
int dsa_forward_smem_bytes(int block_n);

// "" when dsa_forward serves `p` (a CUDA problem on a device of compute capability >= 8.0,
// which the caller checks), otherwise the reason, e.g. "D_qk = 256 (supports 512, 576)".
std::string dsa_forward_unsupported(const DsaFwdProblem& p);

// Writes every element of p.out and p.lse; launches on `stream` (on device p.device_index, which
// must be current), no host synchronisation. Throws sa::Error when the problem is unsupported.
void dsa_forward(const DsaFwdProblem& p, cudaStream_t stream,
                 const DsaForwardTuning& tuning = DsaForwardTuning{});

}  // namespace sa::portable
