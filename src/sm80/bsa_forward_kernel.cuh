// The portable BSA forward kernel (host side: bsa_forward.cu): mma.sync m16n8k16, ldmatrix,
// cp.async (sm80+). Device code only; bsa_forward.cu instantiates it.
//
// A CTA owns query block m (kBlockM = block rows) of one (batch b, query head h); its 4 warps own
// kBlockM / 4 rows each. It walks the KV blocks listed for m in slot order as 64-key tiles: a
// 128-key block is two tiles, a tile with no valid key is skipped, a tile with some padded keys
// (block_len or S_kv) has them masked; full tiles are never masked.
//
// Token masks (SPEC 4; key s visible to query i iff mask_lo <= s - i <= mask_hi): the list
// stager trims each listed block to the keys that some row of the CTA sees (one contiguous
// range: consecutive rows' bands overlap) and drops a block with none, so blocks entirely
// outside are never loaded. Each warp then classifies each sub-tile against its own rows: inside
// (no mask math), partial (the band applied per element, [4]) or outside (skipped).
//
//   prologue   [0] Q -> smem (zero-filled past S_q); the block list (first key and key count of
//                  up to kListChunk slots, compacted past hidden blocks) -> smem; tile 0's K and
//                  V -> stage 0
//   tile t     [1] wait for tile t's K/V; barrier (stage t%2 is full, stage (t+1)%2 is free)
//              [2] issue tile t+1's K/V loads into stage (t+1)%2 (a whole tile of math to land)
//              per sub-tile of kSubN keys (64, or 32 for 32-row warps with D = 128):
//              [3] S = Q K^T                  Q, K fragments by ldmatrix, fp32 accumulators
//              [4] mask keys >= valid          only on partial (sub-)tiles; the token mask's
//                                              band only on sub-tiles it cuts
//              [5] online softmax              row max, P = 2^(x - max), row sums; O *= alpha
//                                              (skipped when no row max of the warp moved)
//              [6] O += P V                    P from registers, V by ldmatrix.trans
//   epilogue   [7] O / rowsum -> bf16/fp16 -> smem (Q's tile) -> 16-byte stores of rows < S_q;
//                  LSE = ln(rowsum) + max for rows < S_q (-inf and O = 0 for an empty row)
//
// Packed batches (SPEC 4): the CTA works on sequence b (CtaSeq, bsa_cta_seq.cuh) in its local
// coordinates: rows, keys and the band are the sequence's own, and its first tokens q0 / k0 are
// added only where Q, K, V, O and lse are addressed (lse by the global token q0 + row). A CTA
// whose query block starts at or past the sequence's end exits before anything else (the grid has
// N_q_max blocks per sequence). The sequence lives in shared memory, not registers, across the
// tile loop. A dense batch runs the same code with q0 = k0 = 0.
//
// Memory safety: Q rows >= sq and K/V rows >= the tile's valid keys are never read (cp.async
// zero fill), so padded keys contribute exactly 0 even when their memory holds NaN.
#pragma once

#include <cstdint>

#include "common/problem.hpp"
#include "sm80/bsa_cta_seq.cuh"
#include "sm80/kernel_traits.hpp"
#include "sm80/kv_tile_copy.cuh"
#include "sm80/sm80_primitives.hpp"
#include "sm80/softmax.hpp"

