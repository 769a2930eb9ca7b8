// The portable DSA forward kernel (sparse MLA prefill, SPEC 2) on sm80+ tensor cores: mma.sync
// m16n8k16, ldmatrix, cp.async. Our own design, after the public FlashMLA sparse prefill (one CTA
// per token and 64 heads, the selected kv rows gathered into shared memory and reused by every
// head).
//
// Work split. One CTA per (query token t, group of 64 heads); all heads of a token share the
// token's indices (MQA), so each gathered kv row feeds 64 query rows: K is the whole row (D_qk),
// V is its first 512 columns in the same buffer (no second gather). The token's active slots are
// walked in chunks of N keys (N = 64 when the device offers ~227 KB of shared memory per block,
// sm90; N = 32 on sm80's 163 KB); the last chunk is masked.
//
// 8 warps in 2 row groups: warp w = (rg = w % 2: tile rows [32 rg, 32 rg + 32), i.e. two m16
//                                    tiles; cq = w / 2: a quarter of the keys and of O)
//   S  = Q K^T   warp (rg, cq): its 32 rows x keys [cq N/4, (cq + 1) N/4) of the chunk, all D_qk
//   O += P V     warp (rg, cq): its 32 rows x O columns [128 cq, 128 cq + 128), all N keys
// The 4 warps of a row group exchange row maxima and their quarters of P through shared memory
// under a 128-thread named barrier (ids 1, 2). S is computed once and shared, not recomputed per
// warp (that would add D_qk / (D_qk + D_v) = 53% more MMAs). A warp's tile is 32 rows (not 16)
// so that each V fragment feeds 4 MMAs: shared-memory traffic, not the tensor pipe, bounds
// mma.sync here; per warp and 64-key chunk: S 36 k16 steps x (2 Q + 1 K ldmatrix.x4, 4 MMAs),
// P V 4 x (2 P + 8 V ldmatrix.x4, 32 MMAs): 148 ldmatrix.x4 per 272 MMAs (16-row warps: 174).
// Q is read from shared memory: a warp's Q slice (16 rows x 576 at least) is >= 144 registers.
// Rows past H (H % 8 == 0) are zero-filled Q rows: a row group with no row < H skips the math;
// a half-valid group computes its padded m16 tiles and never writes their rows past H.
//
// Registers per thread: O 32 x 128 fp32 / 32 lanes = 128; S 32 x N/4 / 32 = 8 or 16; Q, K, V, P
// fragments 8 + 4 + 4 (+ 8); running max and sum 8; addresses. ptxas -v (CUDA 13.0): 228-234
// registers for N = 32, 250 for N = 64, no spills, no local memory.
//
// Shared memory (bytes; rows of 576 elements = 72 16-byte chunks, chunk c of row r stored at
// c ^ (r % 8) so that 8 consecutive rows at one logical chunk hit 8 bank groups):
//   Q     64 x 1152                   = 73,728
//   K/V   2 stages x N x 1152         = 73,728 (N 32) | 147,456 (N 64)
//   P     64 x (N + 8) x 2            =  5,120        |   9,216   (row pitch padded: no conflicts)
//   bias  2 stages x N fp32           =    256        |     512   (0 active, -inf masked)
//   red   8 warps x 32 rows fp32      =  1,024                    (row max; at the end row sums)
//   total                               153,856       | 231,936   (limits: sm80 166,912,
//                                                                sm90 232,448)
//
// Timeline of one CTA (c = chunk, st = c % 2):
//
//   prologue  [0] n = active prefix length of the row (topk_length clamped to [0, topk])
//                 cp.async Q (zero rows past H) + gather chunk 0 -> stage 0; indices of chunk 1
//   chunk c   [1] wait own cp.async; __syncthreads     stage st full; stage st^1, P, red free
//             [2] gather chunk c+1 -> stage st^1       8 threads per kv row, 16-byte cp.async;
//                 load indices of chunk c+2            inactive rows zero-filled, bias -inf
//             [3] S = Q K^T (own N/4 keys)             Q, K by ldmatrix from smem
//             [4] s = S * scale * log2(e) + bias; row max (quad shuffles) -> red
//                 row-group barrier
//             [5] m_new = max(m, the group's 4 maxima); P = 2^(s - m_new);
//                 l = l * alpha + rowsum(P); P (16-bit) -> smem; O *= alpha   (alpha = 2^(m-m_new))
//                 row-group barrier
//             [6] O += P V (all N keys)                 P by ldmatrix, V by ldmatrix.trans
//   epilogue  [7] l = the group's 4 partial row sums (red, row-group barrier)
//                 lse = ln2 (m + log2 l) (+inf if l == 0: no active slot)
//                 out = O / (l (1 + exp(sink - lse)))   (0 if l == 0; sink +inf or huge -> 0)
//
//   row group   |--S--|max|bar|--P--|bar|-------P V-------|  |--S--|max|bar| ...
//   cp.async    |gather c+1 ..................................|gather c+2 ...
//   __syncthreads                                              ^ [1]
//
// Masking and memory safety: a slot is read from global memory only when it is in the active
// prefix, and its kv row only when 0 <= index < S_kv; every other row of the stage is
// zero-filled by cp.async (src-size 0, nothing read) and masked to -inf, so no index value makes
// the kernel read out of bounds and NaN in unselected kv rows never reaches an output. A chunk
// with no active key gives P = 0 (the max is guarded: 2^(-inf - 0) = 0, never -inf - -inf).
// Repeated indices are separate slots: each counts once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "common/dsa_params.hpp"
#include "common/dsa_device.cuh"
#include "common/problem.hpp"
#include "cuda/dsa_mma.hpp"
#include "sm80/dsa_row_copy.hpp"
#include "sm80/dsa_warp_mma.hpp"

