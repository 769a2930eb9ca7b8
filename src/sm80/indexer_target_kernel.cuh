// The attention target of the portable sparse indexer loss (SPEC 5), per selected slot:
//
//   log A[t, i] = log sum_h exp(scale * <q[t, h], kv[idx[t, i]]> - lse[t, h])
//
// over the heads h whose lse is finite (lse = +inf: the head has no term). One CTA per (token,
// group of 64 heads) writes the group's part, log A_g, for every slot of the active prefix (SPEC
// 2's rule; inactive slots read nothing and hold -inf); the loss kernel adds the groups in log
// space (logaddexp, group order: deterministic) and keeps the slots of K_t.
// Dense mode (kDense): the slots of token t are the keys of its range, slot i = key
// range_begin(t) + i (contiguous rows, no index loads), for the tokens of one slice.
//
// The CTA is the DSA forward's S = Q K^T (dsa_forward_kernel.cuh) without the softmax and P V:
// the token's 64 head rows of q in shared memory (zero rows past H), its selected kv rows
// gathered in chunks of N keys (N = 64 where the device offers ~222 KB of shared memory per
// block, else 32), double-buffered with cp.async, inactive rows zero-filled. 8 warps (rg = w % 2:
// head rows [32 rg, +32); cq = w / 2: keys [cq N / 4, +N / 4)):
//
//   chunk c   [1] wait own cp.async; __syncthreads          stage c % 2 full, the other free
//             [2] gather chunk c + 1 (indices one chunk ahead)
//             [3] S = Q K^T (32 heads x N/4 keys, all D_qk)   warp_mma_abt
//             [4] per key: x_h = S scale log2(e) - lse_h log2(e) over the warp's 32 heads (+inf
//                 lse, rows past H: -inf); m = max_h x_h, l = sum_h 2^(x_h - m) over the 4 heads
//                 of a thread, then the 8 lanes of its column (shuffles over g) -> part[rg][key]
//                 pair barrier (the two warps of one cq, 64 threads, hardware barrier 1 + cq)
//             [5] warp rg = 0 of each cq: log A_g = ln 2 (m + log2 l) of the two row groups
//                 combined (-inf when no head has a term) -> global, slots < the active prefix
//
// The per-key reduction over heads crosses lanes (heads are the MMA's rows) but only once per
// (key, 32 heads): 3 shuffle steps for the max and 3 for the sum per key column of a thread.
//
// Shared memory (bytes, rows of 576 elements = 72 16-byte chunks, swizzled by row as in the DSA
// kernels): Q 64 x 1152 = 73,728; K 2 stages x N x 1152 = 73,728 (N 32) | 147,456 (N 64); the
// lse row of the group (64 fp32, log2 units) and the pair partials (2 x N (m, l) fp32 pairs).
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "common/dsa_device.cuh"
#include "common/indexer_problem.hpp"
#include "cuda/dsa_mma.hpp"
#include "cuda/indexer_loss_driver.hpp"  // TargetParams
#include "sm80/dsa_row_copy.hpp"
#include "sm80/dsa_warp_mma.hpp"

namespace sa::portable::indexer {

template <int kBlockN_>
struct TargetConfig {
  static constexpr int kBlockN = kBlockN_;  // keys per chunk
  static constexpr int kBlockM = 64;        // heads per CTA
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kGroupRows = 32;
  static constexpr int kMTiles = 2;
  static constexpr int kRowChunks = 72;
  static constexpr int kRowBytes = kRowChunks * 16;
  static constexpr int kWarpKeys = kBlockN / 4;
  static constexpr int kSTiles = kWarpKeys / 8;
  static constexpr int kGatherRows = kBlockN / 32;

  static constexpr int kQOff = 0;
  static constexpr int kKOff = kQOff + kBlockM * kRowBytes;
  static constexpr int kKStageBytes = kBlockN * kRowBytes;
  static constexpr int kLseOff = kKOff + 2 * kKStageBytes;
  static constexpr int kPartOff = kLseOff + kBlockM * 4;
  static constexpr int kSmemBytes = kPartOff + 2 * kBlockN * 8;

