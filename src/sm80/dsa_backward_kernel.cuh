// The portable DSA backward kernel (sparse MLA, SPEC 2) on sm80+ tensor cores: mma.sync
// m16n8k16, ldmatrix, cp.async, fp32 reductions to global memory. It mirrors the forward
// (dsa_forward_kernel.cuh): one CTA per (query token t, group of M heads), M = 64 (sm90-class
// shared memory) or 32 (sm80's 163 KB, and H <= 32); the token's active slots are walked in chunks
// of N = 32 gathered kv rows; K is the whole row (D_qk), V its first 512 columns (no second
// gather). Per chunk, with Q [M x D_qk] and dO [M x 512] resident in shared memory:
//
//   S  = Q K^T,  dP = dO V^T                    [M x N]        (phase A, split by role)
//   P  = exp(S scale - L),  dS' = scale P (dP - delta)          (L = logaddexp(lse, sink))
//   dQ += dS' K                                 [M x D_qk]     (fp32 registers, whole loop)
//   dKV = dS'^T Q + P^T dO                      [N x D_qk]     (heads reduced on chip, then
//                                                               one fp32 reduction per element)
//
// Warp roles (8 warps; w4 = warp % 4, rg = row group of 32 heads, M / 32 of them):
//   phase A   warps 0-3 ("S"):  S for rows [32 rg, +32) x keys [kp N', +N')   (k over D_qk)
//             warps 4-7 ("dP"): dP for the same tile                          (k over 512)
//             N' = 16 (M 64: 2 row groups x 2 key halves) or 8 (M 32: 4 key quarters).
//             Splitting S and dP between two warps (instead of each warp computing both for
//             half the keys) halves the re-reads of Q and dO from shared memory, which bound
//             mma.sync here: 4 MMAs per 3 ldmatrix.x4 instead of 2 per 2.5.
//             The S warp hands its fp32 tile to its dP partner through shared memory (X, 4 KB or
//             8 KB) under a 64-thread named barrier (bar.sync by both warps, ids 1-4); the dP
//             warp computes P and dS' and stores both as 16-bit tiles [M x N] for the two
//             transposed products.
//   dQ        warp (rg, cg): rows [32 rg, +32) x columns [cg D_qk / C, +D_qk / C), C = 8 / (M / 32)
//             column groups; dS' from smem (ldmatrix), K rows transposed (ldmatrix.trans).
//             M 64, D_qk 576: 144 columns = 144 fp32 accumulators per thread, kept for the whole
//             topk loop (dQ is per token: no atomics, written once at the end).
//   dKV       warp w: value columns [64 w, +64) in pieces of 32 (M 64) or 64 (M 32) columns
//             (a piece's accumulators are live only while it is computed), plus rope column
//             block 512 + 8 w when D_qk = 576 (dS'^T Q only). A = dS'^T / P^T by ldmatrix.trans
//             of the [head][key] tiles, B = Q / dO rows transposed. Each finished piece goes out
//             as fp32 pair reductions (red.global.add.v2.f32 on sm90, two atomicAdd on sm80) to
//             the workspace row of the slot's key, skipping inactive slots; deterministic mode
//             stores the piece into the slot's own partial row instead (the driver,
//             cuda/dsa_backward_driver.hpp, reduces them per key in a fixed order).
//
// Shared memory (bytes; rows of D 16-bit elements, 16-byte chunk c of row r stored at c ^ (r % 8)
// so that 8 consecutive rows at one logical chunk hit 8 bank groups):
//                                M 64, D 576   M 64, D 512   M 32, D 576   M 32, D 512
//   Q      M x 2 D_qk              73,728        65,536        36,864        32,768
//   dO     M x 1024                65,536        65,536        32,768        32,768
//   K/V    2 stages x 32 x 2 D_qk  73,728        65,536        73,728        65,536
//   X      S tiles, M x 32 fp32     8,192         8,192         4,096         4,096
//   P, dS' 2 x M x 40 x 2          10,240        10,240         5,120         5,120
//   L, delta per row, fp32            512           512           256           256
//   key index per slot, 2 stages      256           256           256           256
//   total                         232,192       215,808       153,088       140,800
//   (limits: sm90 232,448 per block, sm80 166,912)
//
// Timeline of one CTA (c = chunk, st = c % 2):
//
//   prologue [0] n = active prefix (topk_length clamped to [0, topk]); cp.async Q, dO (rows past H
//                zero-filled) and chunk 0 -> stage 0; index of chunk 1; delta = rowsum(out * dO)
//                from global memory; L (log2 units) per row -> smem
//   chunk c  [1] wait own cp.async; __syncthreads        stage st full; stage st^1, X, P, dS free
//            [2] gather chunk c+1 -> stage st^1          8 threads per kv row, 16-byte cp.async;
//                load index of chunk c+2                 inactive rows zero-filled, index -1
//            [3] S warps: S = Q K^T -> X, sync(pair)     dP warps: dP = dO V^T; sync(pair);
//                                                        P, dS' -> smem (16-bit)
//            [4] __syncthreads                           P, dS' complete
//            [5] dQ += dS' K                             registers
//            [6] dKV pieces = dS'^T Q + P^T dO -> fp32 reductions into the rows of active keys
//   epilogue [7] dQ -> dq (rows < H); -exp(sink - L) delta -> the d_sink term of (t, h)
//
//   S warp    |------ S = Q K^T ------|X|sync.......  |-- dQ --|---- dKV + red ----|
//   dP warp   |--- dP = dO V^T ---|...sync|P,dS'|     |-- dQ --|---- dKV + red ----|
//   cp.async  |gather c+1 ...................................................|
//   barriers  ^[1]                                     ^[4]                         ^[1] of c+1
//
// Costs at the headline shape (S_q 4096, H 128, D_qk 576, topk 2048; per CTA and 32-key chunk):
// ldmatrix.x4 per warp: phase A 108 (S) or 96 (dP), dQ 22, dKV 74 -> ~1,570 per CTA (~6,300
// cycles of shared-memory bandwidth at 128 B/cycle) for 2,752 MMAs. The fp32 reductions: 32 keys x
// 576 x 4 B = 73.7 KB per CTA and chunk, 38.6 GB in all (2 head groups x 4096 tokens x 2048
// slots x 2,304 B), all hitting the 9.4 MB fp32 workspace in L2. At an assumed 2.5-3 TB/s of L2
// reduction throughput that is 13-15 ms, against ~39 ms for the whole backward at 150 TFLOPS:
// they overlap the tensor work (fire-and-forget `red`) but are the known wall.
//
// Masking and memory safety (as in the forward): a slot is read only inside the active prefix,
// its kv row only when 0 <= index < S_kv; every other row of a stage is zero-filled by cp.async
// (src-size 0) and gets P = 0 (so dS' = 0) and no reduction. Rows past H and rows whose lse is
// +inf (empty) or whose sink is +inf get L = +inf: P = 0 exactly, dS' = 0, no gradient, no NaN.
// Repeated indices are separate slots: each adds its own reduction.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/dsa_device.cuh"
#include "common/problem.hpp"
#include "cuda/dsa_backward_params.cuh"
#include "cuda/dsa_mma.hpp"
#include "sm80/dsa_row_copy.hpp"
#include "sm80/dsa_warp_mma.hpp"