namespace sa::portable {

struct BsaFwdParams {
  Bhsd q, k, v, o;          // [B, H, S, D] by BHSD-ordered element strides (k, v: H = H_kv)
  float* lse;               // [B, H_q, S_q]
  int64_t lse_stride[3];
  BsaDims dims;
  BsaMeta meta;
  int32_t block;
  int32_t group;            // query heads per KV head
  float scale_log2;         // scale * log2(e)
  float masked_score;       // raw score of a padded key: mask_value(scale_log2)
  int32_t mask_on;          // nonzero: a token mask; key s visible to query i iff
                            //   lo <= s - i <= hi, the band of the CTA's sequence (CtaSeq)
};

// The block list of a CTA's query block, staged in shared memory kChunk slots at a time, thread i
// reading slot first + i: the keys the CTA walks for that slot, as (first key, key count). That is
// the block's valid keys (block_len, never past S_kv), trimmed under a token mask to the range
// that some row of the CTA sees; slots with no key (past the row's count, or hidden) are dropped
// and the rest compacted in slot order. The number staged goes to s_warp_count[kWarps] and the
// slot after the chunk to s_warp_count[kWarps + 1] (kept in shared memory rather than in
// registers across the tile loop). Only the first count entries of a row are read (SPEC 1).
// Contains two barriers: every thread calls it, after a barrier that ends all reads of the
// previous chunk.
template <int kChunk, int kWarps, int kBlockM>
__device__ __forceinline__ void stage_block_list(const BsaFwdParams& p, const CtaSeq& seq, int b,
                                                int h, int m, int count, int first, int* s_key0,
                                                int* s_len, int* s_warp_count) {
  static_assert(kChunk == kWarps * 32, "a thread per slot");
  const int i = threadIdx.x;
  const int slot = first + i;
  int key0 = 0, len = 0;
  if (slot < count) {
    const int n = p.meta.q2k_index.at(b, h, m, slot);
    key0 = n * p.block;
    len = cta_block_len(p.meta, p.dims, b, n, seq);
    if (p.mask_on) {
      // Rows [r0, r1] see keys [r0 + lo, r1 + hi] between them (int64: the sums may pass int32).
      const int64_t r0 = static_cast<int64_t>(m) * kBlockM;
      const int64_t r1 = min(r0 + kBlockM, static_cast<int64_t>(seq.sq)) - 1;
      const int64_t first_key = max(static_cast<int64_t>(key0), r0 + seq.mask_lo);
      const int64_t end_key = min(static_cast<int64_t>(key0) + len, r1 + seq.mask_hi + 1);
      key0 = static_cast<int>(first_key);
      len = first_key < end_key ? static_cast<int>(end_key - first_key) : 0;
    }
  }
  const bool keep = len > 0;
  const unsigned ballot = __ballot_sync(0xffffffffu, keep);
  const int lane = i % 32, warp = i / 32;
  if (lane == 0) s_warp_count[warp] = __popc(ballot);
  __syncthreads();
  int before = 0, total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const int c = s_warp_count[w];
    before += w < warp ? c : 0;
    total += c;
  }
  if (keep) {
    const int at = before + __popc(ballot & ((1u << lane) - 1u));
    s_key0[at] = key0;
    s_len[at] = len;
  }
  if (i == 0) {
    s_warp_count[kWarps] = total;
    s_warp_count[kWarps + 1] = first + kChunk;
  }
  __syncthreads();
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 2)
    bsa_forward_kernel(const __grid_constant__ BsaFwdParams p) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kWarpRows = Traits::kWarpRows;
  constexpr int kMTiles = Traits::kMTiles;
  constexpr int kSTiles = Traits::kSTiles;
  constexpr int kOTiles = Traits::kOTiles;
  constexpr int kRowBytes = Traits::kRowBytes;
  constexpr int kRowChunks = Traits::kRowChunks;
  constexpr int kCopyRows = Traits::kCopyRowsPerPass;
  constexpr int kKvTileBytes = Traits::kKvTileBytes;
  constexpr int kListChunk = Traits::kListChunk;
  constexpr int kSubN = Traits::kSubN;

  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t s_q = sm80::smem_address(smem);  // also the output staging tile
  const uint32_t s_k = s_q + Traits::kQBytes;     // kStages K tiles
  const uint32_t s_v = s_k + Traits::kStages * kKvTileBytes;
  int* s_list_key0 = reinterpret_cast<int*>(smem + Traits::kListOffset);
  int* s_list_len = s_list_key0 + kListChunk;
  int* s_warp_count = s_list_len + kListChunk;
  const int* s_staged = s_warp_count + Traits::kNWarps;         // entries in the staged chunk
  const int* s_chunk_end = s_warp_count + Traits::kNWarps + 1;  // slots read so far
  CtaSeq* s_seq = reinterpret_cast<CtaSeq*>(smem + Traits::kSeqOffset);

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int m = blockIdx.x;
  const int row0 = m * kBlockM;  // first query row
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int hk = h / p.group;

  // The CTA's sequence; a query block past its end has nothing to do (uniform exit, before any
  // barrier). Thread 0 keeps it in shared memory for the tile loop and the epilogue; the first
  // barrier (in stage_block_list) orders that write before any read.
  const CtaSeq seq = cta_seq(p.meta, p.dims, b);
  if (row0 >= seq.sq) return;
  if (tid == 0) *s_seq = seq;

  const Element* q_head = static_cast<const Element*>(p.q.data) + b * p.q.sb + h * p.q.sh +
                          static_cast<int64_t>(seq.q0) * p.q.ss;
  const Element* k_base = static_cast<const Element*>(p.k.data);
  const Element* v_base = static_cast<const Element*>(p.v.data);

  // Copy role: 16-byte chunk copy_chunk of rows copy_row + i * kCopyRows.
  const int copy_row = tid / kRowChunks;
  const int copy_chunk = tid % kRowChunks;
  const uint32_t copy_smem = swizzled_offset<kRowBytes>(copy_row, copy_chunk);
  // Element offsets of this thread's first copy row of K and V at key 0 of the KV head.
  const int64_t k_thread = b * p.k.sb + hk * p.k.sh +
                           (static_cast<int64_t>(seq.k0) + copy_row) * p.k.ss + copy_chunk * 8;
  const int64_t v_thread = b * p.v.sb + hk * p.v.sh +
                           (static_cast<int64_t>(seq.k0) + copy_row) * p.v.ss + copy_chunk * 8;

  // [0] Q tile (rows past the sequence's sq zero-filled, never read from global memory).