  static_assert(kBlockN == 32 || kBlockN == 64, "chunks of 32 or 64 keys");
  static_assert(kSTiles == 1 || kSTiles == 2, "K fragments: one ldmatrix (.x2 or .x4) per step");
};

template <class Cfg, bool kDense>
__global__ void __launch_bounds__(Cfg::kThreads, 1) target_kernel(const TargetParams p) {
  using Ops = dsa::Mma16<__nv_bfloat16>;
  constexpr int N = Cfg::kBlockN;
  constexpr int kM = Cfg::kMTiles;
  constexpr int kRowBytes = Cfg::kRowBytes;
  constexpr int kGatherRows = Cfg::kGatherRows;
  const float kInf = INFINITY;
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kLn2 = 0.693147180559945309f;

  uint8_t* smem = dsa::dynamic_smem();
  float* s_lse = reinterpret_cast<float*>(smem + Cfg::kLseOff);    // [64] log2 units
  float2* s_part = reinterpret_cast<float2*>(smem + Cfg::kPartOff);  // [2 row groups][N]
  const uint32_t sq = dsa::smem_u32(smem + Cfg::kQOff);
  const uint32_t sk = dsa::smem_u32(smem + Cfg::kKOff);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rg = warp & 1, cq = warp >> 1;
  const int g = lane >> 2, t4 = lane & 3;
  const int64_t tok = p.tok_begin + blockIdx.x / p.head_groups;
  const int hg = static_cast<int>(blockIdx.x % p.head_groups);
  const int h0 = hg * Cfg::kBlockM;
  const int rows = min(Cfg::kBlockM, p.H - h0);
  const int row0 = Cfg::kGroupRows * rg;
  const bool computes = row0 < rows;  // warp-uniform
  const int pair_barrier = 1 + cq;

  // Slots: sparse, the active prefix of the row; dense, the keys of the range.
  const int64_t begin = kDense ? p.meta.range_begin(tok, p.dims) : 0;
  const int n_slots = kDense ? static_cast<int>(p.meta.range_size(tok, p.dims))
                             : dsa_active_slots(p.len, p.len_s, p.topk, tok);
  const int n_chunks = (n_slots + N - 1) / N;
  float* out = p.log_a + int64_t{hg} * p.la_gs + (tok - p.tok_begin) * p.la_ts;

  const int cp_row = tid >> 3, cp_sub = tid & 7, cp_swz = cp_row & 7;
  const int32_t* idx_row = kDense ? nullptr : p.idx + tok * p.idx_ss;
  const bool rope = p.qk_chunks > 64;

  auto load_indices = [&](int chunk, int32_t(&dst)[kGatherRows]) {
#pragma unroll
    for (int i = 0; i < kGatherRows; ++i) {
      const int slot = chunk * N + cp_row + 32 * i;
      if (kDense) {
        dst[i] = slot < n_slots ? static_cast<int32_t>(begin + slot) : -1;
      } else {
        dst[i] = slot < n_slots ? idx_row[slot * p.idx_si] : -1;
      }
    }
  };
  auto gather = [&](int stage, const int32_t(&j)[kGatherRows]) {
#pragma unroll
    for (int i = 0; i < kGatherRows; ++i) {
      const int row = cp_row + 32 * i;
      const bool active = j[i] >= 0 && j[i] < p.skv;
      const __nv_bfloat16* src = p.kv + (active ? j[i] * p.kv_ss : int64_t{0});
      dsa::copy_row_swizzled(sk + stage * Cfg::kKStageBytes + row * kRowBytes, src,
                             active ? 16 : 0, cp_sub, cp_swz, rope);
    }
  };

  // The group's lse rows in log2 units; +inf (no term) for heads past H.
  if (tid < Cfg::kBlockM) {
    const float l = tid < rows ? p.lse[tok * p.lse_ss + (h0 + tid) * p.lse_sh] : kInf;
    s_lse[tid] = l == kInf ? kInf : l * kLog2e;
  }
  int32_t next_idx[kGatherRows];
  if (n_chunks > 0) {
    const __nv_bfloat16* q_tok = p.q + tok * p.q_ss;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = cp_row + 32 * i;
      const bool valid = row < rows;
      dsa::copy_row_swizzled(sq + row * kRowBytes, valid ? q_tok + (h0 + row) * p.q_sh : q_tok,
                             valid ? 16 : 0, cp_sub, cp_swz, rope);
    }
    load_indices(0, next_idx);
    gather(0, next_idx);
    dsa::cp_async_commit();
    if (n_chunks > 1) load_indices(1, next_idx);
  }

