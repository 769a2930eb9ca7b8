// The portable BSA backward's query-major dQ kernel, used in deterministic mode (host side:
// bsa_backward.cu). The main kernel (bsa_backward_kernel.cuh) then computes only dK and dV, and
// this kernel computes dQ without any atomic: a CTA owns 64 query rows of one (batch b, query
// head h), walks the KV blocks listed for their query block in slot order (the forward's order)
// as 64-key tiles, recomputes P and dS for each and accumulates dQ = dS K in fp32 registers; the
// result is written once, scaled, to the caller's dq. Same inputs, same order, same bits.
//
// 4 warps of 16 query rows each; K and V tiles double-buffered with cp.async.
//
//   prologue  [0] Q, dO rows < S_q -> smem; lse2, delta of the lane's 2 rows -> registers;
//                 tile 0's K, V -> stage 0
//   tile t    [1] wait for tile t; barrier (stage t%2 full, stage (t+1)%2 free)
//             [2] issue tile t+1's K, V -> stage (t+1)%2
//             [3] S = Q K^T, dP = dO V^T          (16 x 64 per warp)
//             [4] P = 2^(S scale log2e - lse2), 0 for padded keys (and for the pairs the
//                 token mask hides, on a tile it cuts); dS = P (dP - delta)
//             (a tile the token mask hides from all 64 rows skips [3]-[5])
//             [5] dQ += dS K                      (dS straight from the accumulators)
//   epilogue  [6] dQ * scale -> 16-bit -> smem (Q's tile) -> 16-byte stores of rows < S_q
//                 (zeros for a query block that lists no KV block)
//
// Packed batches (SPEC 4; kPacked): the grid has N_q_max * block / 64 row tiles per sequence
// (shapes only); a CTA whose rows start at or past its sequence's end exits at once. Rows, keys
// and the band are the sequence's (CtaSeq, kept in registers: this kernel has room), q0 / k0
// added where q, dO, k, v, dq are addressed, the stats at packed_stat_row0 (bsa_packed_rows.hpp).
#pragma once

#include <cstdint>

#include "sm80/bsa_backward_kernel.cuh"

namespace sa::portable {

template <int kHeadDim_, class Element_, bool kPacked_ = false>
struct BwdDqKernelTraits {
  using Element = Element_;
  static constexpr bool kPacked = kPacked_;
  static constexpr int kBlockM = 64;  // query rows per CTA
  static constexpr int kBlockN = 64;  // keys per K/V tile
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kNWarps = 4;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kSTiles = kBlockN / 8;    // n8 tiles of S per warp
  static constexpr int kDTiles = kHeadDim / 8;   // n8 tiles of dQ per warp
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kRowChunks = kRowBytes / 16;
  static constexpr int kCopyRows = kNThreads / kRowChunks;
  static constexpr int kTileBytes = kBlockM * kRowBytes;  // == kBlockN * kRowBytes
  static constexpr int kOffQ = 0;
  static constexpr int kOffDo = kTileBytes;
  static constexpr int kOffK = 2 * kTileBytes;  // 2 stages
  static constexpr int kOffV = 4 * kTileBytes;  // 2 stages
  static constexpr int kSmemBytes = 6 * kTileBytes;

