// The score tile that the portable indexer's dense-score and fused top-k kernels share (SPEC 5):
//
//   I[t, s] = sum_j w[t, j] * relu(scale_I * <q_I[t, j], k_I[s]>)
//
// computed on mma.sync m16n8k16 tensor cores (bf16 in, fp32 accumulate), 64 keys x 64
// (query, head) columns per warp per step.
//
// Work split. A CTA of kWarps = 4 warps owns a block of kBlockQ queries; warp w owns the
// kQueriesPerWarp = 64 / H_I queries [w * QPW, (w + 1) * QPW) of the block, i.e. 64 columns
// (query, head) of q_I, which it alone reads. Key tiles of 64 keys stream through kStages shared
// buffers (cp.async, zero-filled past S_kv); every warp multiplies the whole tile by its columns:
//
//   S^T[key, col] = k_I[key] . q_I[col]      A = key tile (64 x 128, 4 m16 tiles)
//                                            B = the warp's q_I columns (64 x 128, 8 n8 tiles)
//
// Keys are the M dimension so that the sum over heads is a sum over columns, which a thread holds
// in registers: per (key, query) a thread adds its 2 columns of every n8 tile of the query
// (relu(acc) * w' with w' = |scale_I| * w in shared memory), then the 4 lanes of a quad finish the
// sum by a reduce-scatter (6 shuffles per query instead of 16): lane t4 ends with the keys of
// m16 tile t4. Per warp and tile: 8 k16 steps x (4 B + 4 A ldmatrix.x4, 32 MMAs) = 64 ldmatrix
// per 256 MMAs.
//
// Bitwise reproducibility. The score of (t, s) is a function of q_I[t], w[t], k_I[s] alone, not of
// the position of t or s in a tile: every key's columns are summed by the same lanes in the same
// order ((p0 + p2) + (p1 + p3) over the quad, each p over n8 tiles, then columns, in order). So
// equal keys give bitwise equal scores (ties are real ties), and the top-k kernel ranks exactly
// the values the score kernel writes.
//
// Registers per thread: the accumulator 4 x 8 x 4 = 128 fp32, B fragments 16, A 4, addresses.
//
// Shared memory (bytes):
//   q_I   kWarps x 64 rows x 256          = 65,536  (row = (query, head); 16-byte chunk c of row r
//                                                    at c ^ (r % 8): conflict-free ldmatrix)
//   k_I   kStages x 64 rows x 256         = 32,768  (same swizzle)
//   w'    kWarps x 64 fp32                =  1,024  (|scale_I| * w; 0 for queries past S_q)
//   range kBlockQ x int2                  = 32..128 (begin, end), clamped (IndexerMeta)
//   stage kWarps x QPW x 64 fp32          =  1,024 x QPW (a warp's reduced scores of one tile)
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "common/indexer_problem.hpp"
#include "cuda/dsa_mma.hpp"

namespace sa::portable::indexer {

// Kernel arguments of the score tile: typed pointers and element strides.
struct ScoreParams {
  const __nv_bfloat16* q;  // [S_q, H_I, 128]: (t, j, d) at t * q_ss + j * q_sh + d
  const __nv_bfloat16* k;  // [S_kv, 128]: key s at s * k_ss
  const float* w;          // [S_q, H_I]: (t, j) at t * w_ss + j * w_sh
  int64_t q_ss, q_sh, k_ss, w_ss, w_sh;
  IndexerDims dims;
  IndexerMeta meta;  // k_start, k_end (the range rule: IndexerMeta::range_begin / range_end)
  float scale;       // scale_I
};

template <class Problem>
ScoreParams make_score_params(const Problem& p) {
  ScoreParams prm{};
  prm.q = static_cast<const __nv_bfloat16*>(p.in.q_I.data);
  prm.k = static_cast<const __nv_bfloat16*>(p.in.k_I.data);
  prm.w = static_cast<const float*>(p.in.w);
  prm.q_ss = p.in.q_I.ss;
  prm.q_sh = p.in.q_I.sh;
  prm.k_ss = p.in.k_I.ss;
  prm.w_ss = p.in.w_stride[0];
  prm.w_sh = p.in.w_stride[1];
  prm.dims = p.dims;
  prm.meta = p.meta;
  prm.scale = p.scale;
  return prm;
}

template <int kHeads_>
struct TileConfig {
  static constexpr int kHeads = kHeads_;            // H_I
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kCols = 64;                  // (query, head) columns per warp
  static constexpr int kQpw = kCols / kHeads;       // queries per warp
  static constexpr int kBlockQ = kWarps * kQpw;     // queries per CTA
  static constexpr int kTileKeys = 64;              // keys per tile
  static constexpr int kStages = 2;
  static constexpr int kRowBytes = 256;             // D_I = 128 bf16
  static constexpr int kNTilesPerQuery = kHeads / 8;

  static constexpr int kQOff = 0;
  static constexpr int kKOff = kQOff + kWarps * kCols * kRowBytes;
  static constexpr int kKStageBytes = kTileKeys * kRowBytes;
  static constexpr int kWOff = kKOff + kStages * kKStageBytes;
  static constexpr int kRangeOff = kWOff + kWarps * kCols * 4;
  static constexpr int kStageOff = kRangeOff + kBlockQ * 8;
  static constexpr int kTileSmemBytes = kStageOff + kWarps * kQpw * kTileKeys * 4;

