// The pieces of the memory-bound BSA backward passes (bsa_backward_aux.cu for dense batches,
// bsa_backward_aux_packed.cu for packed ones): 16-byte loads and stores of 8 consecutive 16-bit
// elements (bf16 or fp16, a runtime choice), one query row's preprocess, one key chunk's dK / dV
// conversion, the grid size.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "common/cuda_check.hpp"

namespace sa::portable {
namespace {

// 8 consecutive 16-bit elements -> float.
__device__ __forceinline__ void load8(const void* src, bool bf16, float (&out)[8]) {
  const uint4 raw = *static_cast<const uint4*>(src);
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const unsigned short lo = static_cast<unsigned short>(w[i] & 0xffffu);
    const unsigned short hi = static_cast<unsigned short>(w[i] >> 16);
    if (bf16) {
      out[2 * i] = __bfloat162float(__ushort_as_bfloat16(lo));
      out[2 * i + 1] = __bfloat162float(__ushort_as_bfloat16(hi));
    } else {
      out[2 * i] = __half2float(__ushort_as_half(lo));
      out[2 * i + 1] = __half2float(__ushort_as_half(hi));
    }
  }
}

// scale * 8 floats -> 8 consecutive 16-bit elements.
__device__ __forceinline__ void store8(void* dst, bool bf16, const float4& a, const float4& b,
                                       float scale) {
  const float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    unsigned short lo, hi;
    if (bf16) {
      lo = __bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i] * scale));
      hi = __bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i + 1] * scale));
    } else {
      lo = __half_as_ushort(__float2half_rn(f[2 * i] * scale));
      hi = __half_as_ushort(__float2half_rn(f[2 * i + 1] * scale));
    }
    w[i] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
  *static_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
}

constexpr int kAuxThreads = 256;  // threads per CTA of every pass
constexpr int kRowThreads = 8;    // preprocess: threads sharing one query row

// Zeroes row `row` of the fp32 dQ accumulator (Dq floats; null: nothing), the row's kRowThreads
// threads from `sub`.
__device__ __forceinline__ void zero_dq_row(float* dq_zero, int64_t row, int Dq, int sub) {
  if (dq_zero == nullptr) return;
  float4* z = reinterpret_cast<float4*>(dq_zero + row * Dq);
  for (int c = sub; c < Dq / 4; c += kRowThreads) z[c] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// A padding query row (past its sequence's end): lse2 = +inf, delta = 0, so P = dS = 0.
__device__ __forceinline__ void padding_row_stats(float* lse2, float* delta, int sub) {
  if (sub == 0) {
    *lse2 = INFINITY;
    *delta = 0.f;
  }
}

// One query row's preprocess by its kRowThreads threads (sub = 0 holds the row's lse l, read
// first, beside its O / dO loads: issued after the reduction it cost every row a second DRAM
// round trip): delta = rowsum(O dO) over D, lse2 = l log2 e (+inf for an empty row's -inf).
// `zero` runs after the row's loads are issued (its stores could alias them as far as the
// compiler knows).
template <class Zero>
__device__ __forceinline__ void preprocess_row(const uint8_t* o, const uint8_t* d, int D,
                                               bool bf16, int sub, float l, float* lse2,
                                               float* delta, const Zero& zero) {
  float sum = 0.f;
#pragma unroll 2
  for (int c = sub; c < D / 8; c += kRowThreads) {
    float x[8], y[8];
    load8(o + 16 * c, bf16, x);
    load8(d + 16 * c, bf16, y);
#pragma unroll
    for (int i = 0; i < 8; ++i) sum = fmaf(x[i], y[i], sum);
  }
  zero();
  const unsigned group_mask = 0xffu << (threadIdx.x % 32 / kRowThreads * kRowThreads);
#pragma unroll
  for (int step = 1; step < kRowThreads; step *= 2)
    sum += __shfl_xor_sync(group_mask, sum, step);
  if (sub == 0) {
    *lse2 = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
    *delta = sum;
  }
}

// 8 elements of one key's dK (times scale) and dV from the fp32 accumulators at `at`.
__device__ __forceinline__ void convert_kv_chunk(const float* dk_acc, const float* dv_acc,
                                                 int64_t at, void* dk, void* dv, bool bf16,
                                                 float scale) {
  const float4* k = reinterpret_cast<const float4*>(dk_acc + at);
  const float4* v = reinterpret_cast<const float4*>(dv_acc + at);
  store8(dk, bf16, k[0], k[1], scale);
  store8(dv, bf16, v[0], v[1], 1.f);
}

// CTAs of kAuxThreads for `threads` threads.
inline unsigned aux_blocks_for(int64_t threads) {
  const int64_t blocks = (threads + kAuxThreads - 1) / kAuxThreads;
  SA_CHECK(blocks <= 0x7fffffff, SA_ERROR_UNSUPPORTED,
           "bsa backward: grid of " << blocks << " blocks is too large");
  return static_cast<unsigned>(blocks);
}

}  // namespace
}  // namespace sa::portable
