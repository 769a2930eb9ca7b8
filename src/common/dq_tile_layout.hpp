// The "fragment-tile" order of the fp32 dQ accumulator that the Hopper BSA backward reduces with
// bulk copies (src/sm90/bsa_backward_kernel.cuh) and the dQ conversions read (src/sm90/
// bsa_dq_convert.cu beside the main kernel; src/cuda/bsa_backward_aux.cu after it, the
// fallback). One place for the permutation both sides rely on.
//
// dq_accum stays [B, H_q, Sq_pad, D] fp32 (packed batches: [H_q, Sq_pad, D], each sequence's
// rows from its own base row), so the 64 query rows of a tile are one contiguous run of 64 * D
// floats. Inside a run the order is that of the wgmma
// accumulator fragments of a 64 x 64 tile, panel by panel (64 columns of D each): pair j (0..15)
// of consumer thread t (0..127, warp w = t / 32, lane l = t % 32) holds rows
// 16 w + l / 4 + 8 (j % 2), columns 8 (j / 2) + 2 (l % 4) + {0, 1}, and lands at floats
// panel * 4096 + 2 (128 j + t) + {0, 1}. A warp storing pair j writes 256 consecutive bytes of
// shared memory (no bank conflict), and 8 consecutive columns of one row stay 8 consecutive
// floats (the conversion pass reads them as two float4).
#pragma once

#include <cstdint>

#include "common/problem.hpp"  // SA_HD

namespace sa {

constexpr int kDqTileRows = 64;
constexpr int kDqPanelFloats = 64 * 64;

// Float offset of (row r < 64, column col < D) inside its tile's run of 64 * D floats.
SA_HD int dq_tile_offset(int r, int col) {
  const int panel = col >> 6, cc = col & 63;
  const int thread = 32 * (r >> 4) + 4 * (r & 7) + ((cc & 7) >> 1);
  const int pair = 2 * (cc >> 3) + ((r >> 3) & 1);
  return panel * kDqPanelFloats + 2 * (128 * pair + thread) + (cc & 1);
}

// Float offset of (row s, column col) of a run of rows that starts at accumulator row row_base:
// its 64-row tiles start at row_base + 64 k. Packed batches (cuda/bsa_packed_rows.hpp): row_base
// = h * Sq_pad + packed_stat_row0(b, q0) (a multiple of 4, not of 64) and s the sequence's local
// row, which is where the main kernel's bulk reductions put each tile of the sequence.
SA_HD int64_t dq_tiled_index_at(int64_t row_base, int s, int D, int col) {
  const int64_t tile0 = row_base + (s & ~(kDqTileRows - 1));
  return tile0 * D + dq_tile_offset(s & (kDqTileRows - 1), col);
}

// Float offset of element (b, h, s, col) of a [B, H_q, Sq_pad, D] accumulator in this order
// (Sq_pad a multiple of 64).
SA_HD int64_t dq_tiled_index(int64_t bh, int64_t Sq_pad, int s, int D, int col) {
  return dq_tiled_index_at(bh * Sq_pad, s, D, col);
}

}  // namespace sa