namespace sa::portable::dsa_bwd {

template <class Element_, int kDqk_, int kBlockM_>
struct DsaBwdConfig {
  using Element = Element_;
  static constexpr int kDqk = kDqk_;  // 512 or 576
  static constexpr int kDv = 512;
  static constexpr int kBlockM = kBlockM_;  // heads per CTA: 64 or 32
  static constexpr int kBlockN = 32;        // keys per chunk
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowGroups = kBlockM / 32;  // row groups of 32 heads (two m16 tiles)
  static constexpr int kMTiles = 2;                // m16 tiles per warp (phase A and dQ)

  // Phase A: 4 warps per role, a 32-row x kWarpKeys tile each.
  static constexpr int kKeyParts = 4 / kRowGroups;
  static constexpr int kWarpKeys = kBlockN / kKeyParts;  // 16 or 8
  static constexpr int kSTiles = kWarpKeys / 8;          // n8 tiles of S (and dP) per m16 tile
  // dQ: 8 warps = kRowGroups x kColGroups.
  static constexpr int kColGroups = kWarps / kRowGroups;  // 4 or 8
  static constexpr int kQCols = kDqk / kColGroups;        // 144, 128, 72, 64
  static constexpr int kQTiles = kQCols / 8;              // n8 tiles of dQ per m16 tile
  // dKV: value columns [64 w, +64) per warp in pieces; rope columns 512 + 8 w.
  static constexpr int kValueCols = kDv / kWarps;  // 64
  static constexpr int kPieceTiles = kBlockM == 64 ? 4 : 8;
  static constexpr int kPieces = kValueCols / 8 / kPieceTiles;
  static constexpr bool kRope = kDqk > kDv;
  static constexpr int kHeadSteps = kBlockM / 16;  // k16 steps of the dKV products

