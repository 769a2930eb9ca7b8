// The fragment-tile order of the dQ accumulator (src/common/dq_tile_layout.hpp), on the CPU: the
// Hopper backward's shared-memory stores and the conversion pass both rely on these properties.
#include <gtest/gtest.h>

#include <vector>

#include "common/dq_tile_layout.hpp"

namespace sa_test {
namespace {

// Every (row, column) of a 64 x D tile lands on a distinct float of the tile's 64 * D run.
TEST(DqTileLayout, IsAPermutationOfTheTile) {
  for (int D : {64, 128}) {
    std::vector<int> hits(64 * D, 0);
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < D; ++c) {
        const int o = sa::dq_tile_offset(r, c);
        ASSERT_GE(o, 0);
        ASSERT_LT(o, 64 * D);
        ++hits[o];
      }
    for (int h : hits) ASSERT_EQ(h, 1) << "D = " << D;
  }
}

// The wgmma fragment order: pair j of thread t (warp w, lane l) holds row 16 w + l / 4 + 8 (j % 2),
// columns 8 (j / 2) + 2 (l % 4) + {0, 1} of a panel, at floats 2 (128 j + t) + {0, 1}.
TEST(DqTileLayout, MatchesTheAccumulatorFragments) {
  for (int panel = 0; panel < 2; ++panel)
    for (int t = 0; t < 128; ++t)
      for (int j = 0; j < 16; ++j)
        for (int e = 0; e < 2; ++e) {
          const int w = t / 32, l = t % 32;
          const int r = 16 * w + l / 4 + 8 * (j % 2);
          const int c = 64 * panel + 8 * (j / 2) + 2 * (l % 4) + e;
          ASSERT_EQ(sa::dq_tile_offset(r, c), panel * 4096 + 2 * (128 * j + t) + e);
        }
}

// Eight columns from a multiple of 8 are eight consecutive floats (the conversion's two float4),
// and tiles follow each other in [B, H, Sq_pad, D] order.
TEST(DqTileLayout, EightColumnChunksAreContiguous) {
  for (int D : {64, 128})
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < D; c += 8) {
        const int o = sa::dq_tile_offset(r, c);
        EXPECT_EQ(o % 8, 0);
        for (int k = 1; k < 8; ++k) ASSERT_EQ(sa::dq_tile_offset(r, c + k), o + k);
      }
  EXPECT_EQ(sa::dq_tiled_index(3, 256, 64 + 5, 128, 9),
            (3 * 256 + 64) * 128 + sa::dq_tile_offset(5, 9));
}

}  // namespace
}  // namespace sa_test