  const int x = lane & 7;
  const uint32_t q_lane = sq + (row0 + (lane & 15)) * kRowBytes;
  const int q_hi = lane >> 4;
  const uint32_t k_lane =
      (cq * Cfg::kWarpKeys + (lane & 7) + (Cfg::kSTiles == 2 ? 8 * (lane >> 4) : 0)) * kRowBytes;
  const int k_hi = (lane >> 3) & 1;
  const int q_kblocks = p.qk_chunks / 8;

  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    const int stage = chunk & 1;
    // [1] Own copies landed; after the barrier everyone's, and chunk - 1 is done with.
    dsa::cp_async_wait_all();
    __syncthreads();
    // [2]
    if (chunk + 1 < n_chunks) {
      gather(stage ^ 1, next_idx);
      dsa::cp_async_commit();
      if (chunk + 2 < n_chunks) load_indices(chunk + 2, next_idx);
    }
    // [3], [4] This warp's (m, l) per key column; a row group without a row below H has none.
    float2 part[Cfg::kSTiles][2];
#pragma unroll
    for (int nt = 0; nt < Cfg::kSTiles; ++nt) part[nt][0] = part[nt][1] = make_float2(-kInf, 0.f);
    if (computes) {
      float s[kM][Cfg::kSTiles][4];
#pragma unroll
      for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int nt = 0; nt < Cfg::kSTiles; ++nt) s[m][nt][0] = s[m][nt][1] = s[m][nt][2] = s[m][nt][3] = 0.f;
      dsa::warp_mma_abt<kM, Cfg::kSTiles, Ops>(s, q_lane, kRowBytes, q_hi,
                                               sk + stage * Cfg::kKStageBytes + k_lane, k_hi, x,
                                               q_kblocks);
      float lse2[kM][2];
#pragma unroll
      for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int i = 0; i < 2; ++i) lse2[m][i] = s_lse[row0 + 16 * m + g + 8 * i];
#pragma unroll
      for (int nt = 0; nt < Cfg::kSTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float v[kM][2];
          float mx = -kInf;
#pragma unroll
          for (int m = 0; m < kM; ++m)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              // lse = +inf: -inf (no term); fmaf(s, scale, -inf) = -inf for finite s.
              v[m][i] = fmaf(s[m][nt][2 * i + e], p.scale_log2, -lse2[m][i]);
              mx = fmaxf(mx, v[m][i]);
            }
#pragma unroll
          for (int off = 4; off < 32; off *= 2)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
          float l = 0.f;
          if (mx != -kInf) {
#pragma unroll
            for (int m = 0; m < kM; ++m)
#pragma unroll
              for (int i = 0; i < 2; ++i) l += exp2_approx(v[m][i] - mx);
          }
#pragma unroll
          for (int off = 4; off < 32; off *= 2) l += __shfl_xor_sync(0xffffffffu, l, off);
          part[nt][e] = make_float2(mx, l);
        }
      }
    }
    if (g == 0) {
#pragma unroll
      for (int nt = 0; nt < Cfg::kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          s_part[rg * N + cq * Cfg::kWarpKeys + 8 * nt + 2 * t4 + e] = part[nt][e];
    }
    dsa::named_barrier_sync(pair_barrier, 64);
    // [5] Warp rg = 0 of the pair combines the two row groups of its N/4 keys.
    if (rg == 0 && lane < Cfg::kWarpKeys) {
      const int key = cq * Cfg::kWarpKeys + lane;
      const int slot = chunk * N + key;
      const float2 a = s_part[key], b = s_part[N + key];
      const float m = fmaxf(a.x, b.x);
      float log_a = -kInf;
      if (m != -kInf) {
        const float l = a.y * exp2_approx(a.x - m) + b.y * exp2_approx(b.x - m);
        log_a = (m + log2f(l)) * kLn2;
      }
      if (slot < n_slots) out[slot] = log_a;
    }
  }
}

}  // namespace sa::portable::indexer
