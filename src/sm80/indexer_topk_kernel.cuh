// The portable indexer's fused top-k kernel (SPEC 5): per query, the k keys of its range with the
// largest scores (ties to the smaller key, NaN last), in increasing key order, then -1, without a
// dense score buffer.
//
// Design. Scores come from the shared score tile (indexer_score_tile.cuh): a CTA of 4 warps owns
// a block of kBlockQ queries, streams the 64-key tiles of its queries' range union and each warp
// gets, per tile, the reduced scores of its QPW queries in shared memory. Selection is exact and
// order-free: a candidate is the 64-bit value (order_key(score) << 32 | ~key), all distinct, larger
// ranks first; the top k are the k largest. Per query the warp keeps
//   buf    its candidates in the workspace (cap entries, uint2 {order_key, key}), in the order
//          they were appended, which is increasing key order (tiles and keys within a tile are
//          appended in key order, and compaction is stable);
//   count  entries in buf;
//   thr    none until the first compaction (every in-range key is a candidate), then u*, the
//          order key of the k-th best: a later key (larger index) beats the k-th best only with
//          order_key > u*, so that is the whole filter.
// Per tile and query: lane l tests keys l and l + 32 (range, filter), ballots, and the accepted
// keys are stored at count + prefix (two coalesced rounds). When count > cap - 64 (the next tile
// might not fit), the warp compacts:
//   select  radix select of the k-th largest order key over buf: 4 passes of 8 bits (a 256-bin
//           histogram per warp in shared memory, integer atomics: exact), giving u*, the number G
//           of entries above it and need = k - G, the entries equal to u* to keep: the first need
//           of them in buf order, i.e. the smallest keys (ties to the smaller key);
//   filter  one stable in-place pass keeps order_key > u*, or == u* among the first `need`;
//   then count = k, thr = u*.
// After the last tile a final compaction if count > k; the row is buf[0 .. count) (already in
// increasing key order, no sort), then -1; topk_length = count = min(k, |range|).
//
// Cost. The score tile: 2 H_I D_I flops per (query, key) pair on tensor cores. Per pair the
// filter adds a shared load, a compare and a ballot: O(1) ALU, nothing per head. A compaction
// reads about 5 cap entries; with cap = k + max(k, 256), the first comes after cap - 64 keys,
// later ones only as often as new keys beat the k-th best: for scores in random order about
// k ln(n / cap) insertions over n keys (S 131072, k 2048: ~4 compactions per query), in the worst
// case (increasing scores) one per cap - k keys, still O(n) work per query, never a second pass
// over the keys. Memory: cap x 8 bytes per query in flight (persistent CTAs, one buffer per
// query slot of a CTA: grid x kBlockQ x cap x 8 bytes, e.g. 264 x 4 x 4096 x 8 = 35 MB at H_I 64,
// k 2048), plus the output: O(S_q k) in all, independent of S_kv.
//
// Determinism. Scores are bitwise reproducible (the tile), the selection is a function of the
// distinct 64-bit candidates alone, and the output order is key order: bitwise identical on every
// run, whatever the schedule.
//
// Grid: persistent CTAs (as many as fit the device at once); CTA c takes query blocks c, c + grid,
// ... (their workspace slots are the CTA's).
#pragma once

#include <cstdint>

#include "sm80/indexer_score_tile.cuh"
#include "cuda/indexer_topk_select.cuh"

