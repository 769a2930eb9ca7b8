// The portable indexer's dense score kernel (SPEC 5): scores[t, s] = I[t, s] in range, -inf
// outside, every element of [S_q, S_kv] written.
//
// Grid: one CTA per (query block of kBlockQ queries, key block of kBlockTiles x 64 keys), the key
// blocks of a query block adjacent (its q_I rows stay in L2). Each CTA:
//   [0] ranges -> shared memory; barrier; the span [lo, hi) of its queries' ranges
//   [1] tiles of the key block that meet the span: [i_lo, i_hi) (contiguous). If any:
//       cp.async q_I rows + w' + tile i_lo
//   [2] tiles outside [i_lo, i_hi): -inf rows, no loads, no MMA
//   [3] tile i: prefetch tile i + 1 (other stage); wait for tile i; barrier
//       each warp whose queries meet the tile: warp_tile_scores -> its staging area, then the
//       masked values (in range: the score; else -inf) as 2 x QPW coalesced 128-byte row stores;
//       a warp whose queries miss the tile stores -inf
//       barrier (the stage is free for tile i + 2)
#pragma once

#include <cstdint>

#include "sm80/indexer_score_tile.cuh"

namespace sa::portable::indexer {

struct ScoresOut {
  float* out;  // [S_q, S_kv]: (t, s) at t * ss + s (inner dimension contiguous)
  int64_t ss;
  int key_blocks;  // CTAs per query block
};

template <class Cfg, int kBlockTiles>
__global__ void __launch_bounds__(Cfg::kThreads, 2) scores_kernel(const ScoreParams p,
                                                                  const ScoresOut o) {
  constexpr int kTile = Cfg::kTileKeys;
  uint8_t* smem = smem_base();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t qb = blockIdx.x / o.key_blocks;
  const int kb = static_cast<int>(blockIdx.x % o.key_blocks);
  const int64_t q0 = qb * Cfg::kBlockQ;
  const int64_t k0 = int64_t{kb} * kBlockTiles * kTile;
  const int64_t skv = p.dims.Skv;
  const int n_tiles = static_cast<int>(min(int64_t{kBlockTiles}, (skv - k0 + kTile - 1) / kTile));
  const int2* s_range = reinterpret_cast<const int2*>(smem + Cfg::kRangeOff);
  float* stage_out = reinterpret_cast<float*>(smem + Cfg::kStageOff) +
                     warp * Cfg::kQpw * kTile;
  const bool negative = p.scale < 0.f;
  const float kNegInf = -INFINITY;

  // [0]
  load_ranges<Cfg>(p, q0, smem);
  __syncthreads();
  const int2 span = block_span<Cfg>(s_range);
  // [1] Tiles of this key block that meet [span.x, span.y).
  int i_lo = n_tiles, i_hi = n_tiles;
  if (span.y > span.x) {
    const int64_t first = max(int64_t{0}, (span.x - k0) / kTile);
    const int64_t last = (span.y - 1 - k0) / kTile;  // may be < 0 or >= n_tiles
    if (span.y > k0 && span.x < k0 + int64_t{n_tiles} * kTile) {
      i_lo = static_cast<int>(first);
      i_hi = static_cast<int>(min(last + 1, int64_t{n_tiles}));
    }
  }

  // A warp's rows of one tile: value(qi, key) for the keys of the tile below S_kv.
  auto store_tile = [&](int64_t s0, auto value) {
#pragma unroll
    for (int qi = 0; qi < Cfg::kQpw; ++qi) {
      const int64_t t = q0 + warp * Cfg::kQpw + qi;
      if (t >= p.dims.Sq) continue;
      float* row = o.out + t * o.ss;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int key = 32 * h + lane;
        const int64_t s = s0 + key;
        if (s < skv) row[s] = value(qi, key, s);
      }
    }
  };
  auto neg_inf = [&](int, int, int64_t) { return kNegInf; };

  // [2] Tiles outside the span.
  for (int i = 0; i < n_tiles; ++i) {
    if (i >= i_lo && i < i_hi) continue;
    store_tile(k0 + int64_t{i} * kTile, neg_inf);
  }
  if (i_lo >= i_hi) return;

  load_query_block<Cfg>(p, q0, smem);
  load_key_tile<Cfg>(p, k0 + int64_t{i_lo} * kTile, 0, smem);
  dsa::cp_async_commit();

  // [3]
  for (int i = i_lo; i < i_hi; ++i) {
    const int stage = (i - i_lo) & 1;
    if (i + 1 < i_hi) {
      load_key_tile<Cfg>(p, k0 + int64_t{i + 1} * kTile, stage ^ 1, smem);
      dsa::cp_async_commit();
      sa::cp_async_wait<1>();
    } else {
      sa::cp_async_wait<0>();
    }
    __syncthreads();
    const int64_t s0 = k0 + int64_t{i} * kTile;
    if (warp_meets_tile<Cfg>(s_range, warp, s0)) {
      warp_tile_scores<Cfg>(smem, stage, negative, stage_out);
      store_tile(s0, [&](int qi, int key, int64_t s) {
        const int2 r = s_range[warp * Cfg::kQpw + qi];
        return s >= r.x && s < r.y ? stage_out[qi * kTile + key] : kNegInf;
      });
      __syncwarp();  // the staging area is rewritten by the next tile
    } else {
      store_tile(s0, neg_inf);
    }
    __syncthreads();
  }
}

}  // namespace sa::portable::indexer
