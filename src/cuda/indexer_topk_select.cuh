// The selection stage of the fused indexer top-k (SPEC 5), shared by the portable kernel
// (sm80/indexer_topk_kernel.cuh, which describes the method: it uses order_key, warp_compact and
// topk_buffer_cap, and writes TopkRows' steps out inline, see there) and the Hopper one
// (sm90/indexer_topk_kernel.cuh, all of it). Device code, no shared-memory layout of its own: a
// kernel gives each warp its 256 histogram bins and, per query it owns, a candidate buffer of
// topk_buffer_cap(k) entries in global memory.
//
// Per query the owning warp offers the scores of 64 consecutive keys at a time in increasing key
// order (TopkRows::offer), then writes the row (TopkRows::finish). Invariants:
//   * buf[0, count) holds candidates {order_key(score), key} in increasing key order;
//   * before the first compaction every in-range key offered is in buf; after it, buf holds the k
//     best so far and thr = u*, the order key of the k-th best, so a later (larger) key enters
//     only with order_key > u*;
//   * count <= cap - 64 between offers (so a tile's appends fit).
// The result is a function of the distinct 64-bit candidates (order_key << 32 | ~key) alone:
// bitwise deterministic, ties to the smaller key, NaN last.
#pragma once

#include <cstdint>

#include "cuda/indexer_order_key.cuh"

namespace sa::portable::indexer {

constexpr int kTopkOfferKeys = 64;  // keys per warp_offer_tile: two per lane

// Candidate buffer entries per query: k kept plus at least max(k, 256) of room (>= 64: one offer
// always fits), a multiple of 32.
__host__ __device__ constexpr int64_t topk_buffer_cap(int64_t k) {
  return (k + (k > 256 ? k : 256) + 31) / 32 * 32;
}

// One radix pass's digit, found by a whole warp over 256 bins (largest digit = best keys): the
// bin d holding the need-th best key counted from the top (1 <= need <= the bins' total), and in
// *greater the count in the bins above it; the same in every lane. Lane L reads bins 8L .. 8L + 7.
__device__ __forceinline__ uint32_t radix_digit(const uint32_t* hist, uint32_t need,
                                                uint32_t* greater) {
  const int lane = threadIdx.x & 31;
  uint32_t c[8];
  uint32_t total = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    c[i] = hist[8 * lane + i];
    total += c[i];
  }
  uint32_t incl = total;  // keys in bins >= 8L
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const uint32_t v = __shfl_down_sync(0xffffffffu, incl, off);
    if (lane + off < 32) incl += v;
  }
  uint32_t acc = incl - total;  // keys in the bins of the lanes above
  int digit = -1;
  uint32_t above = 0;
#pragma unroll
  for (int i = 7; i >= 0; --i) {
    if (digit < 0 && acc < need && acc + c[i] >= need) {
      digit = 8 * lane + i;
      above = acc;
    }
    acc += c[i];
  }
  const int src = __ffs(__ballot_sync(0xffffffffu, digit >= 0)) - 1;
  *greater = __shfl_sync(0xffffffffu, above, src);
  return static_cast<uint32_t>(__shfl_sync(0xffffffffu, digit, src));
}