  static_assert(kHeads == 16 || kHeads == 32 || kHeads == 64, "H_I 16, 32 or 64");
  static_assert(kThreads == 128, "the copy mappings below assume 128 threads");
};

// The CTA's dynamic shared memory.
__device__ __forceinline__ uint8_t* smem_base() {
  extern __shared__ __align__(128) uint8_t indexer_dynamic_smem[];
  return indexer_dynamic_smem;
}

// The clamped range [begin, end) of query t (empty: begin == end == 0); t past S_q: empty.
__device__ __forceinline__ int2 query_range(const ScoreParams& p, int64_t t) {
  if (t >= p.dims.Sq) return make_int2(0, 0);
  const int64_t b = p.meta.range_begin(t, p.dims), e = p.meta.range_end(t, p.dims);
  return e > b ? make_int2(static_cast<int>(b), static_cast<int>(e)) : make_int2(0, 0);
}

// The ranges of the query block starting at q0 into shared memory (plain stores: visible after
// the caller's next __syncthreads).
template <class Cfg>
__device__ __forceinline__ void load_ranges(const ScoreParams& p, int64_t q0, uint8_t* smem) {
  int2* s_range = reinterpret_cast<int2*>(smem + Cfg::kRangeOff);
  for (int i = threadIdx.x; i < Cfg::kBlockQ; i += Cfg::kThreads) s_range[i] = query_range(p, q0 + i);
}

// The columns of the query block starting at q0: cp.async of the q_I rows (zero-filled past S_q;
// the commit group is left open for the caller to close) and w' (plain stores: visible after the
// caller's next __syncthreads).
template <class Cfg>
__device__ __forceinline__ void load_query_block(const ScoreParams& p, int64_t q0, uint8_t* smem) {
  const int tid = threadIdx.x;
  const uint32_t sq = dsa::smem_u32(smem + Cfg::kQOff);
  // Rows r = warp * 64 + col, col = (query in warp) * H_I + head: query q0 + r / H_I.
  // 16 chunks per row; thread tid copies chunk tid % 16 of rows tid / 16 + 8 i.
  const int chunk = tid & 15;
  constexpr int kRows = Cfg::kWarps * Cfg::kCols;
#pragma unroll 4
  for (int r = tid >> 4; r < kRows; r += Cfg::kThreads / 16) {
    const int64_t t = q0 + r / Cfg::kHeads;
    const int j = r % Cfg::kHeads;
    const bool valid = t < p.dims.Sq;
    const __nv_bfloat16* src = valid ? p.q + t * p.q_ss + j * p.q_sh + chunk * 8 : p.q;
    dsa::cp_async_16_zfill(sq + r * Cfg::kRowBytes + ((chunk ^ (r & 7)) << 4), src,
                           valid ? 16 : 0);
  }
  float* s_w = reinterpret_cast<float*>(smem + Cfg::kWOff);
  const float mag = fabsf(p.scale);
  for (int r = tid; r < kRows; r += Cfg::kThreads) {
    const int64_t t = q0 + r / Cfg::kHeads;
    const int j = r % Cfg::kHeads;
    s_w[r] = t < p.dims.Sq ? mag * p.w[t * p.w_ss + j * p.w_sh] : 0.f;
  }
}

// cp.async of the 64 keys starting at s0 into stage `stage` (rows past S_kv zero-filled; nothing
// read there). 16 chunks per row, 8 per thread.
template <class Cfg>
__device__ __forceinline__ void load_key_tile(const ScoreParams& p, int64_t s0, int stage,
                                              uint8_t* smem) {
  const int tid = threadIdx.x;
  const uint32_t sk = dsa::smem_u32(smem + Cfg::kKOff + stage * Cfg::kKStageBytes);
  const int chunk = tid & 15;
#pragma unroll
  for (int i = 0; i < Cfg::kTileKeys / (Cfg::kThreads / 16); ++i) {
    const int r = (tid >> 4) + i * (Cfg::kThreads / 16);
    const int64_t s = s0 + r;
    const bool valid = s < p.dims.Skv;
    const __nv_bfloat16* src = valid ? p.k + s * p.k_ss + chunk * 8 : p.k;
    dsa::cp_async_16_zfill(sk + r * Cfg::kRowBytes + ((chunk ^ (r & 7)) << 4), src,
                           valid ? 16 : 0);
  }
}

// relu(scale_I * a) = |scale_I| * relu(+-a): the sign is applied here, the magnitude is in w'.
__device__ __forceinline__ float relu_signed(float a, bool negative) {
  return fmaxf(negative ? -a : a, 0.f);
}

// One warp's scores of the key tile in `stage` against its 64 columns: on return,
// stage_out[qi * 64 + key] (this warp's staging area) holds I[q0 + warp * QPW + qi, s0 + key] for
// every key of the tile (rows past S_kv hold the score of a zero key: 0), visible to the whole
// warp. Raw values: the caller applies the ranges.
template <class Cfg>
__device__ __forceinline__ void warp_tile_scores(const uint8_t* smem, int stage, bool negative,
                                                 float* stage_out) {
  using Ops = dsa::Mma16<__nv_bfloat16>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3, x = lane & 7;
  const uint32_t k_stage = dsa::smem_u32(smem + Cfg::kKOff + stage * Cfg::kKStageBytes);
  const uint32_t q_warp = dsa::smem_u32(smem + Cfg::kQOff + warp * Cfg::kCols * Cfg::kRowBytes);
  // A (keys): row (lane & 15) of m16 tile mt, chunk 2 kk + (lane >> 4).
  const uint32_t a_lane = k_stage + (lane & 15) * Cfg::kRowBytes;
  const int a_hi = lane >> 4;
  // B (columns): row (lane & 7) + 8 (lane >> 4) of n16 pair np, chunk 2 kk + ((lane >> 3) & 1).
  const uint32_t b_lane = q_warp + ((lane & 7) + 8 * (lane >> 4)) * Cfg::kRowBytes;
  const int b_hi = (lane >> 3) & 1;

  float acc[4][8][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;

#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    uint32_t bf[4][4];
#pragma unroll
    for (int np = 0; np < 4; ++np)
      dsa::ldmatrix_x4(b_lane + np * 16 * Cfg::kRowBytes + (((2 * kk + b_hi) ^ x) << 4), bf[np]);
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      uint32_t af[4];
      dsa::ldmatrix_x4(a_lane + mt * 16 * Cfg::kRowBytes + (((2 * kk + a_hi) ^ x) << 4), af);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        Ops::mma(acc[mt][2 * np], af, bf[np][0], bf[np][1]);
        Ops::mma(acc[mt][2 * np + 1], af, bf[np][2], bf[np][3]);
      }
    }
  }

  // Per thread: keys 16 mt + g + 8 i, columns 8 nt + 2 t4 (+1); query qi owns the n8 tiles
  // [qi H_I / 8, (qi + 1) H_I / 8). One query at a time, so that only its 8 partial sums are live.
  constexpr int kNt = Cfg::kNTilesPerQuery;
  const float* s_w = reinterpret_cast<const float*>(smem + Cfg::kWOff) + warp * Cfg::kCols;
  const bool hi2 = (t4 & 2) != 0, hi1 = (t4 & 1) != 0;