#pragma unroll
  for (int i = 0; i < kBlockM / kCopyRows; ++i) {
    const int row = row0 + copy_row + i * kCopyRows;
    const bool ok = row < seq.sq;
    const Element* src = ok ? q_head + row * p.q.ss + copy_chunk * 8 : q_head;
    sm80::cp_async_16(s_q + copy_smem + i * kCopyRows * kRowBytes, src, ok);
  }

  // K and V rows [key0, key0 + valid) -> stage; the tile's other rows are zero-filled (and their
  // source address is the tensor base, never dereferenced).
  auto load_kv_tile = [&](int key0, int valid, int stage) {
    copy_kv_rows<kBlockN, kCopyRows, kRowBytes>(
        s_k + stage * kKvTileBytes + copy_smem, s_v + stage * kKvTileBytes + copy_smem,
        k_base + (k_thread + key0 * p.k.ss), v_base + (v_thread + key0 * p.v.ss), p.k.ss, p.v.ss,
        k_base, v_base, copy_row, valid);
  };

  // The block list's first chunk that stages an entry (under a mask, whole chunks can be
  // hidden); then the first tile (entry 0, its first 64 keys).
  const int count = p.meta.count(b, h, m);
  int first_slot = 0;
  do {
    stage_block_list<kListChunk, Traits::kNWarps, kBlockM>(
        p, seq, b, h, m, count, first_slot, s_list_key0, s_list_len, s_warp_count);
    first_slot += kListChunk;
  } while (*s_staged == 0 && first_slot < count);
  int cur_key0 = s_list_key0[0];  // first key of the current entry
  int cur_len = s_list_len[0];    // its keys (>= 1 when an entry is staged)
  const bool any_entry = *s_staged > 0;
  if (any_entry) load_kv_tile(cur_key0, min(cur_len, kBlockN), 0);
  sm80::cp_async_commit();

  // ldmatrix roles (see sm80_primitives.hpp): lane l addresses row l % 8 of matrix l / 8.
  // Fragment rows are (multiple of 8) + lrow, so their swizzle phase is lrow, and the chunk of a
  // k16 (or d16) step u is 2u + sel with sel in {0, 1}: (2u + sel) ^ lrow =
  // 8 * (u / 4) + ((2 * (u % 4)) ^ sel ^ lrow). So four per-thread offsets (one per u % 4) plus
  // compile-time immediates address every fragment, instead of one register per (step, tile).
  const int lrow = lane & 7;
  const int sel8 = (lane >> 3) & 1;
  const int sel16 = lane >> 4;
  uint32_t q_off[4], k_off[4], v_off[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    // Q (A operand): matrices (rows +0 / +8) x (d +0 / +8).
    q_off[u] = (warp * kWarpRows + sel8 * 8 + lrow) * kRowBytes + (((2 * u) ^ sel16 ^ lrow) << 4);
    // K (B operand of S): matrices (d +0 / +8) x (keys +0 / +8).
    k_off[u] = (sel16 * 8 + lrow) * kRowBytes + (((2 * u) ^ sel8 ^ lrow) << 4);
    // V (B operand of O, transposed): matrices (keys +0 / +8) x (d +0 / +8).
    v_off[u] = (sel8 * 8 + lrow) * kRowBytes + (((2 * u) ^ sel16 ^ lrow) << 4);
  }
  // A fragment of Q: m16 tile mi, k16 step kk = 4 * line + u.
  auto q_frag = [&](int mi, int line, int u) {
    return s_q + q_off[u] + mi * 16 * kRowBytes + line * 128;
  };
  // B fragments of K for keys 16np..16np+15 (two n8 tiles), k16 step kk = 4 * line + u.
  auto k_frag = [&](uint32_t tile, int np, int line, int u) {
    return tile + k_off[u] + np * 16 * kRowBytes + line * 128;
  };
  // B fragments of V for keys 16kk..16kk+15, d 16dp..16dp+15 (two n8 tiles).
  auto v_frag = [&](uint32_t tile, int kk, int dp) {
    return tile + v_off[dp % 4] + kk * 16 * kRowBytes + (dp / 4) * 128;
  };

  float acc_o[kMTiles][kOTiles][4];
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int j = 0; j < kOTiles; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc_o[mi][j][c] = 0.f;
  OnlineSoftmax<kMTiles> softmax;
  softmax.init();

  if (any_entry) {
    int pos = 0;    // of the current entry in the staged chunk
    int tile = 0;   // 64-key tile of the current entry
    int stage = 0;  // K/V buffer holding the current tile
    while (true) {
      const int valid = min(cur_len - tile * kBlockN, kBlockN);  // >= 1
      const bool next_in_block = (tile + 1) * kBlockN < cur_len;
      bool restaged = false;
      if (!next_in_block && pos + 1 == *s_staged) {
        const uint3 cta = sm80::cta_index();
        const int row_count = p.meta.count(cta.z, cta.y, cta.x);
        if (*s_chunk_end < row_count) {
          // The walk leaves the staged chunk (rows of more than kListChunk blocks): stage the
          // next one that has an entry, between barriers (the previous iteration's last step
          // read the old chunk). Uniform: the shared counts are the same in every thread.
          do {
            const int first = *s_chunk_end;
            __syncthreads();
            stage_block_list<kListChunk, Traits::kNWarps, kBlockM>(
                p, *s_seq, cta.z, cta.y, cta.x, row_count, first, s_list_key0, s_list_len,
                s_warp_count);
          } while (*s_staged == 0 && *s_chunk_end < row_count);
          restaged = true;
        }
      }
      const int next_pos = restaged ? 0 : pos + 1;
      const bool next_slot = !next_in_block && next_pos < *s_staged;
      int next_key0 = 0, next_len = 0;
      if (next_slot) {
        next_key0 = s_list_key0[next_pos];
        next_len = s_list_len[next_pos];
      }

      // [1] tile t landed (and is visible to all threads); everyone is done with stage t-1.
      sm80::cp_async_wait<0>();
      __syncthreads();
      // [2] prefetch tile t+1: the current block's next tile, or the next block's first.
      if (next_in_block || next_slot) {
        const int key0 = next_in_block ? cur_key0 + (tile + 1) * kBlockN : next_key0;
        const int keys = next_in_block ? cur_len - (tile + 1) * kBlockN : next_len;
        load_kv_tile(key0, min(keys, kBlockN), stage ^ 1);
      }
      sm80::cp_async_commit();

      // The tile's math, in sub-tiles of kSubN keys (one online-softmax step each); a sub-tile
      // past the valid keys is skipped. The sub-tile loop stays rolled: the point of sub-tiles is
      // that only one sub-tile's scores are live at a time.
#pragma unroll 1
      for (int sub = 0; sub < kBlockN / kSubN; ++sub) {
        const int sub_valid = valid - sub * kSubN;
        if (sub_valid <= 0) break;
        // The token mask against this warp's rows (warp-uniform; no barrier in this loop, so a
        // warp may skip a sub-tile alone).
        // Recomputed at [4] rather than kept across the GEMM.
        auto mask_class = [&]() {
          const int wr0 = static_cast<int>(blockIdx.x) * kBlockM + warp * kWarpRows;
          const int wr1 = min(wr0 + kWarpRows, s_seq->sq) - 1;
          const int ka = cur_key0 + tile * kBlockN + sub * kSubN;
          const int kz = ka + min(sub_valid, kSubN) - 1;
          return wr1 < wr0 ? MaskClass::kOutside
                           : classify_tile<int>(wr0, wr1, ka, kz, s_seq->mask_lo, s_seq->mask_hi);
        };
        if (p.mask_on && mask_class() == MaskClass::kOutside) continue;
        const uint32_t k_tile = s_k + stage * kKvTileBytes + sub * kSubN * kRowBytes;
        const uint32_t v_tile = s_v + stage * kKvTileBytes + sub * kSubN * kRowBytes;

        // [3] S = Q K^T, k16 steps in groups of 4 (one 128-byte swizzle line of d each).
        float s[kMTiles][kSTiles][4];
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
          for (int j = 0; j < kSTiles; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) s[mi][j][c] = 0.f;
#pragma unroll
        for (int line = 0; line < Traits::kQkSteps / 4; ++line) {
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            uint32_t qa[kMTiles][4];
#pragma unroll
            for (int mi = 0; mi < kMTiles; ++mi) sm80::ldmatrix_x4(q_frag(mi, line, u), qa[mi]);
#pragma unroll
            for (int np = 0; np < kSTiles / 2; ++np) {
              uint32_t kb[4];
              sm80::ldmatrix_x4(k_frag(k_tile, np, line, u), kb);
#pragma unroll
              for (int mi = 0; mi < kMTiles; ++mi) {
                sm80::mma_16816<Element>(s[mi][2 * np], qa[mi], kb[0], kb[1]);
                sm80::mma_16816<Element>(s[mi][2 * np + 1], qa[mi], kb[2], kb[3]);
              }
            }
          }
        }

        // [4] the token mask's band on a sub-tile it cuts (padded keys included), else padded
        // keys of a partial (sub-)tile.
        if (p.mask_on && mask_class() == MaskClass::kPartial) {
          const int wr0 = static_cast<int>(blockIdx.x) * kBlockM + warp * kWarpRows;
          const int ka = cur_key0 + tile * kBlockN + sub * kSubN;
          mask_band(s, ka - wr0, s_seq->mask_lo, s_seq->mask_hi, sub_valid, p.masked_score);
        } else if (sub_valid < kSubN) {
          mask_key_columns(s, sub_valid, p.masked_score);
        }

        // [5] online softmax; rescale what O holds so far, unless no row of the warp got a new
        // maximum (then every alpha is exactly 1).
        float alpha[2 * kMTiles];
        const bool new_max = softmax.update(s, p.scale_log2, alpha);
        if (__any_sync(0xffffffffu, new_max)) scale_rows(acc_o, alpha);

        // [6] O += P V, P's A fragments straight from the S accumulators.
#pragma unroll
        for (int kk = 0; kk < Traits::kPvSteps; ++kk) {
          uint32_t pa[kMTiles][4];
#pragma unroll
          for (int mi = 0; mi < kMTiles; ++mi) {
            pa[mi][0] = pack2<Element>(s[mi][2 * kk][0], s[mi][2 * kk][1]);
            pa[mi][1] = pack2<Element>(s[mi][2 * kk][2], s[mi][2 * kk][3]);
            pa[mi][2] = pack2<Element>(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
            pa[mi][3] = pack2<Element>(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
          }
#pragma unroll
          for (int dp = 0; dp < kOTiles / 2; ++dp) {
            uint32_t vb[4];
            sm80::ldmatrix_x4_trans(v_frag(v_tile, kk, dp), vb);
#pragma unroll
            for (int mi = 0; mi < kMTiles; ++mi) {
              sm80::mma_16816<Element>(acc_o[mi][2 * dp], pa[mi], vb[0], vb[1]);
              sm80::mma_16816<Element>(acc_o[mi][2 * dp + 1], pa[mi], vb[2], vb[3]);
            }
          }
        }
      }

      if (next_in_block) {
        ++tile;
      } else if (next_slot) {
        pos = next_pos;
        tile = 0;
        // Re-read rather than kept in registers across the tile's math.
        cur_key0 = s_list_key0[pos];
        cur_len = s_list_len[pos];
      } else {
        break;
      }
      stage ^= 1;
    }
  }

  // [7] Epilogue. No copy may still be writing shared memory (Q of an empty row list was never
  // waited for) and every warp must be done with it before it is reused for O.
  sm80::cp_async_wait<0>();
  __syncthreads();

  // Values the prologue also derived (rows, copy roles) are re-derived from opaque copies here:
  // otherwise the compiler keeps the prologue's results live across the main loop, and spills.
  const uint3 cta = sm80::cta_index();
  const int out_b = cta.z, out_h = cta.y;
  const int out_tid = sm80::opaque(tid);
  const int out_row0 = cta.x * kBlockM;
  const int out_copy_row = out_tid / kRowChunks;
  const int out_copy_chunk = out_tid % kRowChunks;
  const uint32_t out_copy_smem = swizzled_offset<kRowBytes>(out_copy_row, out_copy_chunk);
  const int out_sq = s_seq->sq;
  const int64_t out_q0 = s_seq->q0;

  float inv_sum[2 * kMTiles], lse[2 * kMTiles];
  softmax.finalize(inv_sum, lse);
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp * kWarpRows + mi * 16 + half * 8 + g;  // within the CTA
      const float inv = inv_sum[2 * mi + half];
#pragma unroll
      for (int j = 0; j < kOTiles; ++j) {
        const uint32_t packed =
            pack2<Element>(acc_o[mi][j][2 * half] * inv, acc_o[mi][j][2 * half + 1] * inv);
        *reinterpret_cast<uint32_t*>(smem + swizzled_offset<kRowBytes>(row, j) + 4 * t) = packed;
      }
      if (t == 0 && out_row0 + row < out_sq) {
        p.lse[out_b * p.lse_stride[0] + out_h * p.lse_stride[1] +
              (out_q0 + out_row0 + row) * p.lse_stride[2]] = lse[2 * mi + half];
      }
    }
  }
  __syncthreads();

  Element* o_head =
      static_cast<Element*>(p.o.data) + out_b * p.o.sb + out_h * p.o.sh + out_q0 * p.o.ss;
#pragma unroll
  for (int i = 0; i < kBlockM / kCopyRows; ++i) {
    const int row = out_row0 + out_copy_row + i * kCopyRows;
    if (row < out_sq) {
      const uint4 chunk =
          *reinterpret_cast<const uint4*>(smem + out_copy_smem + i * kCopyRows * kRowBytes);
      *reinterpret_cast<uint4*>(o_head + row * p.o.ss + out_copy_chunk * 8) = chunk;
    }
  }
}

}  // namespace sa::portable