// Keeps the k best of the n > k candidates of buf in place, stably (see indexer_topk_kernel.cuh);
// returns u*, the order key of the k-th best. Called by a whole warp; hist: the warp's 256 bins.
__device__ __noinline__ inline uint32_t warp_compact(uint2* buf, int n, int k, uint32_t* hist) {
  const int lane = threadIdx.x & 31;
  const uint32_t lt = (1u << lane) - 1u;
  uint32_t prefix = 0;
  int need = k;  // entries still to take among those matching `prefix`
#pragma unroll 1
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int b = lane; b < 256; b += 32) hist[b] = 0u;
    __syncwarp();
    for (int e = lane; e < n; e += 32) {
      const uint32_t u = __ldcg(&buf[e].x);
      if (pass == 0 || (u >> (shift + 8)) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
    }
    __syncwarp();
    uint32_t greater = 0;
    const uint32_t digit = radix_digit(hist, static_cast<uint32_t>(need), &greater);
    need -= static_cast<int>(greater);
    prefix = (prefix << 8) | digit;
    __syncwarp();  // every lane read the bins before the next pass clears them
  }
  // Stable in-place filter: position out + rank <= the entry's own position, and a chunk is read
  // (its loads feed the ballots) before any of its stores.
  int out = 0, eq_seen = 0;
  for (int base = 0; base < n; base += 32) {
    const int e = base + lane;
    uint2 v = make_uint2(0u, 0u);
    if (e < n) v = __ldcg(&buf[e]);
    const bool gt = e < n && v.x > prefix;
    const bool eq = e < n && v.x == prefix;
    const uint32_t eq_mask = __ballot_sync(0xffffffffu, eq);
    const bool keep = gt || (eq && eq_seen + __popc(eq_mask & lt) < need);
    const uint32_t keep_mask = __ballot_sync(0xffffffffu, keep);
    if (keep) __stcg(&buf[out + __popc(keep_mask & lt)], v);
    out += __popc(keep_mask);
    eq_seen += __popc(eq_mask);
  }
  __syncwarp();
  return prefix;
}

// The selection state of the kRows queries a warp owns, the same in every lane (a bit mask for
// "compacted": the register footprint of the portable kernel as it was measured).
template <int kRows>
struct TopkRows {
  int count[kRows];    // entries in the row's buffer
  uint32_t thr[kRows];  // u*, valid where bit r of `compacted` is set
  uint32_t compacted;   // before a row's first compaction every in-range key is taken
  static_assert(kRows <= 32, "one bit per row");

  __device__ __forceinline__ void start() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      count[r] = 0;
      thr[r] = 0;
    }
    compacted = 0;
  }

  // Offers keys s0 .. s0 + 63 of row r, scores[key - s0] (any memory the warp can read), keys
  // outside `range` ([begin, end), clamped to [0, S_kv)) ignored. Lane l tests keys l and l + 32;
  // the accepted ones are appended to buf in key order (two coalesced rounds). Compacts when the
  // next offer might not fit. Called by the whole warp, offers of a row in increasing s0.
  __device__ __forceinline__ void offer(int r, uint2* buf, const float* scores, int64_t s0,
                                        int2 range, int k, int cap, uint32_t* hist) {
    const int lane = threadIdx.x & 31;
    const uint32_t lt = (1u << lane) - 1u;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = 32 * h + lane;
      const int64_t s = s0 + key;
      const uint32_t u = order_key(scores[key]);
      const bool cand = s >= range.x && s < range.y && (!((compacted >> r) & 1u) || u > thr[r]);
      const uint32_t mask = __ballot_sync(0xffffffffu, cand);
      if (cand) __stcg(&buf[count[r] + __popc(mask & lt)], make_uint2(u, static_cast<uint32_t>(s)));
      count[r] += __popc(mask);
    }
    if (count[r] > cap - kTopkOfferKeys) {
      __syncwarp();  // the appended entries are visible to the whole warp
      thr[r] = warp_compact(buf, count[r], k, hist);
      compacted |= 1u << r;
      count[r] = k;
    }
  }

  // Writes row r: buf[0, count) (already in increasing key order) after a last compaction to k,
  // then -1; *len = the row's length (len may be null). Called by the whole warp.
  __device__ __forceinline__ void finish(int r, uint2* buf, int k, uint32_t* hist,
                                         int32_t* out_row, int32_t* len) {
    const int lane = threadIdx.x & 31;
    __syncwarp();
    if (count[r] > k) {
      warp_compact(buf, count[r], k, hist);
      count[r] = k;
    }
    for (int i = lane; i < k; i += 32)
      out_row[i] = i < count[r] ? static_cast<int32_t>(__ldcg(&buf[i].y)) : -1;
    if (len != nullptr && lane == 0) *len = count[r];
  }
};

}  // namespace sa::portable::indexer
