// The portable BSA backward's main kernel (host side: bsa_backward.cu): mma.sync m16n8k16,
// ldmatrix, cp.async (sm80+). Device code only; bsa_backward.cu instantiates it.
//
// A CTA owns one work item of the key-to-query reverse map (common/reverse_map.hpp): KV block n
// of (batch b, KV head hk) -- kBlockN = block keys, loaded once -- and the entries
// [begin, end) of its reverse row, each a (query head hl of the group, query block m) that
// attends the block. It walks those query blocks as Q tiles of kBlockM = 64 rows (a 128-row
// block is two tiles), keeps dK and dV for its keys in fp32 registers for the whole walk, and
// adds each tile's dQ into the fp32 dQ accumulator (red.global.add; skipped in deterministic mode,
// where bsa_backward_dq_kernel.cuh computes dQ query-major).
//
// Warps (kNWarps = kBlockN / 16: 8 for block 128, 4 for block 64; kWarpsN = kNWarps / 2):
//   S, dP   [64 x kBlockN]        2 x kWarpsN warps of 32 rows x 32 keys
//   dK, dV  [kBlockN x D]         kWarpsN x 2 warps of 32 keys x D/2    (fp32, whole walk)
//   dQ      [64 x D]              2 x kWarpsN warps of 32 rows x D/kWarpsN (32-column chunks)
//
//   prologue  [0] K, V rows < valid -> smem (the rest zero-filled); the tile book (BwdTileBook:
//                 the group's base offsets, tile 0's entry); tile 0's Q, dO, lse2, delta ->
//                 stage 0 and tile 1's entry -> the book (one cp.async group)
//   tile t    [1] wait for tile t; barrier A: stage t%2 is full; every warp is done with tile
//                 t-1 (stage (t+1)%2, sP, sdS are free)
//             [2] issue tile t+1's Q, dO, lse2, delta -> stage (t+1)%2 (lands during tile t),
//                 addressed from the book (its entry landed with tile t), and tile t+2's entry
//                 -> the book; the stats row of tile t+1 (its dQ rows) -> the book
//             [3] S  = Q K^T                      (Q, K by ldmatrix; fp32 accumulators)
//             [4] dP = dO V^T
//             [5] P  = 2^(S scale log2e - lse2), 0 for padded keys (and, on a tile the token
//                 mask cuts, for the pairs it hides); dS = P (dP - delta)
//                 P -> sP, dS -> sdS (bf16/fp16)
//             [6] barrier B: sP, sdS complete
//             [7] dV += P^T dO                    (P^T, dO by ldmatrix.trans)
//             [8] dK += dS^T Q
//             [9] dQ  = dS K  -> red.global.add into dq_accum (not in deterministic mode)
//   epilogue  [10] the row has a single group (row_groups == 1, empty rows included): dK * scale,
//                  dV -> 16-bit -> smem (K, V's tiles) -> 16-byte stores of keys < S_kv, padded
//                  keys (past block_len) as zeros; else fp32 red.global.add of keys < valid into
//                  dk_accum / dv_accum (bsa_backward_aux.cu converts those rows).
//
//   time ->  |load K,V,Q0|  S0 dP0 P0/dS0 |B| dV0 dK0 dQ0 |A| S1 dP1 ... |A| ... |epilogue|
//   copies                  Q1,dO1 in flight ........... Q2,dO2 in flight ...
//
//   Per SM: one 8-warp CTA (block 128, ~161 KB of shared memory at D = 128) or two 4-warp CTAs
//   (block 64). Between barriers every warp runs the same phase; the next tile's copies are the
//   only work in flight across a barrier.
//
// Token masks (SPEC 4): the reverse map holds no pair the mask hides entirely; a Q tile (64 rows)
// that the mask hides from the whole KV block is skipped after its copies are issued ([2]), and
// a tile the mask cuts applies the band per element at [5]; other tiles do no mask math.
//
// Packed batches (SPEC 4; the kPacked instantiations, Traits::kPacked): the item's row
// (b, hk, n) is KV block n of sequence b, local to it; the sequence (CtaSeq, bsa_cta_seq.cuh,
// read on the device from cu_seqlens) gives the rows' bound sq, the keys' bound skv, the band,
// and the first tokens q0 / k0, added only where q, dO, k, v, dk, dv are addressed. The stats and
// the dQ accumulator are [H_q, packed rows] (cuda/bsa_packed_rows.hpp: the sequence's rows start
// at packed_stat_row0, and its padding rows are its own); the several-owner dK/dV accumulators
// are [H_kv, T_kv] by the global key. With the book the sequence sits in it; without (block 64,
// D 128, where shared memory is full) it is re-read from cu_seqlens where used. Dense
// instantiations compile the code they did before packed batches (the branches are constexpr).
//
// Memory safety: Q/dO rows >= S_q and K/V rows >= valid are never read (cp.async zero fill).
// Rows >= S_q have lse2 = +inf and delta = 0 (preprocess), so their P and dS are exactly 0;
// padded keys get P = 0 explicitly, so their dK, dV are exactly 0 and, their K being zero, they
// add nothing to dQ, even when their memory holds NaN.
//
// Registers: dK and dV hold 128 fp32 per thread at D = 128, S and dP 64 more; values that are
// cheap to recompute (lane roles, fragment offsets of the later GEMMs, the padding bound) are
// re-derived from opaque copies (sm80::opaque) where they are used, and the per-tile bookkeeping
// lives in shared memory (the book), so that the compiler does not keep them live across the
// tile loop (that spilled). Keeping the bookkeeping out of registers used to cost a chain of
// dependent global loads and integer divisions per tile, run by every warp in lockstep after
// barrier A (19% of the stall samples, bench/notes-archive session 11); the book removed it (+7% at
// block 128, D 128).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/fast_divisor.hpp"
#include "common/problem.hpp"
#include "cuda/bsa_packed_rows.hpp"
#include "sm80/bsa_cta_seq.cuh"
#include "sm80/kernel_traits.hpp"
#include "sm80/kv_tile_copy.cuh"
#include "sm80/sm80_primitives.hpp"

