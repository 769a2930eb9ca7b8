// The warp-level product both portable DSA kernels start a chunk with: acc += A B^T for one warp's
// kM m16 row tiles of A and kNTiles n8 key tiles of B, over `kblocks` 64-column blocks of the
// head dimension. The forward computes S = Q K^T with it; the backward S = Q K^T and
// dP = dO V^T (V being the first D_v columns of the K rows).
//
// Both operands live in shared memory with 128-byte column blocks whose 16-byte chunks are
// XOR-swizzled by the row's phase (chunk c of a row with phase x sits at c ^ x). The caller
// passes the per-lane parts of the ldmatrix addresses:
//   a_lane, a_hi  the byte address of this lane's A row (tile row 0 + (lane & 15)) and its chunk
//                 offset (lane >> 4); rows of later m16 tiles are 16 * a_row_bytes further on;
//   b_lane, b_hi  the byte address of this lane's B row and its chunk offset ((lane >> 3) & 1);
//                 with kNTiles == 1 only lanes 0..15 matter (ldmatrix .x2);
//   x             the swizzle phase, lane & 7 (the 8 rows of every 8x8 matrix start at a multiple
//                 of 8).
#pragma once

#include <cstdint>

#include "cuda/dsa_mma.hpp"

namespace sa::portable::dsa {

template <int kM, int kNTiles, class Ops>
__device__ __forceinline__ void warp_mma_abt(float (&acc)[kM][kNTiles][4], uint32_t a_lane,
                                             int a_row_bytes, int a_hi, uint32_t b_lane, int b_hi,
                                             int x, int kblocks) {
  static_assert(kNTiles == 1 || kNTiles == 2, "one ldmatrix (.x2 or .x4) of B per k16 step");
  for (int kb = 0; kb < kblocks; ++kb) {
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      uint32_t bf[4];
      const uint32_t b_addr = b_lane + kb * 128 + (((2 * b + b_hi) ^ x) << 4);
      if constexpr (kNTiles == 2) {
        ldmatrix_x4(b_addr, bf);
      } else {
        ldmatrix_x2(b_addr, bf[0], bf[1]);
      }
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        uint32_t af[4];
        ldmatrix_x4(a_lane + m * 16 * a_row_bytes + kb * 128 + (((2 * b + a_hi) ^ x) << 4), af);
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) Ops::mma(acc[m][nt], af, bf[2 * nt], bf[2 * nt + 1]);
      }
    }
  }
}

}  // namespace sa::portable::dsa