  // Shared memory.
  static constexpr int kQRowBytes = kDqk * 2;
  static constexpr int kDoRowBytes = kDv * 2;
  static constexpr int kKRowBytes = kDqk * 2;
  static constexpr int kPPitch = kBlockN + 8;  // P / dS' row pitch in elements (80 B: no conflicts)
  static constexpr int kQOff = 0;
  static constexpr int kDoOff = kQOff + kBlockM * kQRowBytes;
  static constexpr int kKOff = kDoOff + kBlockM * kDoRowBytes;
  static constexpr int kKStageBytes = kBlockN * kKRowBytes;
  static constexpr int kXOff = kKOff + 2 * kKStageBytes;
  static constexpr int kPOff = kXOff + kBlockM * kBlockN * 4;
  static constexpr int kDsOff = kPOff + kBlockM * kPPitch * 2;
  static constexpr int kLOff = kDsOff + kBlockM * kPPitch * 2;
  static constexpr int kDeltaOff = kLOff + kBlockM * 4;
  static constexpr int kIdxOff = kDeltaOff + kBlockM * 4;
  static constexpr int kSmemBytes = kIdxOff + 2 * kBlockN * 4;

  static_assert(sizeof(Element) == 2, "16-bit elements");
  static_assert(kDqk == 512 || kDqk == 576, "D_qk 512 or 576");
  static_assert(kBlockM == 32 || kBlockM == 64, "32 or 64 heads per CTA");
  static_assert(kBlockN == 32, "the gather maps one kv row to 8 threads, 32 rows per pass");
  static_assert(kSTiles == 1 || kSTiles == 2, "K fragments: one ldmatrix.x2 or .x4 per k step");
  static_assert(kQRowBytes % 128 == 0 && kDoRowBytes % 128 == 0, "whole 128-byte swizzle lines");
  static_assert(kPieces * kPieceTiles * 8 == kValueCols, "whole pieces");
  static_assert((kPPitch * 2) % 16 == 0, "P rows must stay 16-byte aligned for ldmatrix");
};

// Hardware barrier ids: 0 is __syncthreads; the (S, dP) warp pair w4 uses kPairBase + w4.
enum class Barrier : int { kPairBase = 1 };
constexpr int kPairThreads = 64;

template <class Element>
__device__ __forceinline__ float2 unpack2(uint32_t bits);
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t bits) {
  __nv_bfloat162 v;
  memcpy(&v, &bits, 4);
  return __bfloat1622float2(v);
}
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t bits) {
  __half2 v;
  memcpy(&v, &bits, 4);
  return __half22float2(v);
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) dsa_bwd_kernel(const DsaBwdParams p) {
  using Element = typename Cfg::Element;
  using Ops = dsa::Mma16<Element>;
  constexpr int N = Cfg::kBlockN;
  constexpr int M = Cfg::kBlockM;
  constexpr int kM = Cfg::kMTiles;
  const float kInf = INFINITY;

  uint8_t* smem = dsa::dynamic_smem();
  const uint32_t s_base = dsa::smem_u32(smem);
  const uint32_t sq = s_base + Cfg::kQOff;
  const uint32_t sdo = s_base + Cfg::kDoOff;
  const uint32_t sk = s_base + Cfg::kKOff;
  const uint32_t sp = s_base + Cfg::kPOff;
  const uint32_t sds = s_base + Cfg::kDsOff;
  float4* s_x = reinterpret_cast<float4*>(smem + Cfg::kXOff);
  uint32_t* s_p_words = reinterpret_cast<uint32_t*>(smem + Cfg::kPOff);
  uint32_t* s_ds_words = reinterpret_cast<uint32_t*>(smem + Cfg::kDsOff);
  float* s_l2 = reinterpret_cast<float*>(smem + Cfg::kLOff);          // [M] L, log2 units
  float* s_delta = reinterpret_cast<float*>(smem + Cfg::kDeltaOff);   // [M]
  int32_t* s_kidx = reinterpret_cast<int32_t*>(smem + Cfg::kIdxOff);  // [2][N]; -1 inactive

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int x = lane & 7;  // swizzle phase of the row this lane addresses in every ldmatrix
  const int64_t tok_local = blockIdx.x / p.head_groups;
  const int64_t tok = p.tok_begin + tok_local;
  const int grp = static_cast<int>(blockIdx.x % p.head_groups);
  const int h0 = grp * M;
  const int rows = min(M, p.H - h0);  // heads of this CTA, a multiple of 8

  // [0] The active prefix of the row: slots >= n_slots are never read.
  const int n_slots = dsa_active_slots(p.len, p.len_s, p.topk, tok);
  const int n_chunks = (n_slots + N - 1) / N;

  // Gather mapping: 8 consecutive threads copy one row (8 x 16 bytes = a 128-byte line per step),
  // 32 rows per pass: kv rows of a chunk, Q and dO rows in the prologue.
  const int cp_row = tid >> 3, cp_sub = tid & 7;
  const int cp_swz = cp_row & 7;
  const Element* kv = static_cast<const Element*>(p.kv);
  const int32_t* idx_row = p.idx + tok * p.idx_ss;
  bool saw_active = false;

  auto copy_row = [&](uint32_t dst_row, const Element* src_row, int src_bytes, int chunks) {
    dsa::copy_row_swizzled(dst_row, src_row, src_bytes, cp_sub, cp_swz, chunks > 64);
  };
  auto load_index = [&](int chunk) -> int32_t {
    const int slot = chunk * N + cp_row;
    return slot < n_slots ? idx_row[slot * p.idx_si] : -1;
  };
  auto gather = [&](int stage, int32_t j) {
    const bool active = j >= 0 && j < p.skv;
    saw_active |= active;
    // Inactive: nothing is read (src-size 0), the row is zero-filled; kv's base is a valid
    // address for the instruction.
    const Element* src = kv + (active ? j * p.kv_ss : int64_t{0});
    copy_row(sk + stage * Cfg::kKStageBytes + cp_row * Cfg::kKRowBytes, src, active ? 16 : 0,
             Cfg::kDqk / 8);
    if (cp_sub == 0) s_kidx[stage * N + cp_row] = active ? j : -1;
  };

  int32_t next_j = -1;  // index of the next chunk to gather (this thread's row)
  if (n_chunks > 0) {
    // Q and dO rows past H are zero-filled (their P and dS' are 0 anyway).
    const Element* q_tok = static_cast<const Element*>(p.q) + tok * p.q_ss;
    const Element* do_tok = static_cast<const Element*>(p.dout) + tok * p.do_ss;
#pragma unroll
    for (int i = 0; i < M / 32; ++i) {
      const int row = cp_row + 32 * i;
      const bool valid = row < rows;
      copy_row(sq + row * Cfg::kQRowBytes, valid ? q_tok + (h0 + row) * p.q_sh : q_tok,
               valid ? 16 : 0, Cfg::kDqk / 8);
      copy_row(sdo + row * Cfg::kDoRowBytes, valid ? do_tok + (h0 + row) * p.do_sh : do_tok,
               valid ? 16 : 0, Cfg::kDv / 8);
    }
    gather(0, load_index(0));
    dsa::cp_async_commit();
    if (n_chunks > 1) next_j = load_index(1);

    // delta = rowsum(out * dO) in fp32 from the stored tensors, kTpr threads per head row.
    constexpr int kTpr = Cfg::kThreads / M;
    const int drow = tid / kTpr, dsub = tid % kTpr;
    float delta = 0.f;
    if (drow < rows) {
      const Element* o_row =
          static_cast<const Element*>(p.out) + tok * p.o_ss + (h0 + drow) * p.o_sh;
      const Element* d_row = do_tok + (h0 + drow) * p.do_sh;
#pragma unroll 4
      for (int k = 0; k < Cfg::kDv / 8 / kTpr; ++k) {
        const int ch = dsub + kTpr * k;
        const uint4 a = *reinterpret_cast<const uint4*>(o_row + ch * 8);
        const uint4 b = *reinterpret_cast<const uint4*>(d_row + ch * 8);
        const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 af = unpack2<Element>(aw[e]), bf = unpack2<Element>(bw[e]);
          delta = fmaf(af.x, bf.x, delta);
          delta = fmaf(af.y, bf.y, delta);
        }
      }
    }
#pragma unroll
    for (int off = kTpr / 2; off >= 1; off /= 2) delta += __shfl_xor_sync(0xffffffffu, delta, off);
    if (dsub == 0) s_delta[drow] = delta;
    if (tid < M) {
      float l2 = kInf;  // rows past H: no gradient
      if (tid < rows) {
        const int h = h0 + tid;
        const float lse = p.lse[tok * p.lse_ss + h * p.lse_sh];
        const float sink = p.sink != nullptr ? p.sink[h * p.sink_s] : -kInf;
        l2 = row_log2_normalizer(lse, sink);
      }
      s_l2[tid] = l2;
    }
  }

  // Phase A roles: S warps 0-3, dP warps 4-7; pair w4 = (row group a_rg, key part kp).
  const bool is_dp = warp >= 4;
  const int w4 = warp & 3;
  const int a_rg = w4 % Cfg::kRowGroups, kp = w4 / Cfg::kRowGroups;
  const int a_row0 = 32 * a_rg;
  const int a_row_bytes = is_dp ? Cfg::kDoRowBytes : Cfg::kQRowBytes;
  const int a_kblocks = (is_dp ? Cfg::kDv : Cfg::kDqk) / 64;  // 4 k16 steps each
  // A (Q or dO), m16 tile m: row a_row0 + 16 m + (lane & 15), chunk 2 kk + (lane >> 4).
  const uint32_t a_lane = (is_dp ? sdo : sq) + (a_row0 + (lane & 15)) * a_row_bytes;
  const int a_hi = lane >> 4;
  // K (B of S and dP): key kp N' + (lane & 7) + 8 (lane >> 4), chunk 2 kk + ((lane >> 3) & 1)
  // (.x2 for 8 keys: lanes 0..15 give the addresses).
  const uint32_t k_lane =
      (kp * Cfg::kWarpKeys + (lane & 7) + (Cfg::kSTiles == 2 ? 8 * (lane >> 4) : 0)) *
      Cfg::kKRowBytes;
  const int k_hi = (lane >> 3) & 1;
  float4* x_lane = s_x + w4 * (kM * Cfg::kSTiles) * 32 + lane;  // the pair's exchange tile
  const int pair_barrier = static_cast<int>(Barrier::kPairBase) + w4;

  // dQ roles: warp (q_rg, cg).
  const int q_rg = warp % Cfg::kRowGroups, cg = warp / Cfg::kRowGroups;
  const int q_row0 = 32 * q_rg;
  const int q_chunk0 = cg * Cfg::kQCols / 8;
  // dS' (A of dQ), m16 tile m: row q_row0 + 16 m + (lane & 15), key 16 ks + 8 (lane >> 4).
  const uint32_t ds_lane = sds + ((q_row0 + (lane & 15)) * Cfg::kPPitch + 8 * (lane >> 4)) * 2;
  // Rows of a transposed B operand (K for dQ, Q / dO for dKV): 16 ks + b_row, chunk + (lane >> 4).
  const int b_row = (lane & 7) + 8 * ((lane >> 3) & 1);
  const int b_hi = lane >> 4;
  // dS'^T / P^T (A of dKV, ldmatrix.trans of the [head][key] tiles), key tile mt, head step ks:
  // head 16 ks + (lane & 7) + 8 (lane >> 4), key 16 mt + 8 ((lane >> 3) & 1).
  const uint32_t at_lane =
      (((lane & 7) + 8 * (lane >> 4)) * Cfg::kPPitch + 8 * ((lane >> 3) & 1)) * 2;

  float dq[kM][Cfg::kQTiles][4];
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int nt = 0; nt < Cfg::kQTiles; ++nt)
      dq[m][nt][0] = dq[m][nt][1] = dq[m][nt][2] = dq[m][nt][3] = 0.f;

  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    const int stage = chunk & 1;
    // [1] This thread's copies of chunk `chunk` have landed; after the barrier everyone's have,
    // and every warp is done with chunk - 1 (its stage, X, P, dS' and index slots are free).
    dsa::cp_async_wait_all();
    __syncthreads();
    // [2] Prefetch the next chunk into the other stage; its index was loaded one chunk ago.
    if (chunk + 1 < n_chunks) {
      gather(stage ^ 1, next_j);
      dsa::cp_async_commit();
      if (chunk + 2 < n_chunks) next_j = load_index(chunk + 2);
    }
    const uint32_t k_stage = sk + stage * Cfg::kKStageBytes;
    const int32_t* kidx = s_kidx + stage * N;

    // [3] Phase A: S = Q K^T (S warps) or dP = dO V^T (dP warps) for the pair's tile.
    {
      float acc[kM][Cfg::kSTiles][4];
#pragma unroll
      for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int nt = 0; nt < Cfg::kSTiles; ++nt)
          acc[m][nt][0] = acc[m][nt][1] = acc[m][nt][2] = acc[m][nt][3] = 0.f;
      if (a_row0 < rows)
        dsa::warp_mma_abt<kM, Cfg::kSTiles, Ops>(acc, a_lane, a_row_bytes, a_hi, k_stage + k_lane,
                                                 k_hi, x, a_kblocks);
      if (!is_dp) {
        // Hand S to the dP partner: same tile, same lane layout.
#pragma unroll
        for (int m = 0; m < kM; ++m)
#pragma unroll
          for (int nt = 0; nt < Cfg::kSTiles; ++nt)
            x_lane[(m * Cfg::kSTiles + nt) * 32] =
                make_float4(acc[m][nt][0], acc[m][nt][1], acc[m][nt][2], acc[m][nt][3]);
      }
      // The pair's hand-off of X: both warps bar.sync (S after writing X, dP before reading it).
      // The S warp used to bar.arrive (no wait), which is correct but which racecheck evidently
      // mis-models (it was the library's only bar.arrive and this the only kernel with hazards):
      // it reported the dS' stores below against the dQ ldmatrix after [4], and the dQ
      // ldmatrix.trans of stage st against the gather into st after [1] of the next chunk, pairs
      // that a full bar.sync 0 orders in the SASS; every lane's ldmatrix address is inside its
      // tile. Waiting here costs the S warp nothing: it has no work before [4], and [4] cannot
      // complete before its dP partner has passed this barrier anyway.
      dsa::named_barrier_sync(pair_barrier, kPairThreads);
      if (is_dp) {
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          const int r0 = a_row0 + 16 * m + g;  // and r0 + 8
          const float l2_0 = s_l2[r0], l2_1 = s_l2[r0 + 8];
          const float d_0 = s_delta[r0], d_1 = s_delta[r0 + 8];
#pragma unroll
          for (int nt = 0; nt < Cfg::kSTiles; ++nt) {
            const float4 s = x_lane[(m * Cfg::kSTiles + nt) * 32];
            const int c = kp * Cfg::kWarpKeys + 8 * nt + 2 * t4;
            const bool act0 = kidx[c] >= 0, act1 = kidx[c + 1] >= 0;
            // P = 2^(s log2(e) scale - L), at most 1; L = +inf gives 0. Inactive keys: exactly 0.
            const float p00 = act0 ? exp2_prob(fmaf(s.x, p.scale_log2, -l2_0)) : 0.f;
            const float p01 = act1 ? exp2_prob(fmaf(s.y, p.scale_log2, -l2_0)) : 0.f;
            const float p10 = act0 ? exp2_prob(fmaf(s.z, p.scale_log2, -l2_1)) : 0.f;
            const float p11 = act1 ? exp2_prob(fmaf(s.w, p.scale_log2, -l2_1)) : 0.f;
            const float ds00 = p00 * (acc[m][nt][0] - d_0) * p.scale;
            const float ds01 = p01 * (acc[m][nt][1] - d_0) * p.scale;
            const float ds10 = p10 * (acc[m][nt][2] - d_1) * p.scale;
            const float ds11 = p11 * (acc[m][nt][3] - d_1) * p.scale;
            const int w0 = (r0 * Cfg::kPPitch + c) >> 1, w1 = ((r0 + 8) * Cfg::kPPitch + c) >> 1;
            s_p_words[w0] = pack2<Element>(p00, p01);
            s_p_words[w1] = pack2<Element>(p10, p11);
            s_ds_words[w0] = pack2<Element>(ds00, ds01);
            s_ds_words[w1] = pack2<Element>(ds10, ds11);
          }
        }
      }
    }
    // [4] P and dS' of the whole chunk are in shared memory.
    __syncthreads();

    // [5] dQ += dS' K for this warp's 32 rows and kQCols columns (k = the chunk's 32 keys).
    if (q_row0 < rows) {
#pragma unroll
      for (int ks = 0; ks < N / 16; ++ks) {
        uint32_t da[kM][4];
#pragma unroll
        for (int m = 0; m < kM; ++m)
          dsa::ldmatrix_x4(ds_lane + (m * 16 * Cfg::kPPitch + 16 * ks) * 2, da[m]);
        const uint32_t k_rows = k_stage + (16 * ks + b_row) * Cfg::kKRowBytes;
#pragma unroll
        for (int np = 0; np < Cfg::kQTiles / 2; ++np) {
          const int ch = q_chunk0 + 2 * np + b_hi;
          uint32_t vf[4];
          dsa::ldmatrix_x4_trans(k_rows + ((ch ^ x) << 4), vf);
#pragma unroll
          for (int m = 0; m < kM; ++m) {
            Ops::mma(dq[m][2 * np], da[m], vf[0], vf[1]);
            Ops::mma(dq[m][2 * np + 1], da[m], vf[2], vf[3]);
          }
        }
        if constexpr (Cfg::kQTiles % 2 == 1) {
          const int ch = q_chunk0 + Cfg::kQTiles - 1;
          uint32_t v0, v1;
          dsa::ldmatrix_x2_trans(k_rows + ((ch ^ x) << 4), v0, v1);
#pragma unroll
          for (int m = 0; m < kM; ++m) Ops::mma(dq[m][Cfg::kQTiles - 1], da[m], v0, v1);
        }
      }
    }

    // [6] dKV of the chunk's keys: value columns [64 warp, +64) in pieces, then the rope block.
    // This thread's accumulator rows are keys 16 mt + g + 8 i of the chunk.
    int32_t kj[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int i = 0; i < 2; ++i) kj[mt][i] = kidx[16 * mt + g + 8 * i];
    float* const part_chunk =
        p.deterministic
            ? p.dkv_part +
                  ((tok_local * p.head_groups + grp) * p.topk + int64_t{chunk} * N) * Cfg::kDqk
            : nullptr;
    // Reduces (or, deterministic, stores) a finished [32 keys x 8 tiles] piece from column col0.
    auto emit = [&](const auto& acc, int col0) {
      constexpr int tiles = std::extent_v<std::remove_reference_t<decltype(acc)>, 1>;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int32_t j = kj[mt][i];
          if (j < 0) continue;  // inactive slot: no gradient
          float* dst = (p.deterministic ? part_chunk + (16 * mt + g + 8 * i) * Cfg::kDqk
                                        : p.dkv_acc + j * int64_t{Cfg::kDqk}) +
                       col0 + 2 * t4;
#pragma unroll
          for (int nt = 0; nt < tiles; ++nt) {
            if (p.deterministic) {
              *reinterpret_cast<float2*>(dst + 8 * nt) =
                  make_float2(acc[mt][nt][2 * i], acc[mt][nt][2 * i + 1]);
            } else {
              red_add_f32x2(dst + 8 * nt, acc[mt][nt][2 * i], acc[mt][nt][2 * i + 1]);
            }
          }
        }
      }
    };