namespace sa::portable {

// What the backward kernels read besides the problem's tensors: the preprocess results and the
// reverse map, all in the workspace.
struct BsaBwdParams {
  Bhsd q, k, v, dout;        // [B, H, S, D] by BHSD-ordered element strides (k, v: H = H_kv)
  Bhsd dq, dk, dv;           // outputs (dq: deterministic dQ kernel only)
  // Packed batches: B = 1 in the next five shapes, Sq_pad = packed_stat_rows(T_q, B, block)
  // and Skv_pad = T_kv (cuda/bsa_packed_rows.hpp).
  const float* lse2;         // [B, H_q, Sq_pad]: lse * log2(e); +inf for rows without keys / past S_q
  const float* delta;        // [B, H_q, Sq_pad]: rowsum(dO * O); 0 past S_q
  float* dq_accum;           // [B, H_q, Sq_pad, D] fp32, zeroed; null: no dQ in the main kernel
  float* dk_accum;           // [B, H_kv, Skv_pad, D] fp32, zeroed; null when no row can have
  float* dv_accum;           //   several groups
  // Reverse map (cuda/reverse_map_gpu.hpp).
  const int32_t* entries;
  const int32_t* row_groups;
  const int32_t* item_row;
  const int32_t* item_begin;
  const int32_t* item_end;
  const int32_t* num_items;
  BsaDims dims;
  BsaMeta meta;
  int32_t Sq, Skv, Sq_pad, Skv_pad, block, group, Hq, Hkv, Nq, Nkv;
  FastDivisor nq_div;        // entry / N_q = the entry's query head in the group
  float scale;               // softmax scale (dK, dQ factor)
  float scale_log2;          // scale * log2(e)
  int32_t mask_on;           // nonzero: a token mask; key s visible to query i iff
  int32_t mask_lo, mask_hi;  //   mask_lo <= s - i <= mask_hi (meta.mask, clamped to [-Sq, Skv])
};

// How a tile of query rows [r0, r0 + rows) (cut at S_q) and keys [k0, k0 + keys) meets the token
// mask; rows entirely past S_q count as outside (they add nothing).
__device__ __forceinline__ MaskClass bwd_mask_class(const BsaBwdParams& p, int r0, int rows,
                                                    int k0, int keys) {
  const int r1 = min(r0 + rows, p.Sq) - 1;
  if (r1 < r0) return MaskClass::kOutside;
  return classify_tile<int>(r0, r1, k0, k0 + keys - 1, p.mask_lo, p.mask_hi);
}
// Packed batches: S_q and the band are the sequence's.
__device__ __forceinline__ MaskClass bwd_mask_class_seq(const CtaSeq& s, int r0, int rows, int k0,
                                                        int keys) {
  const int r1 = min(r0 + rows, s.sq) - 1;
  if (r1 < r0) return MaskClass::kOutside;
  return classify_tile<int>(r0, r1, k0, k0 + keys - 1, s.mask_lo, s.mask_hi);
}

// Where a work item's query-head group starts: the Q and dO element offsets of (batch, first
// query head of the group, row 0) and the group's first row of the stats (lse2, delta) and of the
// dQ accumulator (rows of D floats).
struct BwdGroupBase {
  int64_t q, dout, stats;
};

// Packed batches: the sequence's first query token added to q and dO (whose sb is 0), its
// first stats row (packed_stat_row0) to stats.
template <bool kPacked = false>
__device__ __forceinline__ BwdGroupBase bwd_group_base(const BsaBwdParams& p, int item_row) {
  const int b = item_row / (p.Nkv * p.Hkv);
  const int64_t h0 = static_cast<int64_t>((item_row / p.Nkv) % p.Hkv) * p.group;
  if constexpr (kPacked) {
    const SeqSpan s = p.meta.seq(b, p.dims);
    return {s.q0 * p.q.ss + h0 * p.q.sh, s.q0 * p.dout.ss + h0 * p.dout.sh,
            h0 * p.Sq_pad + packed_stat_row0(b, s.q0, p.block)};
  }
  return {b * p.q.sb + h0 * p.q.sh, b * p.dout.sb + h0 * p.dout.sh,
          (static_cast<int64_t>(b) * p.Hq + h0) * p.Sq_pad};
}

// The main kernel's per-tile bookkeeping in shared memory (Traits::kBook): what a tile's copies
// and its dQ reductions need besides the tile index, so that the loop keeps none of it in
// registers and never waits on a global load of the reverse map (each tile's entry arrives one
// tile early, with the previous tile's copies).
struct BwdTileBook {
  BwdGroupBase base;
  int64_t stats_row[2];  // per stage: base.stats + hl Sq_pad + the tile's first row
  int32_t entry[2];      // the entry of tile t, in slot t % 2
  int32_t first_entry;   // the item's first entry index
  int32_t pad;
  int32_t row0[2];       // per stage: the tile's first query row (the token mask's classification)
};

// Packed batches: the book also holds the item's sequence.
struct BwdTileBookPacked : BwdTileBook {
  CtaSeq seq;
};

template <int kBlockN_, int kHeadDim_, class Element_, bool kPacked_ = false>
struct BwdKernelTraits {
  using Element = Element_;
  static constexpr bool kPacked = kPacked_;   // packed (THD) batches: the sequence from cu_seqlens
  static constexpr int kBlockN = kBlockN_;     // keys per CTA: the block size, 64 or 128
  static constexpr int kBlockM = 64;           // query rows per Q tile
  static constexpr int kHeadDim = kHeadDim_;   // D == D_v
  static constexpr int kNWarps = kBlockN / 16;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kWarpsN = kNWarps / 2;  // warps along keys (S, dK/dV) or D (dQ)
  static constexpr int kTilesPerEntry = kBlockN / kBlockM;
  static constexpr int kKvCols = kHeadDim / 2;         // dK/dV columns of a warp
  static constexpr int kKvNTiles = kKvCols / 8;
  static constexpr int kDqCols = kHeadDim / kWarpsN;   // dQ columns of a warp
  static constexpr int kDqChunk = kDqCols < 32 ? kDqCols : 32;
  // Global <-> shared copies: 16-byte chunks, consecutive threads along a row.
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kRowChunks = kRowBytes / 16;
  static constexpr int kCopyRows = kNThreads / kRowChunks;
  static constexpr int kPRowBytes = kBlockN * 2;       // rows of sP, sdS
  // Shared memory: K, V, Q[2], dO[2], P, dS, then [2 stages][lse2 | delta] x 64 fp32, then the
  // tile bookkeeping (BwdTileBook).
  static constexpr int kKvBytes = kBlockN * kRowBytes;
  static constexpr int kQTileBytes = kBlockM * kRowBytes;
  static constexpr int kPBytes = kBlockM * kPRowBytes;
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kKvBytes;
  static constexpr int kOffQ = kOffV + kKvBytes;
  static constexpr int kOffDo = kOffQ + 2 * kQTileBytes;
  static constexpr int kOffP = kOffDo + 2 * kQTileBytes;
  static constexpr int kOffDs = kOffP + kPBytes;
  static constexpr int kOffStats = kOffDs + kPBytes;
  static constexpr int kStatsStageBytes = 2 * kBlockM * 4;
  static constexpr int kOffBook = kOffStats + 2 * kStatsStageBytes;
  // The tile book is in shared memory except at block 64, D 128, where two CTAs fill an sm90
  // SM's 228 KB exactly (56 more bytes would halve the CTAs per SM: measured -13%); there each
  // tile re-reads its entry and the item's row from the reverse map.
  static constexpr bool kBook = !(kBlockN == 64 && kHeadDim == 128);
  using Book = std::conditional_t<kPacked, BwdTileBookPacked, BwdTileBook>;
  static constexpr int kSmemBytes = kOffBook + (kBook ? static_cast<int>(sizeof(Book)) : 0);
  // Block 128: 8 warps and ~160 KB (D = 128): one CTA per SM. Block 64: 4 warps, two per SM.
  static constexpr int kMinBlocksPerSm = kBlockN == 128 ? 1 : 2;