namespace sa::portable::dsa_fwd {

// Kernel arguments: typed pointers and element strides, everything resolved on the host.
struct DsaFwdParams {
  const void* q;       // [S_q, H, D_qk]: (t, h, d) at t * q_ss + h * q_sh + d
  const void* kv;      // [S_kv, D_qk]: row j at j * kv_ss
  void* out;           // [S_q, H, 512]: (t, h, d) at t * o_ss + h * o_sh + d
  float* lse;          // [S_q, H]: (t, h) at t * lse_ss + h * lse_sh
  const int32_t* idx;  // [S_q, topk]: (t, i) at t * idx_ss + i * idx_si
  const int32_t* len;  // [S_q] at t * len_s; may be null
  const float* sink;   // [H] at h * sink_s; may be null
  int64_t q_ss, q_sh, kv_ss, o_ss, o_sh, lse_ss, lse_sh, idx_ss, idx_si, len_s, sink_s;
  int64_t skv;          // S_kv
  int32_t H;            // heads (a multiple of 8)
  int32_t topk;         // slots per row
  int32_t head_groups;  // ceil(H / 64)
  int32_t qk_chunks;    // D_qk / 8: 64 or 72
  float scale_log2;     // scale * log2(e)
};

// Kernel arguments of a validated problem (the host checks support first).
inline DsaFwdParams make_params(const DsaFwdProblem& p) {
  const DsaDims& d = p.dims;
  DsaFwdParams prm{};
  fill_dsa_common_params(prm, p);
  prm.H = static_cast<int32_t>(d.H);
  prm.head_groups = static_cast<int32_t>((d.H + 63) / 64);
  prm.qk_chunks = static_cast<int32_t>(d.Dqk / 8);
  return prm;
}

template <class Element_, int kBlockN_>
struct DsaFwdConfig {
  using Element = Element_;
  static constexpr int kBlockN = kBlockN_;  // keys per chunk
  static constexpr int kBlockM = 64;        // heads per CTA
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kDv = 512;
  static constexpr int kGroupRows = 32;  // rows of a row group (two m16 tiles)
  static constexpr int kMTiles = kGroupRows / 16;
  static constexpr int kGroupWarps = 4;              // warps of a row group
  static constexpr int kRowChunks = 72;              // 16-byte chunks per smem row (576 elements)
  static constexpr int kRowBytes = kRowChunks * 16;  // D_qk = 512 leaves the last 8 chunks unused
  static constexpr int kWarpKeys = kBlockN / kGroupWarps;  // keys of S per warp
  static constexpr int kSTiles = kWarpKeys / 8;            // n8 tiles of S per warp and m16 tile
  static constexpr int kPvSteps = kBlockN / 16;            // k16 steps of P V
  static constexpr int kWarpCols = kDv / kGroupWarps;      // O columns per warp
  static constexpr int kOTiles = kWarpCols / 8;            // n8 tiles of O per warp and m16 tile
  static constexpr int kGatherRows = kBlockN / 32;         // kv rows per thread per chunk
  static constexpr int kPPitch = kBlockN + 8;              // P row pitch in elements