namespace sa::portable::indexer {

struct TopkOut {
  int32_t* idx;        // [S_q, k]: (t, i) at t * idx_ss + i (inner dimension contiguous)
  int64_t idx_ss;
  int32_t* len;        // [S_q] at t * len_s; may be null
  int64_t len_s;
  uint2* buf;          // workspace: gridDim.x x kBlockQ buffers of cap entries
  int32_t k;
  int32_t cap;         // topk_buffer_cap(k)
  int64_t q_blocks;    // ceil(S_q / kBlockQ)
};

// Shared memory after the score tile: a 256-bin histogram per warp.
template <class Cfg>
struct TopkSmem {
  static constexpr int kHistOff = Cfg::kTileSmemBytes;
  static constexpr int kBytes = kHistOff + Cfg::kWarps * 256 * 4;
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 2) topk_kernel(const ScoreParams p,
                                                                const TopkOut o) {
  using Smem = TopkSmem<Cfg>;
  constexpr int kTile = Cfg::kTileKeys;
  constexpr int kQpw = Cfg::kQpw;
  uint8_t* smem = smem_base();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const uint32_t lt = (1u << lane) - 1u;
  const int2* s_range = reinterpret_cast<const int2*>(smem + Cfg::kRangeOff);
  float* stage_out = reinterpret_cast<float*>(smem + Cfg::kStageOff) + warp * kQpw * kTile;
  uint32_t* hist = reinterpret_cast<uint32_t*>(smem + Smem::kHistOff) + warp * 256;
  const bool negative = p.scale < 0.f;
  // This warp's buffers: one per query slot of the CTA.
  uint2* const bufs =
      o.buf + (int64_t{blockIdx.x} * Cfg::kBlockQ + warp * kQpw) * int64_t{o.cap};

  for (int64_t qb = blockIdx.x; qb < o.q_blocks; qb += gridDim.x) {
    const int64_t q0 = qb * Cfg::kBlockQ;
    load_ranges<Cfg>(p, q0, smem);
    __syncthreads();
    const int2 span = block_span<Cfg>(s_range);
    const int64_t first = span.x / kTile * int64_t{kTile};
    const int n_tiles = static_cast<int>((span.y - first + kTile - 1) / kTile);  // 0 if empty

    int count[kQpw];
    uint32_t thr[kQpw];     // valid where bit qi of `compacted` is set
    uint32_t compacted = 0;  // before a query's first compaction every in-range key is taken
#pragma unroll
    for (int qi = 0; qi < kQpw; ++qi) {
      count[qi] = 0;
      thr[qi] = 0;
    }

    if (span.y > span.x) {
      load_query_block<Cfg>(p, q0, smem);
      load_key_tile<Cfg>(p, first, 0, smem);
      dsa::cp_async_commit();
    }
    for (int i = 0; i < n_tiles; ++i) {
      const int stage = i & 1;
      if (i + 1 < n_tiles) {
        load_key_tile<Cfg>(p, first + int64_t{i + 1} * kTile, stage ^ 1, smem);
        dsa::cp_async_commit();
        sa::cp_async_wait<1>();
      } else {
        sa::cp_async_wait<0>();
      }
      __syncthreads();
      const int64_t s0 = first + int64_t{i} * kTile;
      if (warp_meets_tile<Cfg>(s_range, warp, s0)) {
        warp_tile_scores<Cfg>(smem, stage, negative, stage_out);
        // TopkRows::offer (indexer_topk_select.cuh) states this step's invariants; it is written
        // out here because the same code through TopkRows costs this kernel a 20-byte spill at
        // H_I 32 on sm_90 (ptxas at 255 registers, CUDA 13), and it was measured spill-free.
#pragma unroll
        for (int qi = 0; qi < kQpw; ++qi) {
          const int2 r = s_range[warp * kQpw + qi];
          uint2* buf = bufs + qi * int64_t{o.cap};
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int key = 32 * h + lane;
            const int64_t s = s0 + key;
            const uint32_t u = order_key(stage_out[qi * kTile + key]);
            const bool cand = s >= r.x && s < r.y && (!((compacted >> qi) & 1u) || u > thr[qi]);
            const uint32_t mask = __ballot_sync(0xffffffffu, cand);
            if (cand)
              __stcg(&buf[count[qi] + __popc(mask & lt)], make_uint2(u, static_cast<uint32_t>(s)));
            count[qi] += __popc(mask);
          }
          if (count[qi] > o.cap - kTile) {
            __syncwarp();  // the appended entries are visible to the whole warp
            thr[qi] = warp_compact(buf, count[qi], o.k, hist);
            compacted |= 1u << qi;
            count[qi] = o.k;
          }
        }
        __syncwarp();  // the staging area is rewritten by the next tile
      }
      __syncthreads();
    }

    // The rows: buf[0, count) in key order, then -1.
#pragma unroll
    for (int qi = 0; qi < kQpw; ++qi) {
      const int64_t t = q0 + warp * kQpw + qi;
      if (t >= p.dims.Sq) continue;
      uint2* buf = bufs + qi * int64_t{o.cap};
      __syncwarp();
      if (count[qi] > o.k) {
        warp_compact(buf, count[qi], o.k, hist);
        count[qi] = o.k;
      }
      int32_t* row = o.idx + t * o.idx_ss;
      for (int i = lane; i < o.k; i += 32)
        row[i] = i < count[qi] ? static_cast<int32_t>(__ldcg(&buf[i].y)) : -1;
      if (o.len != nullptr && lane == 0) o.len[t * o.len_s] = count[qi];
    }
    __syncthreads();  // shared memory (ranges, q_I, w') is reloaded for the next block
  }
}

}  // namespace sa::portable::indexer