  static_assert(sizeof(Element) == 2, "16-bit elements");
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kBlockN == 64 || kBlockN == 128, "block 64 or 128");
  static_assert(kCopyRows % 8 == 0, "a thread's copy rows share one swizzle phase");
  static_assert(kBlockM % kCopyRows == 0 && kBlockN % kCopyRows == 0, "whole copy passes");
  static_assert(kDqCols % kDqChunk == 0 && kDqChunk % 16 == 0, "dQ chunks of n16 pairs");
  static_assert(kKvNTiles % 2 == 0, "dK/dV columns in n16 pairs");
};

namespace bwd {

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile of kRowBytes-byte rows,
// where `phase` = row % 8 (the lane's ldmatrix row, lrow).
//
// Fragment addresses are split into a per-thread part, computed once, and compile-time
// immediates, so that ldmatrix takes [register + immediate] and a handful of registers address
// every fragment. A fragment's row is row_rt + row_ct (row_ct a multiple of 8, so the swizzle
// phase stays lrow) and its chunk is chunk_rt + s + 8 c with s, c compile-time; as long as
// chunk_rt % 8 + s < 8 (no carry out of the low 3 bits, which the swizzle permutes),
//   offset = frag_offset(row_rt, chunk_rt + s, lrow) + row_ct * kRowBytes + 128 c.
// So one register per distinct s (e.g. the four k16 steps 2u of a 128-byte line).
template <int kRowBytes>
__device__ __forceinline__ uint32_t frag_offset(int row, int chunk, int phase) {
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ phase) << 4));
}


