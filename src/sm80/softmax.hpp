// Row-wise softmax pieces on mma.sync accumulator fragments (layout in sm80_primitives.hpp).
//
// A warp's m16 tile spreads each row over the 4 lanes of a quad (lanes 4g..4g+3 hold row g and
// row g + 8): per m16 tile a lane sees 2 rows, "row slot" r = 2 * mi + half (half 0: row g, c[0],
// c[1]; half 1: row g + 8, c[2], c[3]). Row reductions finish with two xor-shuffles in the quad.
//
// The online softmax works in the log2 domain: x = scale_log2 * s, scale_log2 = scale * log2(e).
// The scale may be negative, so the running maximum of x is taken from the tile's maximum raw dot
// product when scale > 0 and from its minimum when scale < 0; masked keys carry the raw value
// that loses that comparison (mask_value) and get probability exactly 0.
#pragma once

#include <cmath>

#include "common/device_math.cuh"
#include "common/token_mask.cuh"  // mask_band (shared with the Hopper forward)
#include "sm80/sm80_primitives.hpp"

namespace sa::portable {

// The raw score a masked key gets: it never wins the extremum and scale_log2 * it is -inf.
__host__ __device__ __forceinline__ float mask_value(float scale_log2) {
  return scale_log2 > 0.f ? -INFINITY : INFINITY;
}

// s[mi][j][c] := mask for every key column >= valid (columns of tile j: 8j + 2t + {0, 1}).
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void mask_key_columns(float (&s)[kMTiles][kNTiles][4], int valid,
                                                 float masked) {
  const int col0 = 2 * (threadIdx.x % 4);
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (8 * j + col0 + (c & 1) >= valid) s[mi][j][c] = masked;
}

// acc[mi][j][c] *= factor[row slot of c].
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void scale_rows(float (&acc)[kMTiles][kNTiles][4],
                                           const float (&factor)[2 * kMTiles]) {
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mi][j][c] *= factor[2 * mi + c / 2];
}

// Online softmax state of the 2 * kMTiles rows of one lane.
//   row_max: running max of x over the keys seen (quad-uniform), -inf before the first key;
//   row_sum: this lane's share of sum 2^(x - row_max) (quad-reduced in finalize()).
template <int kMTiles>
struct OnlineSoftmax {
  static constexpr int kRows = 2 * kMTiles;
  float row_max[kRows];
  float row_sum[kRows];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // Raw dot products of one key tile in s become probabilities relative to the new running max;
  // alpha[r] is the factor that rescales what was accumulated before: 0 on a row's first keys,
  // exactly 1 when the row's max did not change. Returns whether some alpha of this lane != 1.
  template <int kNTiles>
  __device__ __forceinline__ bool update(float (&s)[kMTiles][kNTiles][4], float scale_log2,
                                         float (&alpha)[kRows]) {
    // The tile's extreme raw score per row: the max for scale > 0, the min for scale < 0 (one
    // CTA-uniform branch around all rows, so that their shuffles overlap).
    float e[kRows];
    if (scale_log2 > 0.f) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int mi = r / 2, c0 = 2 * (r % 2);
        e[r] = fmaxf(s[mi][0][c0], s[mi][0][c0 + 1]);
#pragma unroll
        for (int j = 1; j < kNTiles; ++j) e[r] = fmaxf(e[r], fmaxf(s[mi][j][c0], s[mi][j][c0 + 1]));
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) e[r] = quad_max(e[r]);
    } else {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int mi = r / 2, c0 = 2 * (r % 2);
        e[r] = fminf(s[mi][0][c0], s[mi][0][c0 + 1]);
#pragma unroll
        for (int j = 1; j < kNTiles; ++j) e[r] = fminf(e[r], fminf(s[mi][j][c0], s[mi][j][c0 + 1]));
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) e[r] = quad_min(e[r]);
    }
    bool changed = false;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int mi = r / 2, c0 = 2 * (r % 2);
      const float m_new = fmaxf(row_max[r], e[r] * scale_log2);
      // While a row has seen no key its max is -inf; subtract 0 then, so that masked scores
      // (x = -inf) give 2^-inf = 0 rather than 2^(-inf + inf) = NaN.
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const bool same = m_new == row_max[r];
      alpha[r] = same ? 1.f : exp2_approx(row_max[r] - m_use);
      changed |= !same;
      row_max[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
        for (int c = c0; c < c0 + 2; ++c) {
          const float p = exp2_approx(fmaf(s[mi][j][c], scale_log2, -m_use));
          s[mi][j][c] = p;
          sum += p;
        }
      }
      row_sum[r] = row_sum[r] * alpha[r] + sum;
    }
    return changed;
  }

  // After the last tile: 1 / (row sum) to normalise O (0 for a row without keys, whose O is 0)
  // and the natural-log LSE of the scaled scores (-inf for a row without keys).
  __device__ __forceinline__ void finalize(float (&inv_sum)[kRows], float (&lse)[kRows]) const {
    constexpr float kLn2 = 0.69314718055994531f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float sum = quad_sum(row_sum[r]);
      const bool any = sum > 0.f;
      inv_sum[r] = any ? 1.f / sum : 0.f;
      lse[r] = any ? (row_max[r] + log2f(sum)) * kLn2 : -INFINITY;
    }
  }
};

}  // namespace sa::portable
