// The token mask's band (SPEC 4) on an mma accumulator fragment, shared by the portable (sm80+)
// and Hopper BSA forward kernels. Device code only.
//
// Fragment layout (mma.sync m16n8 tiles, and a wgmma 64 x N tile seen per warp, which has the same
// register order): s[mi][j][c] holds row 16 mi + 8 (c / 2) + lane / 4 of the warp's rows and key
// column 8 j + 2 (lane % 4) + (c & 1). A wgmma fragment of a warp (linear index i) is the
// [1][N / 8][4] case: i = 4 j + c.
#pragma once

namespace sa {

// The token mask's band on a warp's sub-tile of scores: s[mi][j][c] := mask unless its key column
// col = 8j + 2t + (c & 1) is < valid and d = dbase + col - row lies in [lo, hi], where row =
// 16 mi + 8 half + g is the row's offset from the warp's first row and dbase = (first key of the
// sub-tile) - (the warp's first row): d is the key index minus the query index (SPEC 4's band).
// Every d stays inside int32 when S_q, S_kv do (the GPU paths' limit).
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void mask_band(float (&s)[kMTiles][kNTiles][4], int dbase, int lo,
                                          int hi, int valid, float masked) {
  const int lane = threadIdx.x % 32;
  const int col0 = 2 * (lane % 4);
  const int g = lane / 4;
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int d0 = dbase + col0 - (16 * mi + 8 * half + g);
#pragma unroll
      for (int j = 0; j < kNTiles; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int d = d0 + 8 * j + c;
          if (d < lo || d > hi || col0 + 8 * j + c >= valid) s[mi][j][2 * half + c] = masked;
        }
    }
}

}  // namespace sa