template <int kM, int kN>
__device__ __forceinline__ void zero(float (&acc)[kM][kN][4]) {
#pragma unroll
  for (int i = 0; i < kM; ++i)
#pragma unroll
    for (int j = 0; j < kN; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;
}

}  // namespace bwd

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm)
    bsa_backward_kernel(const __grid_constant__ BsaBwdParams p) {
  using Element = typename Traits::Element;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kWarpsN = Traits::kWarpsN;
  constexpr int kTilesPerEntry = Traits::kTilesPerEntry;
  constexpr int kKvCols = Traits::kKvCols;
  constexpr int kKvNTiles = Traits::kKvNTiles;
  constexpr int kDqCols = Traits::kDqCols;
  constexpr int kDqChunk = Traits::kDqChunk;
  constexpr int kRowBytes = Traits::kRowBytes;
  constexpr int kRowChunks = Traits::kRowChunks;
  constexpr int kCopyRows = Traits::kCopyRows;
  constexpr int kPRowBytes = Traits::kPRowBytes;
  constexpr int kQTileBytes = Traits::kQTileBytes;
  constexpr bool kPacked = Traits::kPacked;
  using Book = typename Traits::Book;

  const int item = blockIdx.x;
  if (item >= *p.num_items) return;

  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t s_base = sm80::smem_address(smem);
  const uint32_t s_k = s_base + Traits::kOffK;
  const uint32_t s_v = s_base + Traits::kOffV;
  const uint32_t s_q = s_base + Traits::kOffQ;    // 2 stages
  const uint32_t s_do = s_base + Traits::kOffDo;  // 2 stages
  const uint32_t s_p = s_base + Traits::kOffP;
  const uint32_t s_ds = s_base + Traits::kOffDs;
  const float* s_stats = reinterpret_cast<const float*>(smem + Traits::kOffStats);

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;

  // The work item: row r = (b * Hkv + hk) * Nkv + n, entries [begin, end).
  const int row = p.item_row[item];
  const int begin = p.item_begin[item];
  const int num_tiles = (p.item_end[item] - begin) * kTilesPerEntry;
  const int n = row % p.Nkv;
  const int hk = (row / p.Nkv) % p.Hkv;
  const int b = row / (p.Nkv * p.Hkv);
  const int key0 = n * kBlockN;
  // Valid keys of the block (>= 1 by the contract; never past S_kv). Packed: the sequence's,
  // <= 0 for a block past its end (the reverse map gives such rows no work item).
  CtaSeq seq0{};
  int valid;
  if constexpr (kPacked) {
    seq0 = cta_seq(p.meta, p.dims, b);
    valid = cta_block_len(p.meta, p.dims, b, n, seq0);
  } else {
    valid = min(p.meta.block_len(b, n, p.dims), p.Skv - key0);
  }

  const Element* q_base = static_cast<const Element*>(p.q.data);
  const Element* do_base = static_cast<const Element*>(p.dout.data);

  // [0] K and V rows [0, valid) of the block; the rest zero-filled, never read.
  if (num_tiles > 0) {
    // Copy role: 16-byte chunk copy_chunk of rows copy_row + i * kCopyRows.
    const int copy_row = tid / kRowChunks;
    const int copy_chunk = tid % kRowChunks;
    const uint32_t copy_smem = swizzled_offset<kRowBytes>(copy_row, copy_chunk);
    const Element* k_base = static_cast<const Element*>(p.k.data);
    const Element* v_base = static_cast<const Element*>(p.v.data);
    const Element* k_src;
    const Element* v_src;
    if constexpr (kPacked) {  // sb is 0; the sequence's first key comes in by the row
      const int64_t kv_row = static_cast<int64_t>(seq0.k0) + key0 + copy_row;
      k_src = k_base + (hk * p.k.sh + kv_row * p.k.ss + copy_chunk * 8);
      v_src = v_base + (hk * p.v.sh + kv_row * p.v.ss + copy_chunk * 8);
    } else {
      k_src = k_base + (b * p.k.sb + hk * p.k.sh +
                        static_cast<int64_t>(key0 + copy_row) * p.k.ss + copy_chunk * 8);
      v_src = v_base + (b * p.v.sb + hk * p.v.sh +
                        static_cast<int64_t>(key0 + copy_row) * p.v.ss + copy_chunk * 8);
    }
    copy_kv_rows<kBlockN, kCopyRows, kRowBytes>(s_k + copy_smem, s_v + copy_smem, k_src, v_src,
                                                p.k.ss, p.v.ss, k_base, v_base, copy_row, valid);
  }

  // Tile t's entry (hl * Nq + m) and its group's base offsets: from the book (Traits::kBook) or
  // re-read from the reverse map (L1 hits, through an opaque item index rather than kept in
  // registers across the main loop).
  Book& book = *reinterpret_cast<Book*>(smem + Traits::kOffBook);
  auto tile_entry = [&](int t) {
    if constexpr (Traits::kBook) return book.entry[t & 1];
    const int it = sm80::opaque(static_cast<int>(blockIdx.x));
    return p.entries[p.item_begin[it] + t / kTilesPerEntry];
  };
  auto group_base = [&]() {
    if constexpr (Traits::kBook) return book.base;
    return bwd_group_base<kPacked>(p, p.item_row[sm80::opaque(static_cast<int>(blockIdx.x))]);
  };
  // Packed: the item's sequence, from the book or re-read from cu_seqlens.
  auto item_seq = [&]() {
    if constexpr (kPacked && Traits::kBook) {
      return book.seq;
    } else {
      const int r = p.item_row[sm80::opaque(static_cast<int>(blockIdx.x))];
      return cta_seq(p.meta, p.dims, r / (p.Nkv * p.Hkv));
    }
  };
  // Tile t's first stats row (= its first dQ accumulator row), its query head in the group (hl)
  // and its first query row (r0).
  auto tile_stats_row = [&](int t, const BwdGroupBase& g, int& hl, int& r0) {
    const int e = tile_entry(t);
    hl = p.nq_div.div(e);
    r0 = (e - hl * p.Nq) * kBlockN + (t % kTilesPerEntry) * kBlockM;
    return g.stats + static_cast<int64_t>(hl) * p.Sq_pad + r0;
  };

  // Tile t's Q and dO rows (zero past S_q), lse2 and delta -> stage; with the book, also the
  // tile's stats row -> the book (its dQ reductions read it) and the entry of tile t + 1 -> the
  // book (it lands with the tile's copies).
  auto load_tile = [&](int t, int stage) {
    const BwdGroupBase g = group_base();
    int hl, r0;
    const int64_t stats_row = tile_stats_row(t, g, hl, r0);
    // Copy roles re-derived from an opaque tid: not kept live across the main loop.
    const int ctid = sm80::opaque(static_cast<int>(threadIdx.x));
    const int copy_row = ctid / kRowChunks;
    const int copy_chunk = ctid % kRowChunks;
    const uint32_t copy_smem = swizzled_offset<kRowBytes>(copy_row, copy_chunk);
    const int64_t head_q = g.q + hl * p.q.sh + copy_chunk * 8;
    const int64_t head_do = g.dout + hl * p.dout.sh + copy_chunk * 8;
    const uint32_t q_dst = s_q + stage * kQTileBytes + copy_smem;
    const uint32_t do_dst = s_do + stage * kQTileBytes + copy_smem;
    int sq_lim;
    if constexpr (kPacked)
      sq_lim = item_seq().sq;
    else
      sq_lim = p.Sq;
#pragma unroll
    for (int i = 0; i < kBlockM / kCopyRows; ++i) {
      const int r = r0 + copy_row + i * kCopyRows;
      const bool ok = r < sq_lim;
      const Element* qs = ok ? q_base + (head_q + r * p.q.ss) : q_base;
      const Element* ds = ok ? do_base + (head_do + r * p.dout.ss) : do_base;
      sm80::cp_async_16(q_dst + i * kCopyRows * kRowBytes, qs, ok);
      sm80::cp_async_16(do_dst + i * kCopyRows * kRowBytes, ds, ok);
    }
    if (ctid < 32) {  // 16 chunks of lse2, then 16 of delta (workspace rows: always in bounds)
      const float* src = (ctid < 16 ? p.lse2 : p.delta) + (stats_row + 4 * (ctid % 16));
      sm80::cp_async_16(s_base + Traits::kOffStats + stage * Traits::kStatsStageBytes + ctid * 16,
                        src, true);
    }
    if constexpr (Traits::kBook) {
      if (ctid == 32 && t + 1 < num_tiles)
        sm80::cp_async_4(
            s_base + Traits::kOffBook + offsetof(BwdTileBook, entry) + 4 * ((t + 1) & 1),
            p.entries + book.first_entry + (t + 1) / kTilesPerEntry);
      if (ctid == 0) {
        book.stats_row[stage] = stats_row;
        book.row0[stage] = r0;
      }
    }
  };
  // Tile t's first query row (valid after barrier [1] of tile t; with the book, from its stage).
  auto tile_row0 = [&](int t, int stage) {
    if constexpr (Traits::kBook) return book.row0[stage];
    int hl, r0;
    tile_stats_row(t, group_base(), hl, r0);
    return r0;
  };
  // The token mask's class of tile t against the item's KV block (re-derived where used, not
  // kept across the tile's math).
  auto item_key0 = [&]() {
    return p.item_row[sm80::opaque(static_cast<int>(blockIdx.x))] % p.Nkv * kBlockN;
  };
  auto tile_mask_class = [&](int t, int stage) {
    const int r = p.item_row[sm80::opaque(static_cast<int>(blockIdx.x))];
    const int nb = r % p.Nkv;
    const int bb = r / (p.Nkv * p.Hkv);
    const int k0 = nb * kBlockN;
    if constexpr (kPacked) {
      const CtaSeq cs = item_seq();
      const int keys = cta_block_len(p.meta, p.dims, bb, nb, cs);
      return bwd_mask_class_seq(cs, tile_row0(t, stage), kBlockM, k0, keys);
    } else {
      const int keys = min(p.meta.block_len(bb, nb, p.dims), p.Skv - k0);
      return bwd_mask_class(p, tile_row0(t, stage), kBlockM, k0, keys);
    }
  };

  // The book's per-item fields and tile 0's entry (later entries arrive by load_tile).
  if constexpr (Traits::kBook) {
    if (tid == 0 && num_tiles > 0) {
      if constexpr (kPacked) book.seq = seq0;
      book.base = bwd_group_base<kPacked>(p, row);
      book.first_entry = begin;
      book.entry[0] = p.entries[begin];
    }
    __syncthreads();
  }
  if (num_tiles > 0) load_tile(0, 0);
  sm80::cp_async_commit();

  // Lane roles. ldmatrix: lane l addresses row l % 8 of matrix l / 8; fragment rows are
  // (multiple of 8) + lrow, so their swizzle phase is lrow.
  const int lrow = lane & 7;
  const int sel8 = (lane >> 3) & 1;
  const int sel16 = lane >> 4;
  // Warp roles: S, dP, dQ rows 32 wm ..; S, dP, dK, dV keys 32 wn ..; dQ columns kDqCols wn ..;
  // dK, dV columns kKvCols wm ... Accumulator rows g, g + 8 and column pair t4 of an m16n8 tile:
  // g = lane / 4, t4 = lane % 4. Where registers are scarce (the P/dS step, dQ, the epilogue)
  // these are re-derived from an opaque tid rather than kept live across the loop.
  const int wm = warp / kWarpsN;
  const int wn = warp % kWarpsN;

  // Per-thread fragment offsets (bwd::frag_offset), indexed by the compile-time low chunk:
  //   qa  A of S, dP (Q, dO):        rows 32 wm + 8 sel8 + lrow,  chunk 2 kk + sel16
  //   kb  B of S, dP (K, V):         rows 32 wn + 8 sel16 + lrow, chunk 2 kk + sel8
  //   pt  A of dV, dK (P^T, dS^T):   rows 16 kk + 8 sel16 + lrow, chunk 4 wn + 2 mi + sel8  (.trans)
  //   ob  B of dV, dK (dO, Q):       rows 16 kk + 8 sel8 + lrow,  chunk wd kKvCols/8 + 2 dp + sel16
  //                                                                                    (.trans)
  //   dsa A of dQ (dS):              rows 32 wm + 8 sel8 + lrow,  chunk 2 kk + sel16
  //   kt  B of dQ (K):               rows 16 kk + 8 sel8 + lrow,  chunk wn kDqCols/8 + 2 i + sel16
  //                                                                                    (.trans)
  // Matrices of an x4 load: A (rows +0/+8) x (k +0/+8); B non-trans (n +0/+8 by sel16) x
  // (k +0/+8 by sel8); B trans (k +0/+8 by sel8) x (n +0/+8 by sel16).
  // qa and kb (used where registers are scarcest) are kept across the loop; the others are
  // re-derived in each tile, after S and dP, from an opaque lane id.
  uint32_t off_qa[4], off_kb[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    off_qa[u] = bwd::frag_offset<kRowBytes>(32 * wm + 8 * sel8 + lrow, 2 * u + sel16, lrow);
    off_kb[u] = bwd::frag_offset<kRowBytes>(32 * wn + 8 * sel16 + lrow, 2 * u + sel8, lrow);
  }

  float acc_dk[2][kKvNTiles][4], acc_dv[2][kKvNTiles][4];
  bwd::zero(acc_dk);
  bwd::zero(acc_dv);

#pragma unroll 1
  for (int t = 0; t < num_tiles; ++t) {
    const int stage = t & 1;
    // [1]
    sm80::cp_async_wait<0>();
    __syncthreads();
    // [2]
    if (t + 1 < num_tiles) load_tile(t + 1, stage ^ 1);
    sm80::cp_async_commit();
    // A tile the token mask hides from the whole block adds nothing: skip it (CTA-uniform).
    if (p.mask_on && tile_mask_class(t, stage) == MaskClass::kOutside) continue;

    const uint32_t q_tile = s_q + stage * kQTileBytes;
    const uint32_t do_tile = s_do + stage * kQTileBytes;

    // [3] S = Q K^T and [4] dP = dO V^T: 32 x 32 per warp, k16 steps over D.
    float s[2][4][4], dp[2][4][4];
    bwd::zero(s);
    bwd::zero(dp);
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        sm80::ldmatrix_x4(q_tile + off_qa[kk % 4] + (mi * 16 * kRowBytes + (kk / 4) * 128), a[mi]);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t kb[4];
        sm80::ldmatrix_x4(s_k + off_kb[kk % 4] + (np * 16 * kRowBytes + (kk / 4) * 128), kb);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          sm80::mma_16816<Element>(s[mi][2 * np], a[mi], kb[0], kb[1]);
          sm80::mma_16816<Element>(s[mi][2 * np + 1], a[mi], kb[2], kb[3]);
        }
      }
    }
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        sm80::ldmatrix_x4(do_tile + off_qa[kk % 4] + (mi * 16 * kRowBytes + (kk / 4) * 128),
                          a[mi]);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t vb[4];
        sm80::ldmatrix_x4(s_v + off_kb[kk % 4] + (np * 16 * kRowBytes + (kk / 4) * 128), vb);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          sm80::mma_16816<Element>(dp[mi][2 * np], a[mi], vb[0], vb[1]);
          sm80::mma_16816<Element>(dp[mi][2 * np + 1], a[mi], vb[2], vb[3]);
        }
      }
    }

    // [5] P and dS, stored to sP / sdS as 16-bit pairs (row r, keys 32 wn + 8 j + 2 t4 ..+1).
    // Two copies of the step: with the token mask's band (kBand, a tile the mask cuts) and
    // without (every other tile: no mask math).
    auto p_and_ds = [&](auto band_tag) {
      constexpr bool kBand = decltype(band_tag)::value;
      // Lane roles re-derived from an opaque tid (cheaper than keeping them across the loop).
      const int ptid = sm80::opaque(static_cast<int>(threadIdx.x));
      const int wm = ptid / 32 / kWarpsN, wn = ptid / 32 % kWarpsN;
      const int g = (ptid % 32) >> 2, t4 = ptid & 3;
      const float* lse2 = s_stats + stage * (Traits::kStatsStageBytes / 4);
      const float* delta = lse2 + kBlockM;
      // Keys 32 wn + 8 j + 2 t4 + c >= valid are padded: P = 0. The bound comes from an opaque
      // copy so that the compiler does not hoist the 16 comparisons out of the loop as
      // predicates kept in registers.
      const int lim = sm80::opaque(valid) - (32 * wn + 2 * t4);
      // kBand: key - query of (row 0, column 32 wn + 2 t4); key - query of (r, + 8 j + c) is
      // dbase - r + 8 j + c (within int32: S_q, S_kv fit int32).
      int dbase = 0;
      [[maybe_unused]] int band_lo = 0, band_hi = 0;  // packed: the sequence's band
      if constexpr (kBand) {
        dbase = item_key0() - tile_row0(t, stage) + 32 * wn + 2 * t4;
        if constexpr (kPacked) {
          const CtaSeq cs = item_seq();
          band_lo = cs.mask_lo;
          band_hi = cs.mask_hi;
        }
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = 32 * wm + 16 * mi + 8 * half + g;
          const float l2 = lse2[r];
          const float dl = delta[r];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            float pr[2], ds[2];
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              float x = exp2_prob(fmaf(s[mi][j][2 * half + c], p.scale_log2, -l2));
              if (8 * j + c >= lim) x = 0.f;
              if constexpr (kBand) {
                const int d = dbase - r + 8 * j + c;
                if constexpr (kPacked) {
                  if (d < band_lo || d > band_hi) x = 0.f;
                } else {
                  if (d < p.mask_lo || d > p.mask_hi) x = 0.f;
                }
              }
              pr[c] = x;
              ds[c] = x * (dp[mi][j][2 * half + c] - dl);
            }
            const uint32_t off = static_cast<uint32_t>(r * kPRowBytes +
                                                       (((4 * wn + j) ^ g) << 4) + 4 * t4);
            *reinterpret_cast<uint32_t*>(smem + Traits::kOffP + off) =
                pack2<Element>(pr[0], pr[1]);
            *reinterpret_cast<uint32_t*>(smem + Traits::kOffDs + off) =
                pack2<Element>(ds[0], ds[1]);
          }
        }
      }
    };
    if (p.mask_on && tile_mask_class(t, stage) == MaskClass::kPartial)
      p_and_ds(std::true_type{});
    else
      p_and_ds(std::false_type{});
    // [6]
    __syncthreads();

    uint32_t off_pt[2], off_ob[kKvNTiles / 2], off_dsa[4], off_kt[kDqCols / 16];
    {
      const int ln = sm80::opaque(static_cast<int>(threadIdx.x));
      const int l_row = ln & 7, l_sel8 = (ln >> 3) & 1, l_sel16 = (ln >> 4) & 1;
      const int l_wm = ln / 32 / kWarpsN, l_wn = ln / 32 % kWarpsN;
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        off_pt[mi] = bwd::frag_offset<kPRowBytes>(8 * l_sel16 + l_row,
                                                  4 * l_wn + 2 * mi + l_sel8, l_row);
#pragma unroll
      for (int i = 0; i < kKvNTiles / 2; ++i)
        off_ob[i] = bwd::frag_offset<kRowBytes>(8 * l_sel8 + l_row,
                                                l_wm * (kKvCols / 8) + 2 * i + l_sel16, l_row);
#pragma unroll
      for (int u = 0; u < 4; ++u)
        off_dsa[u] = bwd::frag_offset<kPRowBytes>(32 * l_wm + 8 * l_sel8 + l_row,
                                                  2 * u + l_sel16, l_row);
#pragma unroll
      for (int i = 0; i < kDqCols / 16; ++i)
        off_kt[i] = bwd::frag_offset<kRowBytes>(8 * l_sel8 + l_row,
                                                l_wn * (kDqCols / 8) + 2 * i + l_sel16, l_row);
    }

    // [7] dV += P^T dO and [8] dK += dS^T Q: 32 keys x kKvCols per warp, k16 steps over the
    // tile's 64 query rows.
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        sm80::ldmatrix_x4_trans(s_p + off_pt[mi] + kk * 16 * kPRowBytes, a[mi]);
#pragma unroll
      for (int dp2 = 0; dp2 < kKvNTiles / 2; ++dp2) {
        uint32_t ob[4];
        sm80::ldmatrix_x4_trans(do_tile + off_ob[dp2] + kk * 16 * kRowBytes, ob);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          sm80::mma_16816<Element>(acc_dv[mi][2 * dp2], a[mi], ob[0], ob[1]);
          sm80::mma_16816<Element>(acc_dv[mi][2 * dp2 + 1], a[mi], ob[2], ob[3]);
        }
      }
    }
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        sm80::ldmatrix_x4_trans(s_ds + off_pt[mi] + kk * 16 * kPRowBytes, a[mi]);
#pragma unroll
      for (int dp2 = 0; dp2 < kKvNTiles / 2; ++dp2) {
        uint32_t qb[4];
        sm80::ldmatrix_x4_trans(q_tile + off_ob[dp2] + kk * 16 * kRowBytes, qb);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          sm80::mma_16816<Element>(acc_dk[mi][2 * dp2], a[mi], qb[0], qb[1]);
          sm80::mma_16816<Element>(acc_dk[mi][2 * dp2 + 1], a[mi], qb[2], qb[3]);
        }
      }
    }

    // [9] dQ = dS K, 32 rows x kDqChunk columns at a time, then red.global.add.
    if (p.dq_accum != nullptr) {
      const int qtid = sm80::opaque(static_cast<int>(threadIdx.x));
      const int wm = qtid / 32 / kWarpsN, wn = qtid / 32 % kWarpsN;
      const int g = (qtid % 32) >> 2, t4 = qtid & 3;
      int64_t stats_row;
      if constexpr (Traits::kBook) {
        stats_row = book.stats_row[stage];
      } else {
        int hl, r0;
        stats_row = tile_stats_row(t, group_base(), hl, r0);
      }
      float* dq_rows = p.dq_accum + (stats_row + 32 * wm + g) * kHeadDim + wn * kDqCols + 2 * t4;
#pragma unroll
      for (int chunk = 0; chunk < kDqCols / kDqChunk; ++chunk) {
        float acc[2][kDqChunk / 8][4];
        bwd::zero(acc);
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
          uint32_t a[2][4];
#pragma unroll
          for (int mi = 0; mi < 2; ++mi)
            sm80::ldmatrix_x4(s_ds + off_dsa[kk % 4] + (mi * 16 * kPRowBytes + (kk / 4) * 128),
                              a[mi]);
#pragma unroll
          for (int dp2 = 0; dp2 < kDqChunk / 16; ++dp2) {
            uint32_t kb[4];
            sm80::ldmatrix_x4_trans(
                s_k + off_kt[chunk * (kDqChunk / 16) + dp2] + kk * 16 * kRowBytes, kb);
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
              sm80::mma_16816<Element>(acc[mi][2 * dp2], a[mi], kb[0], kb[1]);
              sm80::mma_16816<Element>(acc[mi][2 * dp2 + 1], a[mi], kb[2], kb[3]);
            }
          }
        }
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
          for (int half = 0; half < 2; ++half)