#pragma unroll
    for (int piece = 0; piece < Cfg::kPieces; ++piece) {
      float acc[2][Cfg::kPieceTiles][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < Cfg::kPieceTiles; ++nt)
          acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
      const int ch0 = warp * (Cfg::kValueCols / 8) + piece * Cfg::kPieceTiles;
#pragma unroll
      for (int ks = 0; ks < Cfg::kHeadSteps; ++ks) {
        if (16 * ks >= rows) break;  // heads past H: P = dS' = 0
#pragma unroll
        for (int term = 0; term < 2; ++term) {  // dS'^T Q, then P^T dO
          const uint32_t a_tile = term == 0 ? sds : sp;
          const uint32_t b_rows = term == 0 ? sq + (16 * ks + b_row) * Cfg::kQRowBytes
                                            : sdo + (16 * ks + b_row) * Cfg::kDoRowBytes;
          uint32_t a[2][4];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
            dsa::ldmatrix_x4_trans(a_tile + at_lane + (16 * ks * Cfg::kPPitch + 16 * mt) * 2,
                                   a[mt]);
#pragma unroll
          for (int np = 0; np < Cfg::kPieceTiles / 2; ++np) {
            const int ch = ch0 + 2 * np + b_hi;
            uint32_t bf[4];
            dsa::ldmatrix_x4_trans(b_rows + ((ch ^ x) << 4), bf);
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              Ops::mma(acc[mt][2 * np], a[mt], bf[0], bf[1]);
              Ops::mma(acc[mt][2 * np + 1], a[mt], bf[2], bf[3]);
            }
          }
        }
      }
      emit(acc, ch0 * 8);
    }
    if constexpr (Cfg::kRope) {
      // Rope columns 512 + 8 warp: dS'^T Q only (the value is the first 512 columns).
      float acc[2][1][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
        acc[mt][0][0] = acc[mt][0][1] = acc[mt][0][2] = acc[mt][0][3] = 0.f;
      const int ch = Cfg::kDv / 8 + warp;
#pragma unroll
      for (int ks = 0; ks < Cfg::kHeadSteps; ++ks) {
        if (16 * ks >= rows) break;
        uint32_t a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
          dsa::ldmatrix_x4_trans(sds + at_lane + (16 * ks * Cfg::kPPitch + 16 * mt) * 2, a[mt]);
        uint32_t b0, b1;
        dsa::ldmatrix_x2_trans(sq + (16 * ks + b_row) * Cfg::kQRowBytes + ((ch ^ x) << 4), b0, b1);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) Ops::mma(acc[mt][0], a[mt], b0, b1);
      }
      emit(acc, ch * 8);
    }
  }

  // [7] dq rows of this CTA (zeros for an empty row); every element of rows < H is written.
  if (q_row0 < rows) {
    Element* dq_tok = static_cast<Element*>(p.dq) + tok * p.dq_ss;
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = q_row0 + 16 * m + g + 8 * i;
        if (row >= rows) continue;
        Element* dst = dq_tok + (h0 + row) * p.dq_sh + q_chunk0 * 8 + 2 * t4;
#pragma unroll
        for (int nt = 0; nt < Cfg::kQTiles; ++nt)
          *reinterpret_cast<uint32_t*>(dst + 8 * nt) =
              pack2<Element>(dq[m][nt][2 * i], dq[m][nt][2 * i + 1]);
      }
    }
  }
  // The d_sink term of each row: -exp(sink - L) delta when the row takes part (an active slot and
  // a finite lse, as in the reference), else 0.
  const int any_active = __syncthreads_or(saw_active ? 1 : 0);
  if (p.sink_terms != nullptr && tid < rows) {
    float term = 0.f;
    if (any_active && p.sink != nullptr) {
      const int h = h0 + tid;
      const float lse = p.lse[tok * p.lse_ss + h * p.lse_sh];
      if (lse < kInf) term = -sink_share(lse, p.sink[h * p.sink_s]) * s_delta[tid];
    }
    p.sink_terms[(h0 + tid) * p.sq + tok] = term;
  }
}

}  // namespace sa::portable::dsa_bwd