  static_assert(kBlockM == kBlockN, "Q and K/V tiles share the tile size");
  static_assert(kCopyRows % 8 == 0 && kBlockM % kCopyRows == 0, "whole copy passes");
};

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 2)
    bsa_backward_dq_kernel(const __grid_constant__ BsaBwdParams p) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kSTiles = Traits::kSTiles;
  constexpr int kDTiles = Traits::kDTiles;
  constexpr int kRowBytes = Traits::kRowBytes;
  constexpr int kRowChunks = Traits::kRowChunks;
  constexpr int kCopyRows = Traits::kCopyRows;
  constexpr int kTileBytes = Traits::kTileBytes;

  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t s_base = sm80::smem_address(smem);
  const uint32_t s_q = s_base + Traits::kOffQ;
  const uint32_t s_do = s_base + Traits::kOffDo;
  const uint32_t s_k = s_base + Traits::kOffK;
  const uint32_t s_v = s_base + Traits::kOffV;

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int r0 = blockIdx.x * kBlockM;  // first query row
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int hk = h / p.group;
  const int m = r0 / p.block;           // query block
  // The CTA's rows are [0, sq_lim) of its sequence (packed) or batch entry.
  CtaSeq seq{};
  int sq_lim = 0, mask_lo = 0, mask_hi = 0;  // packed only (dense: p.Sq and p's band)
  if constexpr (Traits::kPacked) {
    seq = cta_seq(p.meta, p.dims, b);
    if (r0 >= seq.sq) return;  // CTA-uniform, before any barrier
    sq_lim = seq.sq;
    mask_lo = seq.mask_lo;
    mask_hi = seq.mask_hi;
  }
  const int count = p.meta.count(b, h, m);

  const int copy_row = tid / kRowChunks;
  const int copy_chunk = tid % kRowChunks;
  const uint32_t copy_smem = swizzled_offset<kRowBytes>(copy_row, copy_chunk);

  const Element* k_base = static_cast<const Element*>(p.k.data);
  const Element* v_base = static_cast<const Element*>(p.v.data);
  int64_t k_thread = b * p.k.sb + hk * p.k.sh + copy_row * p.k.ss + copy_chunk * 8;
  int64_t v_thread = b * p.v.sb + hk * p.v.sh + copy_row * p.v.ss + copy_chunk * 8;
  if constexpr (Traits::kPacked) {  // sb is 0; the sequence's first key by the row
    k_thread += static_cast<int64_t>(seq.k0) * p.k.ss;
    v_thread += static_cast<int64_t>(seq.k0) * p.v.ss;
  }

  // KV block of a slot and its valid keys (never past S_kv; packed: the sequence's, 0 past its
  // end).
  auto block_at = [&](int slot, int& blk, int& len) {
    blk = p.meta.q2k_index.at(b, h, m, slot);
    if constexpr (Traits::kPacked)
      len = cta_block_len(p.meta, p.dims, b, blk, seq);
    else
      len = min(p.meta.block_len(b, blk, p.dims), p.Skv - blk * p.block);
  };
  // Keys [key0, key0 + valid) -> stage; the rest zero-filled.
  auto load_kv_tile = [&](int key0, int valid, int stage) {
    copy_kv_rows<kBlockN, kCopyRows, kRowBytes>(
        s_k + stage * kTileBytes + copy_smem, s_v + stage * kTileBytes + copy_smem,
        k_base + (k_thread + key0 * p.k.ss), v_base + (v_thread + key0 * p.v.ss), p.k.ss, p.v.ss,
        k_base, v_base, copy_row, valid);
  };

  const int lrow = lane & 7;
  const int sel8 = (lane >> 3) & 1;
  const int sel16 = lane >> 4;
  const int g = lane >> 2;
  const int t4 = lane & 3;
  const int wrow = warp * 16;  // the warp's first row in the tile

  // Per-thread fragment offsets (bwd::frag_offset), indexed by the low chunk 2u:
  //   qa  A of S, dP (Q, dO):  rows wrow + 8 sel8 + lrow, chunk 2 kk + sel16
  //   kb  B of S, dP (K, V):   rows 16 np + 8 sel16 + lrow, chunk 2 kk + sel8
  //   kt  B of dQ (K, .trans): rows 16 kk + 8 sel8 + lrow, chunk 2 dp + sel16
  uint32_t off_qa[4], off_kb[4], off_kt[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    off_qa[u] = bwd::frag_offset<kRowBytes>(wrow + 8 * sel8 + lrow, 2 * u + sel16, lrow);
    off_kb[u] = bwd::frag_offset<kRowBytes>(8 * sel16 + lrow, 2 * u + sel8, lrow);
    off_kt[u] = bwd::frag_offset<kRowBytes>(8 * sel8 + lrow, 2 * u + sel16, lrow);
  }

  float acc[kDTiles][4];