#pragma unroll
            for (int j = 0; j < kDqChunk / 8; ++j)
              red_add_f32x2(dq_rows + (16 * mi + 8 * half) * kHeadDim + chunk * kDqChunk + 8 * j,
                                 acc[mi][j][2 * half], acc[mi][j][2 * half + 1]);
      }
    }
  }

  // [10] Epilogue. No copy may still be writing shared memory and every warp must be done with
  // K and V before their tiles stage the output.
  sm80::cp_async_wait<0>();
  __syncthreads();

  // Values the prologue also derived are re-derived from opaque copies (keeps them from staying
  // live across the main loop).
  const int out_item = sm80::opaque(static_cast<int>(blockIdx.x));
  const int out_row = p.item_row[out_item];
  const int out_n = out_row % p.Nkv;
  const int out_hk = (out_row / p.Nkv) % p.Hkv;
  const int out_b = out_row / (p.Nkv * p.Hkv);
  const int out_key0 = out_n * kBlockN;
  const int out_lane = sm80::opaque(static_cast<int>(threadIdx.x)) % 32;
  const int out_warp = sm80::opaque(static_cast<int>(threadIdx.x)) / 32;
  const int e_g = out_lane >> 2, e_t4 = out_lane & 3;
  const int e_wn = out_warp % kWarpsN, e_wd = out_warp / kWarpsN;
  // Packed: keys past the sequence's end belong to the next one (never written here); k0 comes
  // in by the row.
  int out_skv, out_k0 = 0;
  if constexpr (kPacked) {
    const CtaSeq cs = cta_seq(p.meta, p.dims, out_b);
    out_skv = cs.skv;
    out_k0 = cs.k0;
  } else {
    out_skv = p.Skv;
  }

  if (p.row_groups[out_row] == 1) {
    // Single owner: dK * scale and dV straight to the caller's tensors.
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int key = 32 * e_wn + 16 * mi + 8 * half + e_g;
#pragma unroll
        for (int j = 0; j < kKvNTiles; ++j) {
          const int chunk = e_wd * (kKvCols / 8) + j;
          const uint32_t off = swizzled_offset<kRowBytes>(key, chunk) + 4 * e_t4;
          *reinterpret_cast<uint32_t*>(smem + Traits::kOffK + off) =
              pack2<Element>(acc_dk[mi][j][2 * half] * p.scale,
                             acc_dk[mi][j][2 * half + 1] * p.scale);
          *reinterpret_cast<uint32_t*>(smem + Traits::kOffV + off) =
              pack2<Element>(acc_dv[mi][j][2 * half], acc_dv[mi][j][2 * half + 1]);
        }
      }
    }
    __syncthreads();
    const int out_tid = sm80::opaque(tid);
    const int out_copy_row = out_tid / kRowChunks;
    const int out_copy_chunk = out_tid % kRowChunks;
    const uint32_t out_copy_smem = swizzled_offset<kRowBytes>(out_copy_row, out_copy_chunk);
    const int rows = min(kBlockN, out_skv - out_key0);  // padded keys included (zeros)
    Element* dk = static_cast<Element*>(p.dk.data) + out_b * p.dk.sb + out_hk * p.dk.sh +
                  static_cast<int64_t>(out_k0) * p.dk.ss;
    Element* dv = static_cast<Element*>(p.dv.data) + out_b * p.dv.sb + out_hk * p.dv.sh +
                  static_cast<int64_t>(out_k0) * p.dv.ss;
