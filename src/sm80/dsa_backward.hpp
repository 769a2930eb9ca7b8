// Portable (sm80 and newer) DSA backward, top-k sparse MLA (SPEC 2): one CTA per (query token,
// group of heads) recomputes P from the forward's lse, accumulates dq on chip and reduces each
// gathered key's dkv row over the CTA's heads before one fp32 reduction per element into a
// workspace, converted to the dkv dtype at the end. This path supplies the main kernel
// (dsa_backward_kernel.cuh) as a policy of the shared driver (src/cuda/dsa_backward_driver.hpp:
// workspace, deterministic mode, the passes around the kernel).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/problem.hpp"

namespace sa::portable {

// Knobs that tests and benchmarks may pin; the defaults pick the fastest variant the device
// allows.
struct DsaBackwardTuning {
  // Heads per CTA: 64 (needs ~227 KB of shared memory per block at D_qk 576: sm90), 32 (~150 KB:
  // sm80), or 0: 64 when H >= 64 and the device has the shared memory, else 32.
  int block_m = 0;
  // Deterministic mode: tokens per slice (> 0 pins it, tests use it to cover several slices), or
  // 0: as many as keep the slice's partial dkv rows within ~2 GiB.
  int64_t deterministic_slice_tokens = 0;
};

// Dynamic shared memory of the main kernel for (D_qk, heads per CTA), in bytes.
int dsa_backward_smem_bytes(int dqk, int block_m);

// "" when dsa_backward serves `p` (a CUDA problem on a device of compute capability >= 8.0,
// which the caller checks), otherwise the reason, e.g. "D_qk = 256 (supports 512, 576)".
std::string dsa_backward_unsupported(const DsaBwdProblem& p);

// Device workspace of dsa_backward(p, ..., tuning), in bytes: the fp32 dkv accumulator
// [S_kv, D_qk], the d_sink terms [H, S_q] (when p.d_sink), and in deterministic mode the partial
// dkv rows of one token slice (at most ~2 GiB) with its sort buffers.
size_t dsa_backward_workspace_bytes(const DsaBwdProblem& p,
                                    const DsaBackwardTuning& tuning = DsaBackwardTuning{});

// Writes every element of p.dq, p.dkv and p.d_sink (when given); launches on `stream` (on device
// p.device_index, which must be current), no host synchronisation. Throws sa::Error when the
// problem is unsupported or the workspace is too small.
void dsa_backward(const DsaBwdProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream, const DsaBackwardTuning& tuning = DsaBackwardTuning{});

}  // namespace sa::portable