#pragma unroll
  for (int j = 0; j < kDTiles; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[j][c] = 0.f;

  if (count > 0) {
    // [0] Q, dO (rows past S_q zero-filled) and the first tile.
    {
      const Element* q_base = static_cast<const Element*>(p.q.data);
      const Element* do_base = static_cast<const Element*>(p.dout.data);
      if constexpr (Traits::kPacked) {
        q_base += static_cast<int64_t>(seq.q0) * p.q.ss;
        do_base += static_cast<int64_t>(seq.q0) * p.dout.ss;
      }
#pragma unroll
      for (int i = 0; i < kBlockM / kCopyRows; ++i) {
        const int r = r0 + copy_row + i * kCopyRows;
        const bool ok = r < (Traits::kPacked ? sq_lim : p.Sq);
        const Element* qs = ok ? q_base + (b * p.q.sb + h * p.q.sh + r * p.q.ss + copy_chunk * 8)
                               : static_cast<const Element*>(p.q.data);
        const Element* ds = ok ? do_base + (b * p.dout.sb + h * p.dout.sh + r * p.dout.ss +
                                            copy_chunk * 8)
                               : static_cast<const Element*>(p.dout.data);
        sm80::cp_async_16(s_q + copy_smem + i * kCopyRows * kRowBytes, qs, ok);
        sm80::cp_async_16(s_do + copy_smem + i * kCopyRows * kRowBytes, ds, ok);
      }
    }
    int cur_block, cur_len;
    block_at(0, cur_block, cur_len);
    load_kv_tile(cur_block * p.block, min(cur_len, kBlockN), 0);
    sm80::cp_async_commit();
    int next_block = 0, next_len = 0;  // slot + 1's, read one slot ahead
    if (count > 1) block_at(1, next_block, next_len);

    int64_t stats;
    if constexpr (Traits::kPacked)
      stats = h * static_cast<int64_t>(p.Sq_pad) + packed_stat_row0(b, seq.q0, p.block) + r0 +
              wrow + g;
    else
      stats = (static_cast<int64_t>(b) * p.Hq + h) * p.Sq_pad + r0 + wrow + g;
    const float lse2[2] = {p.lse2[stats], p.lse2[stats + 8]};
    const float delta[2] = {p.delta[stats], p.delta[stats + 8]};

    int slot = 0, sub = 0, stage = 0;
#pragma unroll 1
    while (true) {
      const int valid = min(cur_len - sub * kBlockN, kBlockN);  // >= 1
      const bool next_in_block = (sub + 1) * kBlockN < cur_len;
      const bool next_slot = !next_in_block && slot + 1 < count;
      // [1]
      sm80::cp_async_wait<0>();
      __syncthreads();
      // [2]
      if (next_in_block) {
        load_kv_tile(cur_block * p.block + (sub + 1) * kBlockN,
                     min(cur_len - (sub + 1) * kBlockN, kBlockN), stage ^ 1);
      } else if (next_slot) {
        load_kv_tile(next_block * p.block, min(next_len, kBlockN), stage ^ 1);
      }
      sm80::cp_async_commit();

      const uint32_t k_tile = s_k + stage * kTileBytes;
      const uint32_t v_tile = s_v + stage * kTileBytes;

      // The token mask against the CTA's rows (CTA-uniform).
      const int tile_key0 = cur_block * p.block + sub * kBlockN;
      MaskClass cls = MaskClass::kInside;
      if constexpr (Traits::kPacked) {
        if (p.mask_on)
          cls = bwd_mask_class_seq(seq, r0, kBlockM, tile_key0, valid);
      } else {
        cls = p.mask_on ? bwd_mask_class(p, r0, kBlockM, tile_key0, valid) : MaskClass::kInside;
      }
      if (cls != MaskClass::kOutside) {
        // [3] S = Q K^T, dP = dO V^T.
        float s[kSTiles][4], dp[kSTiles][4];
  #pragma unroll
        for (int j = 0; j < kSTiles; ++j)
  #pragma unroll
          for (int c = 0; c < 4; ++c) s[j][c] = dp[j][c] = 0.f;
  #pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
          uint32_t a[4];
          sm80::ldmatrix_x4(s_q + off_qa[kk % 4] + (kk / 4) * 128, a);
  #pragma unroll
          for (int np = 0; np < kSTiles / 2; ++np) {
            uint32_t kb[4];
            sm80::ldmatrix_x4(k_tile + off_kb[kk % 4] + (np * 16 * kRowBytes + (kk / 4) * 128), kb);
            sm80::mma_16816<Element>(s[2 * np], a, kb[0], kb[1]);
            sm80::mma_16816<Element>(s[2 * np + 1], a, kb[2], kb[3]);
          }
        }
  #pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
          uint32_t a[4];
          sm80::ldmatrix_x4(s_do + off_qa[kk % 4] + (kk / 4) * 128, a);
  #pragma unroll
          for (int np = 0; np < kSTiles / 2; ++np) {
            uint32_t vb[4];
            sm80::ldmatrix_x4(v_tile + off_kb[kk % 4] + (np * 16 * kRowBytes + (kk / 4) * 128), vb);
            sm80::mma_16816<Element>(dp[2 * np], a, vb[0], vb[1]);
            sm80::mma_16816<Element>(dp[2 * np + 1], a, vb[2], vb[3]);
          }
        }

        // [4] dS (in s). On a tile the token mask cuts, key - query of (row wrow + g + 8 half,
        // column 8 j + 2 t4 + (c & 1)) is dbase - 8 half + 8 j + (c & 1).
        const bool band = cls == MaskClass::kPartial;
        const int dbase = tile_key0 - (r0 + wrow + g) + 2 * t4;
  #pragma unroll
        for (int j = 0; j < kSTiles; ++j) {
  #pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int half = c / 2;
            float x = exp2_prob(fmaf(s[j][c], p.scale_log2, -lse2[half]));
            if (8 * j + 2 * t4 + (c & 1) >= valid) x = 0.f;
            if (band) {
              const int d = dbase - 8 * half + 8 * j + (c & 1);
              if constexpr (Traits::kPacked) {
                if (d < mask_lo || d > mask_hi) x = 0.f;
              } else {
                if (d < p.mask_lo || d > p.mask_hi) x = 0.f;
              }
            }
            s[j][c] = x * (dp[j][c] - delta[half]);
          }
        }

        // [5] dQ += dS K: A fragments from the dS accumulators, K by ldmatrix.trans.
  #pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
          uint32_t a[4];
          a[0] = pack2<Element>(s[2 * kk][0], s[2 * kk][1]);
          a[1] = pack2<Element>(s[2 * kk][2], s[2 * kk][3]);
          a[2] = pack2<Element>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
          a[3] = pack2<Element>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  #pragma unroll
          for (int dp2 = 0; dp2 < kDTiles / 2; ++dp2) {
            uint32_t kb[4];
            sm80::ldmatrix_x4_trans(
                k_tile + off_kt[dp2 % 4] + (kk * 16 * kRowBytes + (dp2 / 4) * 128), kb);
            sm80::mma_16816<Element>(acc[2 * dp2], a, kb[0], kb[1]);
            sm80::mma_16816<Element>(acc[2 * dp2 + 1], a, kb[2], kb[3]);
          }
        }
      }  // cls != kOutside

      if (next_in_block) {
        ++sub;
      } else if (next_slot) {
        ++slot;
        sub = 0;
        cur_block = next_block;
        cur_len = next_len;
        if (slot + 1 < count) block_at(slot + 1, next_block, next_len);
      } else {
        break;
      }
      stage ^= 1;
    }
  }

  // [6] Epilogue: every warp is done with Q's tile (and no copy is in flight) before it stages
  // the output.
  sm80::cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = wrow + 8 * half + g;
#pragma unroll
    for (int j = 0; j < kDTiles; ++j) {
      *reinterpret_cast<uint32_t*>(smem + Traits::kOffQ + swizzled_offset<kRowBytes>(r, j) +
                                   4 * t4) =
          pack2<Element>(acc[j][2 * half] * p.scale, acc[j][2 * half + 1] * p.scale);
    }
  }
  __syncthreads();
  Element* dq = static_cast<Element*>(p.dq.data) + b * p.dq.sb + h * p.dq.sh;
  if constexpr (Traits::kPacked) dq += static_cast<int64_t>(seq.q0) * p.dq.ss;
#pragma unroll
  for (int i = 0; i < kBlockM / kCopyRows; ++i) {
    const int r = r0 + copy_row + i * kCopyRows;
    if (r < (Traits::kPacked ? sq_lim : p.Sq)) {
      *reinterpret_cast<uint4*>(dq + r * p.dq.ss + copy_chunk * 8) =
          *reinterpret_cast<const uint4*>(smem + Traits::kOffQ + copy_smem +
                                          i * kCopyRows * kRowBytes);
    }
  }
}

}  // namespace sa::portable