#pragma unroll
    for (int i = 0; i < kBlockN / kCopyRows; ++i) {
      const int r = out_copy_row + i * kCopyRows;
      if (r < rows) {
        const int64_t key = out_key0 + r;
        const uint32_t off = out_copy_smem + i * kCopyRows * kRowBytes;
        *reinterpret_cast<uint4*>(dk + key * p.dk.ss + out_copy_chunk * 8) =
            *reinterpret_cast<const uint4*>(smem + Traits::kOffK + off);
        *reinterpret_cast<uint4*>(dv + key * p.dv.ss + out_copy_chunk * 8) =
            *reinterpret_cast<const uint4*>(smem + Traits::kOffV + off);
      }
    }
  } else {
    // Several owners: add the unscaled fp32 partials of the valid keys into the workspace.
    int out_valid;
    int64_t row_base;
    if constexpr (kPacked) {
      out_valid = min(kBlockN, out_skv - out_key0);
      row_base = static_cast<int64_t>(out_hk) * p.Skv_pad + out_k0 + out_key0;
    } else {
      out_valid = min(p.meta.block_len(out_b, out_n, p.dims), p.Skv - out_key0);
      row_base = (static_cast<int64_t>(out_b) * p.Hkv + out_hk) * p.Skv_pad + out_key0;
    }
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int key = 32 * e_wn + 16 * mi + 8 * half + e_g;
        if (key < out_valid) {
          float* dk_row = p.dk_accum + (row_base + key) * kHeadDim + e_wd * kKvCols + 2 * e_t4;
          float* dv_row = p.dv_accum + (row_base + key) * kHeadDim + e_wd * kKvCols + 2 * e_t4;
#pragma unroll
          for (int j = 0; j < kKvNTiles; ++j) {
            red_add_f32x2(dk_row + 8 * j, acc_dk[mi][j][2 * half], acc_dk[mi][j][2 * half + 1]);
            red_add_f32x2(dv_row + 8 * j, acc_dv[mi][j][2 * half], acc_dv[mi][j][2 * half + 1]);
          }
        }
      }
    }
  }
}

}  // namespace sa::portable