  static constexpr int kQOff = 0;
  static constexpr int kKOff = kQOff + kBlockM * kRowBytes;
  static constexpr int kKStageBytes = kBlockN * kRowBytes;
  static constexpr int kPOff = kKOff + 2 * kKStageBytes;
  static constexpr int kBiasOff = kPOff + kBlockM * kPPitch * 2;
  static constexpr int kRedOff = kBiasOff + 2 * kBlockN * 4;
  static constexpr int kSmemBytes = kRedOff + kWarps * kGroupRows * 4;

  static_assert(sizeof(Element) == 2, "16-bit elements");
  static_assert(kBlockN == 32 || kBlockN == 64, "chunks of 32 or 64 keys");
  static_assert(kSTiles == 1 || kSTiles == 2, "K fragments: one ldmatrix.x2 or .x4 per k step");
  static_assert(kWarps == kGroupWarps * (kBlockM / kGroupRows), "warps = row groups x quarters");
  static_assert((kPPitch * 2) % 16 == 0, "P rows must stay 16-byte aligned for ldmatrix");
};

// Hardware barrier ids: 0 is __syncthreads; row group rg uses kRowGroupBase + rg (128 threads).
enum class Barrier : int { kRowGroupBase = 1 };

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) dsa_fwd_kernel(const DsaFwdParams p) {
  using Element = typename Cfg::Element;
  using Ops = dsa::Mma16<Element>;
  constexpr int N = Cfg::kBlockN;
  constexpr int kM = Cfg::kMTiles;
  constexpr int kRowBytes = Cfg::kRowBytes;
  constexpr int kGatherRows = Cfg::kGatherRows;
  constexpr int kGroupThreads = Cfg::kGroupWarps * 32;
  const float kInf = INFINITY;

  uint8_t* smem = dsa::dynamic_smem();
  float* s_bias = reinterpret_cast<float*>(smem + Cfg::kBiasOff);  // [2][N]
  float* s_red = reinterpret_cast<float*>(smem + Cfg::kRedOff);    // [8 warps][32 rows]
  uint32_t* s_p_words = reinterpret_cast<uint32_t*>(smem + Cfg::kPOff);
  const uint32_t sq = dsa::smem_u32(smem + Cfg::kQOff);
  const uint32_t sk = dsa::smem_u32(smem + Cfg::kKOff);
  const uint32_t sp = dsa::smem_u32(smem + Cfg::kPOff);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rg = warp & 1;   // row group: tile rows [32 rg, 32 rg + 32)
  const int cq = warp >> 1;  // quarter: S keys [cq N/4, +N/4), O columns [128 cq, +128)
  const int g = lane >> 2, t4 = lane & 3;
  const int64_t tok = blockIdx.x / p.head_groups;
  const int h0 = (blockIdx.x % p.head_groups) * Cfg::kBlockM;
  const int rows = min(Cfg::kBlockM, p.H - h0);  // heads of this CTA, a multiple of 8
  const int row0 = Cfg::kGroupRows * rg;         // first tile row of this warp
  const bool computes = row0 < rows;             // warp-uniform; the same for the whole group
  const int group_barrier = static_cast<int>(Barrier::kRowGroupBase) + rg;

  // [0] The active prefix of the row: slots >= n_slots are never read.
  const int n_slots = dsa_active_slots(p.len, p.len_s, p.topk, tok);
  const int n_chunks = (n_slots + N - 1) / N;

  // Gather mapping: 8 consecutive threads copy one kv row (8 x 16 bytes = a 128-byte line per
  // step), 32 rows per pass, kGatherRows passes. The same mapping loads Q's 64 rows.
  const int cp_row = tid >> 3, cp_sub = tid & 7;
  const int cp_swz = cp_row & 7;  // the row's swizzle phase (rows of a thread differ by 32)
  const Element* kv = static_cast<const Element*>(p.kv);
  const int32_t* idx_row = p.idx + tok * p.idx_ss;
  const bool rope = p.qk_chunks > 64;  // D_qk = 576: 8 more chunks per row

  auto load_indices = [&](int chunk, int32_t(&dst)[kGatherRows]) {
#pragma unroll
    for (int i = 0; i < kGatherRows; ++i) {
      const int slot = chunk * N + cp_row + 32 * i;
      dst[i] = slot < n_slots ? idx_row[slot * p.idx_si] : -1;
    }
  };
  auto copy_row = [&](uint32_t dst_row, const Element* src_row, int src_bytes) {
    dsa::copy_row_swizzled(dst_row, src_row, src_bytes, cp_sub, cp_swz, rope);
  };
  auto gather = [&](int stage, const int32_t(&j)[kGatherRows]) {
#pragma unroll
    for (int i = 0; i < kGatherRows; ++i) {
      const int row = cp_row + 32 * i;
      const bool active = j[i] >= 0 && j[i] < p.skv;
      // Inactive: nothing is read (src-size 0), the row is zero-filled; kv's base is a valid
      // address for the instruction.
      const Element* src = kv + (active ? j[i] * p.kv_ss : int64_t{0});
      copy_row(sk + stage * Cfg::kKStageBytes + row * kRowBytes, src, active ? 16 : 0);
      if (cp_sub == 0) s_bias[stage * N + row] = active ? 0.f : -kInf;
    }
  };

  float o[kM][Cfg::kOTiles][4];
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int nt = 0; nt < Cfg::kOTiles; ++nt)
      o[m][nt][0] = o[m][nt][1] = o[m][nt][2] = o[m][nt][3] = 0.f;
  // Per thread: rows 16 m + g + 8 i of the group (m16 tile m, half i).
  float m_run[kM][2];  // running row max of s (log2 units)
  float l_run[kM][2];  // this thread's part of the running row sum of P
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    m_run[m][0] = m_run[m][1] = -kInf;
    l_run[m][0] = l_run[m][1] = 0.f;
  }
  int32_t next_idx[kGatherRows];  // indices of the next chunk to gather

  if (n_chunks > 0) {
    // Q rows past H are zero-filled: a half-valid row group computes them (finite, never stored).
    const Element* q_tok = static_cast<const Element*>(p.q) + tok * p.q_ss;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = cp_row + 32 * i;
      const bool valid = row < rows;
      copy_row(sq + row * kRowBytes, valid ? q_tok + (h0 + row) * p.q_sh : q_tok, valid ? 16 : 0);
    }
    load_indices(0, next_idx);
    gather(0, next_idx);
    dsa::cp_async_commit();
    if (n_chunks > 1) load_indices(1, next_idx);
  }

  // Per-lane parts of the ldmatrix addresses. In every operand the 8 rows of a matrix are 8
  // consecutive tile rows starting at a multiple of 8, so the swizzle phase is lane & 7.
  const int x = lane & 7;
  // Q (A of S), m16 tile m: row row0 + 16 m + (lane & 15), chunk 2 kk + (lane >> 4).
  const uint32_t q_lane = sq + (row0 + (lane & 15)) * kRowBytes;
  const int q_hi = lane >> 4;
  // K (B of S): key cq N/4 + (lane & 7) + 8 (lane >> 4), chunk 2 kk + ((lane >> 3) & 1)
  // (.x2 for 8 keys: lanes 0..15 give the addresses).
  const uint32_t k_lane =
      (cq * Cfg::kWarpKeys + (lane & 7) + (Cfg::kSTiles == 2 ? 8 * (lane >> 4) : 0)) * kRowBytes;
  const int k_hi = (lane >> 3) & 1;
  // V (B of P V, transposed): key 16 j + (lane & 7) + 8 ((lane >> 3) & 1),
  // chunk 16 cq + 2 np + (lane >> 4).
  const uint32_t v_lane = ((lane & 7) + 8 * ((lane >> 3) & 1)) * kRowBytes;
  const int v_hi = lane >> 4;
  // P (A of P V), m16 tile m: row row0 + 16 m + (lane & 15), key 16 j + 8 (lane >> 4).
  const uint32_t p_lane = sp + ((row0 + (lane & 15)) * Cfg::kPPitch + 8 * (lane >> 4)) * 2;
  const int q_kblocks = p.qk_chunks / 8;  // 4 k16 steps each: 8 (D_qk 512) or 9 (576)

  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    const int stage = chunk & 1;
    // [1] This thread's copies of chunk `chunk` have landed; after the barrier everyone's have,
    // and every warp is done with chunk - 1 (its stage, P, red and bias slots are free).
    dsa::cp_async_wait_all();
    __syncthreads();
    // [2] Prefetch the next chunk into the other stage; its indices were loaded one chunk ago.
    if (chunk + 1 < n_chunks) {
      gather(stage ^ 1, next_idx);
      dsa::cp_async_commit();
      if (chunk + 2 < n_chunks) load_indices(chunk + 2, next_idx);
    }
    if (!computes) continue;

    // [3] S = Q K^T for this warp's 32 rows and N/4 keys.
    const uint32_t k_stage = sk + stage * Cfg::kKStageBytes;
    float s[kM][Cfg::kSTiles][4];
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
      for (int nt = 0; nt < Cfg::kSTiles; ++nt)
        s[m][nt][0] = s[m][nt][1] = s[m][nt][2] = s[m][nt][3] = 0.f;
    dsa::warp_mma_abt<kM, Cfg::kSTiles, Ops>(s, q_lane, kRowBytes, q_hi, k_stage + k_lane, k_hi, x,
                                             q_kblocks);

    // [4] Scale to log2 units, mask, row max over this warp's keys.
    const float* bias = s_bias + stage * N + cq * Cfg::kWarpKeys + 2 * t4;
    float mx[kM][2];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      mx[m][0] = mx[m][1] = -kInf;
