// Portable (sm80 and newer) DSA backward, top-k sparse MLA (SPEC 2): one CTA per (query token,
// group of heads) recomputes P from the forward's lse, accumulates dq on chip and reduces each
// gathered key's dkv row over the CTA's heads before one fp32 reduction per element into a
// workspace, converted to the dkv dtype at the end. Design and costs: dsa_backward_kernel.cuh
// (main kernel) and dsa_backward.cu (workspace, deterministic mode).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/problem.hpp"
#include "cuda/dsa_backward_aux.hpp"
#include "cuda/dsa_backward_params.hpp"

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

// "" when the strides and alignment of p's tensors suit these passes and the main kernels
// (contiguous last dimensions, 16-byte rows of q, kv, out and dout, dq pairs, dkv quads),
// otherwise the reason.
std::string dsa_backward_layout_unsupported(const DsaBwdProblem& p);

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

// ---- this backward's passes around another implementation's main kernel (the Hopper one) ----
// A main kernel: `grid` CTAs over `prm` (tok_begin and the workspace pointers set) on `stream`,
// device `device` current. Its contract is the portable kernel's: CTA b is token
// prm.tok_begin + b / head_groups and heads [M (b % head_groups), +M), M heads per CTA; it
// writes dq, the d_sink terms (when prm.sink_terms) and each active slot's head-reduced dkv row, reduced
// into prm.dkv_acc, or in deterministic mode stored to its partial row
// ((t - tok_begin) * head_groups + group) * topk + slot of prm.dkv_part.
using DsaBackwardMainKernel = void (*)(const dsa_bwd::DsaBwdParams& prm, int64_t grid, int device,
                                       cudaStream_t stream);

// Workspace of dsa_backward_around for a main kernel of `heads_per_cta` heads per CTA;
// `slice_tokens` > 0 pins deterministic mode's token slice (tests), as in DsaBackwardTuning.
size_t dsa_backward_workspace_bytes_around(const DsaBwdProblem& p, int heads_per_cta,
                                           int64_t slice_tokens = 0);

// Every pass of dsa_backward (memset, deterministic slices with their sorts and fixed-order
// reductions, the dkv conversion, d_sink) around `main`; `op` names the caller in errors;
// `reduce_columns` is the column order in which `main` reduces into prm.dkv_acc (outside
// deterministic mode, whose partial rows are in natural order). The caller checks support first
// (dsa_backward_unsupported covers these passes' needs).
void dsa_backward_around(const DsaBwdProblem& p, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream, int heads_per_cta, DsaBackwardMainKernel main,
                         const char* op, dsa_bwd::AccColumns reduce_columns,
                         int64_t slice_tokens = 0);

}  // namespace sa::portable