#pragma unroll
  for (int qi = 0; qi < Cfg::kQpw; ++qi) {
    float part[4][2];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) part[mt][0] = part[mt][1] = 0.f;
#pragma unroll
    for (int n = 0; n < kNt; ++n) {
      const int nt = qi * kNt + n;
      const float2 wv = *reinterpret_cast<const float2*>(s_w + 8 * nt + 2 * t4);
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          part[mt][i] = fmaf(relu_signed(acc[mt][nt][2 * i], negative), wv.x, part[mt][i]);
          part[mt][i] = fmaf(relu_signed(acc[mt][nt][2 * i + 1], negative), wv.y, part[mt][i]);
        }
      }
    }
    // Reduce-scatter over the quad: step 1 (partner t4 ^ 2) keeps m16 tiles {0, 1} + 2 (t4 >> 1),
    // step 2 (partner t4 ^ 1) keeps tile t4. Each step adds the two halves of a pair:
    // commutative, so every key's sum is (p0 + p2) + (p1 + p3) bitwise, whichever lane keeps it.
    float r[2][2];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float send = hi2 ? part[m][i] : part[m + 2][i];
        const float keep = hi2 ? part[m + 2][i] : part[m][i];
        r[m][i] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
      }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float send = hi1 ? r[0][i] : r[1][i];
      const float keep = hi1 ? r[1][i] : r[0][i];
      stage_out[qi * Cfg::kTileKeys + 16 * t4 + g + 8 * i] =
          keep + __shfl_xor_sync(0xffffffffu, send, 1);
    }
  }
  __syncwarp();
}

// Whether any query of this warp's has a range that meets keys [s0, s0 + 64).
template <class Cfg>
__device__ __forceinline__ bool warp_meets_tile(const int2* s_range, int warp, int64_t s0) {
  bool meets = false;
#pragma unroll
  for (int qi = 0; qi < Cfg::kQpw; ++qi) {
    const int2 r = s_range[warp * Cfg::kQpw + qi];
    meets |= r.y > r.x && r.x < s0 + Cfg::kTileKeys && r.y > s0;
  }
  return meets;
}

// The union of the CTA's query ranges, [lo, hi) (lo == hi: every range is empty); every thread
// computes it from shared memory (after the barrier that published the ranges).
template <class Cfg>
__device__ __forceinline__ int2 block_span(const int2* s_range) {
  int lo = INT32_MAX, hi = 0;
  for (int i = 0; i < Cfg::kBlockQ; ++i) {
    const int2 r = s_range[i];
    if (r.y > r.x) {
      lo = min(lo, r.x);
      hi = max(hi, r.y);
    }
  }
  return lo < hi ? make_int2(lo, hi) : make_int2(0, 0);
}

}  // namespace sa::portable::indexer