#pragma unroll
      for (int nt = 0; nt < Cfg::kSTiles; ++nt) {
        const float2 bb = *reinterpret_cast<const float2*>(bias + 8 * nt);
        s[m][nt][0] = fmaf(s[m][nt][0], p.scale_log2, bb.x);
        s[m][nt][1] = fmaf(s[m][nt][1], p.scale_log2, bb.y);
        s[m][nt][2] = fmaf(s[m][nt][2], p.scale_log2, bb.x);
        s[m][nt][3] = fmaf(s[m][nt][3], p.scale_log2, bb.y);
        mx[m][0] = fmaxf(mx[m][0], fmaxf(s[m][nt][0], s[m][nt][1]));
        mx[m][1] = fmaxf(mx[m][1], fmaxf(s[m][nt][2], s[m][nt][3]));
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        mx[m][i] = fmaxf(mx[m][i], __shfl_xor_sync(0xffffffffu, mx[m][i], 1));
        mx[m][i] = fmaxf(mx[m][i], __shfl_xor_sync(0xffffffffu, mx[m][i], 2));
        if (t4 == 0) s_red[warp * Cfg::kGroupRows + 16 * m + g + 8 * i] = mx[m][i];
      }
    }
    dsa::named_barrier_sync(group_barrier, kGroupThreads);

    // [5] Online softmax. Every warp of the group reads the 4 maxima in the same order, so all
    // compute the same m_new.
    float m_use[kM][2], alpha[kM][2];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float m_new = m_run[m][i];
