// The small kernels around the portable BSA backward's main kernel (bsa_backward.cu runs them):
// preprocess (Delta and the log2-domain LSE) and the fp32 -> 16-bit conversions of the dQ and
// several-owner dK/dV accumulators. All launch on `stream` and read no metadata value on the host.
// Packed batches (p.meta.varlen()): each launcher hands over to bsa_backward_aux_packed.hpp's,
// whose buffers are laid out as cuda/bsa_packed_rows.hpp says.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/problem.hpp"

namespace sa::portable {

// For every query row s < Sq_pad of every (b, h), into [B, H_q, Sq_pad] fp32 buffers:
//   delta[b, h, s] = sum_d dO[b, h, s, d] * o[b, h, s, d]   (0 for s >= S_q)
//   lse2[b, h, s]  = lse[b, h, s] * log2(e)                 (+inf for lse = -inf and s >= S_q,
//                                                            so that P = 2^(x - lse2) = 0)
// Also, when not null: dq_zero[B, H_q, Sq_pad, D] (fp32) and u32_zero[u32_count] are zeroed
// (u32_count <= B * H_q * Sq_pad * 8).
void launch_bwd_preprocess(const BsaBwdProblem& p, int64_t Sq_pad, float* lse2, float* delta,
                           float* dq_zero, uint32_t* u32_zero, int64_t u32_count,
                           cudaStream_t stream);

// dq[b, h, s, :] = scale * dq_accum[b, h, s, :] for s < S_q (dq_accum is [B, H_q, Sq_pad, D],
// row-major, or with `tiled` each 64-row tile in the order of common/dq_tile_layout.hpp).
void launch_bwd_convert_dq(const BsaBwdProblem& p, int64_t Sq_pad, const float* dq_accum,
                           bool tiled, cudaStream_t stream);

// For every reverse row r = (b, hk, n) with row_groups[r] > 1 (read on the device): the keys
// j < S_kv of block n get dk = scale * dk_accum, dv = dv_accum ([B, H_kv, Skv_pad, D]). Rows with
// one group were written by the main kernel and are not touched.
void launch_bwd_convert_dkv(const BsaBwdProblem& p, int64_t Skv_pad, const float* dk_accum,
                            const float* dv_accum, const int32_t* row_groups,
                            cudaStream_t stream);

}  // namespace sa::portable