#pragma unroll
        for (int q = 0; q < Cfg::kGroupWarps; ++q)
          m_new = fmaxf(m_new, s_red[(rg + 2 * q) * Cfg::kGroupRows + 16 * m + g + 8 * i]);
        // No active key yet: use 0 as the reference so that 2^(-inf - 0) = 0 (never inf - inf).
        m_use[m][i] = m_new == -kInf ? 0.f : m_new;
        alpha[m][i] = exp2_approx(m_run[m][i] - m_use[m][i]);  // 0 while m_run is -inf
        m_run[m][i] = m_new;
      }
      float rs[2] = {0.f, 0.f};
      const int prow = row0 + 16 * m + g;
#pragma unroll
      for (int nt = 0; nt < Cfg::kSTiles; ++nt) {
        s[m][nt][0] = exp2_approx(s[m][nt][0] - m_use[m][0]);
        s[m][nt][1] = exp2_approx(s[m][nt][1] - m_use[m][0]);
        s[m][nt][2] = exp2_approx(s[m][nt][2] - m_use[m][1]);
        s[m][nt][3] = exp2_approx(s[m][nt][3] - m_use[m][1]);
        rs[0] += s[m][nt][0] + s[m][nt][1];
        rs[1] += s[m][nt][2] + s[m][nt][3];
        const int col = cq * Cfg::kWarpKeys + 8 * nt + 2 * t4;
        s_p_words[(prow * Cfg::kPPitch + col) >> 1] = pack2<Element>(s[m][nt][0], s[m][nt][1]);
        s_p_words[((prow + 8) * Cfg::kPPitch + col) >> 1] =
            pack2<Element>(s[m][nt][2], s[m][nt][3]);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) l_run[m][i] = l_run[m][i] * alpha[m][i] + rs[i];
#pragma unroll
      for (int nt = 0; nt < Cfg::kOTiles; ++nt) {
        o[m][nt][0] *= alpha[m][0];
        o[m][nt][1] *= alpha[m][0];
        o[m][nt][2] *= alpha[m][1];
        o[m][nt][3] *= alpha[m][1];
      }
    }
    dsa::named_barrier_sync(group_barrier, kGroupThreads);

    // [6] O += P V over all N keys of the chunk; V is the first 512 columns of the K rows.
    const uint32_t v_stage = k_stage + v_lane;
#pragma unroll
    for (int j = 0; j < Cfg::kPvSteps; ++j) {
      uint32_t pa[kM][4];
#pragma unroll
      for (int m = 0; m < kM; ++m)
        dsa::ldmatrix_x4(p_lane + (m * 16 * Cfg::kPPitch + 16 * j) * 2, pa[m]);
#pragma unroll
      for (int np = 0; np < Cfg::kOTiles / 2; ++np) {
        const int ch = 16 * cq + 2 * np + v_hi;
        uint32_t vf[4];
        dsa::ldmatrix_x4_trans(v_stage + j * 16 * kRowBytes + ((ch ^ x) << 4), vf);
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          Ops::mma(o[m][2 * np], pa[m], vf[0], vf[1]);
          Ops::mma(o[m][2 * np + 1], pa[m], vf[2], vf[3]);
        }
      }
    }
  }

  if (!computes) return;

    // [7] Row sums: quad, then the row group (red is free: every warp of the group read its last
    // maxima before the last group barrier of the loop).
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l_run[m][i] += __shfl_xor_sync(0xffffffffu, l_run[m][i], 1);
      l_run[m][i] += __shfl_xor_sync(0xffffffffu, l_run[m][i], 2);
      if (t4 == 0) s_red[warp * Cfg::kGroupRows + 16 * m + g + 8 * i] = l_run[m][i];
    }
  }
  dsa::named_barrier_sync(group_barrier, kGroupThreads);
  constexpr float kLn2 = 0.693147180559945309f;
  Element* out = static_cast<Element*>(p.out);
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    if (row0 + 16 * m >= rows) continue;  // a padded m16 tile (rows past H): never written
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (row0 + 16 * m + g + 8 * i >= rows) continue;  // a row past H in a half-valid tile
      float l = 0.f;
#pragma unroll
      for (int q = 0; q < Cfg::kGroupWarps; ++q)
        l += s_red[(rg + 2 * q) * Cfg::kGroupRows + 16 * m + g + 8 * i];
      const int h = h0 + row0 + 16 * m + g + 8 * i;
      float lse = kInf, factor = 0.f;  // no active slot: out = 0, lse = +inf
      if (l > 0.f) {
        lse = (m_run[m][i] + log2f(l)) * kLn2;
        // out = sum_j exp(s_j - L) v_j with L = logaddexp(lse, sink)
        //     = O / l / (1 + e^(sink - lse)). sink -inf: e^-inf = 0; +inf or huge: the
        //     exponential is inf, factor 0. Never NaN.
        const float sink = p.sink != nullptr ? p.sink[h * p.sink_s] : -kInf;
        factor = 1.f / (l * (1.f + expf(sink - lse)));
      }
      if (cq == 0 && t4 == 0) p.lse[tok * p.lse_ss + h * p.lse_sh] = lse;
      Element* o_row = out + tok * p.o_ss + h * p.o_sh + Cfg::kWarpCols * cq + 2 * t4;
#pragma unroll
      for (int nt = 0; nt < Cfg::kOTiles; ++nt) {
        *reinterpret_cast<uint32_t*>(o_row + 8 * nt) =
            pack2<Element>(o[m][nt][2 * i] * factor, o[m][nt][2 * i + 1] * factor);
      }
    }
  }
}

}  // namespace sa::portable::dsa_fwd
