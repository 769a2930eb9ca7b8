// The Hopper (sm_90a, wgmma) indexer loss kernel (SPEC 5), sparse and dense mode (kDense),
// non-deterministic: the portable loss kernel's contract, passes and math
// (cuda/indexer_loss_kernel.cuh, [a] .. [f]; its row math, the list compaction, log Z_A, the
// empty row, the sparse and dense loss, dI and dw are that file's functions, called by both
// kernels), with the four indexer GEMMs per chunk on wgmma instead of mma.sync + ldmatrix.
// The pipelined kernels of indexer_loss_pipe_kernel.cuh, built from this file's pieces, are the
// defaults in both modes (docs/indexer_decisions.md); sm90/indexer_loss.cu decides where each
// kernel serves, the portable kernel serves everything else and the internal tuning
// Tuning::sm90_indexer_loss_kernel = 3.
//
// Dense mode: K_t is the range [begin, begin + n), so a chunk is 64 consecutive k_I rows (the
// same 16-byte cp.async per row, the tail chunk's rows past n zero-filled and masked out of I, G,
// dw and the dk reductions as the sparse list's end is); no list in shared memory. log A_g of a
// chunk's keys (the target's dense workspace, [groups, slice, S_kv]) is copied with the chunk
// (4-byte cp.async, two stages of groups x 64 fp32) and combined per key from shared memory
// (log_a_combine), so its DRAM latency hides under the previous chunk as the k_I rows' does;
// [b] reads the workspace directly (log_a_at), as the portable kernel. Pass 1 folds I into the
// portable kernel's running sums (DenseRowSums), [d] is its dense_row_loss, pass 2 recomputes I
// and dI = dense_di from it; the GEMMs are the sparse mode's. Dense mode with two tokens per CTA
// (tuning 2): loss_sm90_pair_kernel at the end of this file, built from the same pieces (gemm1,
// wg_row_scores, g_epilogue, dq_issue, store_dq and the shared row functions).
//
// This is the first step of the research design (docs/research/indexer_loss_cudnn_vs_ours.md,
// section 3, change 2), not all of it: one warpgroup per CTA and one CTA per token, as the
// portable kernel (so its list, reductions, empty rows and [d] are reused as they are), with no
// producer warpgroup, no persistence and no TMA. What it takes from the design is the GEMM side:
//
//   GEMM1  a[64 keys x H_I] = k_I q_I^T          wgmma m64n{H_I}k16 SS x 8 (A = the k_I stage,
//          (passes 1 and 2)                      B = q_I, both K-major, 128-byte swizzle); keys
//                                                as M: warp w holds keys [16 w, +16), lane (g,
//                                                t4) rows g, g + 8 and columns 8 j + 2 t4 (+1):
//                                                the portable mma.sync tile's layout, so I =
//                                                sum_j w_j relu(a_j) is the portable kernel's
//                                                association (columns n-tile by n-tile, then the
//                                                quad, xor 1 then 2) on the same fp32 a up to
//                                                the tensor core's order of the k16 sums.
//   dK     dk[64 keys x 128] = Gw q_I            wgmma m64n64k16 RS x H_I/16 per half of 128
//                                                columns (A = scale_I w G in bf16 straight
//                                                from GEMM1's accumulator: the m64nNk16 C layout
//                                                is the RS A layout, word i = C[2i], C[2i + 1];
//                                                B = q_I seen MN-major), then fp32
//                                                red.global.add.v2 as the portable kernel.
//   dQ     dq^T[128 x H_I] += k_I^T G            wgmma m64n{H_I}k16 SS x 4 k16 steps x 2 M tiles
//                                                (A = the k_I stage seen MN-major, B = G [keys x
//                                                H_I] in shared memory, MN-major, 32/64/128-byte
//                                                swizzle for H_I 16/32/64): d as M so that H_I 16
//                                                and 32 need no padding; accumulated over the
//                                                token's chunks in registers.
//
// Timeline per token (one warpgroup, the CTA): [a] [b] (portable code) | q_I, w, chunk 0 by
// cp.async | pass 1: per 64-key chunk: wait + fence.proxy.async + bar | gather of chunk + 1 into
// the other stage | GEMM1 | I -> the list | [d] | pass 2: per chunk: wait + fence + bar | gather
// of chunk + 1 | GEMM1 | dI, G, dw, Gw -> registers, G -> shared | dK half 0, reductions, dK
// half 1, reductions | fence + bar | dQ (wait 0 before the next chunk's gather reuses the stage)
// | [f] dq_I (bf16, direct stores from the dq^T fragment), dw.
//
// Registers per thread (H_I 64): dq^T 64 fp32, a 32, dk half 32, Gw fragment 16, dw 16, the
// rest (addresses, dI, loop) ~30: under the 255 of __launch_bounds__(128, 2). ptxas (CUDA 13.0,
// sm_90a): sparse 191 / 126 / 94 registers at H_I 64 / 32 / 16, dense 194 / 161 / 105; no
// stack, no spills, no C75xx wgmma-serialization notes (docs/indexer_decisions.md, "The sm90 loss
// kernel").
// Shared memory (bytes, from a 1024-aligned base): q_I H_I x 256 (two K-major 128-byte-swizzled
// panels of 64 columns), k_I 2 stages x 16,384 (the same), G 64 x 2 H_I, then the portable
// kernel's w, scratch, dw, counts and per-slot list (16 bytes per slot, topk rounded up to
// 128): H_I 64, topk 2048: 16,384 + 32,768 + 8,192 + 1,856 + 32,768 = 91,968 + 1,024 slack:
// two CTAs per SM. Dense: the list's place holds log A_g of two chunks, 512 bytes per head
// group: H_I 64, H 128: 59,200 + 1,024 + 1,024 slack = 61,248 bytes (two CTAs per SM: the
// registers bind).
#pragma once

#include <cstdint>

#include <cute/arch/mma_sm90.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "common/device_math.cuh"
#include "cuda/indexer_loss_kernel.cuh"  // LossParams, block_reduce, log_a_at
#include "sm90/dsa_common.cuh"
#include "sm90/hopper_primitives.cuh"

namespace sa::sm90::loss {

using portable::indexer::LossParams;

template <int kHeads_>
struct LossTraits {
  using Element = cutlass::bfloat16_t;
  static constexpr int kHeads = kHeads_;
  static constexpr int kThreads = 128;  // one warpgroup
  static constexpr int kWarps = 4;
  static constexpr int kChunk = 64;  // keys per chunk (16 per warp)
  static constexpr int kNt = kHeads / 8;
  static constexpr int kKSteps = kHeads / 16;
  static_assert(kHeads == 16 || kHeads == 32 || kHeads == 64, "H_I 16, 32 or 64");

  using HT = cute::Int<kHeads>;
  using N64 = cute::Int<64>;
  using D64 = cute::Int<64>;
  using D128 = cute::Int<128>;
  using K16 = cute::Int<16>;
  // GEMM1: a = k_I q_I^T, keys as M.
  using Mma1 = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<Element, Element, float, cute::Shape<N64, HT, K16>,
                                       cute::SM90::GMMA::Major::K,
                                       cute::SM90::GMMA::Major::K>()));
  // dK: (keys x heads, registers) x (heads x 64 columns of q_I, MN-major).
  using Mma2 = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::rs_op_selector<Element, Element, float, cute::Shape<N64, D64, K16>,
                                       cute::SM90::GMMA::Major::K,
                                       cute::SM90::GMMA::Major::MN>()));
  // dQ^T: (d x keys, the k_I stage MN-major) x (keys x heads, G MN-major).
  using Mma3 = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<Element, Element, float, cute::Shape<N64, HT, K16>,
                                       cute::SM90::GMMA::Major::MN,
                                       cute::SM90::GMMA::Major::MN>()));

  // q_I (H_I, 128) and a k_I stage (64, 128): K-major, two 64-column panels of 128-byte rows.
  using LayoutQ = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<HT, D128>{}));
  using LayoutK = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<N64, D128>{}));
  // The same bytes MN-major: one q_I panel as (64 columns, H_I), a stage as (128 columns, 64
  // keys) (keys fastest across atoms: panel by panel).
  using LayoutQPanelT = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_MN_SW128_Atom<Element>{}, cute::Shape<D64, HT>{}));
  using LayoutKT = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_MN_SW128_Atom<Element>{}, cute::Shape<D128, N64>{},
      cute::Step<cute::_2, cute::_1>{}));
  // G as (H_I, 64 keys), heads contiguous: rows of 2 H_I bytes, the swizzle of that width.
  using GAtom = std::conditional_t<
      kHeads == 64, cute::SM90::GMMA::Layout_MN_SW128_Atom<Element>,
      std::conditional_t<kHeads == 32, cute::SM90::GMMA::Layout_MN_SW64_Atom<Element>,
                         cute::SM90::GMMA::Layout_MN_SW32_Atom<Element>>>;
  using LayoutG = decltype(cute::tile_to_shape(GAtom{}, cute::Shape<HT, N64>{}));
  // Byte offset of (head h, even; key k) in G: the linear offset with the hardware swizzle of
  // the row width (16-byte chunk bits 4.. XOR the row bits 7..).
  static constexpr uint32_t kGSwizzleMask = kHeads == 64 ? 7u : kHeads == 32 ? 3u : 1u;
  __host__ __device__ static uint32_t g_offset(int h, int k) {
    const uint32_t lin = static_cast<uint32_t>((k * kHeads + h) * 2);
    return lin ^ (((lin >> 7) & kGSwizzleMask) << 4);
  }

  // Shared memory (offsets from the 1024-aligned base).
  static constexpr int kQBytes = kHeads * 256;
  static constexpr int kQPanelBytes = kHeads * 128;
  static constexpr int kStageBytes = kChunk * 256;
  static constexpr int kPanelBytes = kChunk * 128;
  static constexpr int kQOff = 0;
  static constexpr int kKOff = kQOff + kQBytes;
  static constexpr int kGOff = kKOff + 2 * kStageBytes;
  static constexpr int kWOff = kGOff + kChunk * kHeads * 2;
  static constexpr int kRedOff = kWOff + kHeads * 4;
  static constexpr int kDwOff = kRedOff + kThreads * 4;
  static constexpr int kCountOff = kDwOff + kWarps * kHeads * 4;
  static constexpr int kListOff = kCountOff + 16 * 4;
  static_assert(kKOff % 1024 == 0 && kGOff % 1024 == 0, "swizzled tiles on 1024 bytes");
  static constexpr int list_slots(int topk) { return (topk + kThreads - 1) / kThreads * kThreads; }
  // Sparse: 16 bytes per slot of the list. Dense: the chunks' log A_g, 2 stages x `groups` x 64
  // fp32 (H 128: 1 KB).
  static constexpr int smem_bytes(int topk) { return kListOff + 16 * list_slots(topk) + 1024; }
  static constexpr int dense_smem_bytes(int groups) {
    return kListOff + 2 * groups * kChunk * 4 + 1024;
  }
};

// I of this thread's two rows (g, g + 8) from GEMM1's (scaled) fragment: the portable
// kernel's sum (quad_row_scores) on the wgmma fragment (index 4 nt + c: the mma.sync C layout).
template <class T, class Frag>
__device__ __forceinline__ void wg_row_scores(const Frag& acc, const float* s_w, float (&row)[2]) {
  portable::indexer::quad_row_scores<T::kNt>([&](int nt, int c) { return acc(4 * nt + c); }, s_w,
                                             row);
}

// GEMM1 of the chunk in k_stage, acc = k_I q_I^T (64 keys x H_I), appended as one wgmma batch
// (arrive, issue, commit; the caller waits, then scale_acc); wtid: the thread's index in its
// warpgroup.
template <class T, class Frag>
__device__ __forceinline__ void gemm1_issue(typename T::Element* k_stage, typename T::Element* q,
                                            Frag& acc, int wtid) {
  using namespace cute;
  typename T::Mma1 mma;
  auto thr = mma.get_thread_slice(wtid);
  Tensor sK = make_tensor(make_smem_ptr(k_stage), typename T::LayoutK{});
  Tensor sQ = make_tensor(make_smem_ptr(q), typename T::LayoutQ{});
  Tensor tA = thr.partition_fragment_A(sK);
  Tensor tB = thr.partition_fragment_B(sQ);
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  gemm_ss(mma, tA, tB, acc, true);
  warpgroup_commit_batch();
}

// After GEMM1's batch retired: acc *= scale_I.
template <class Frag>
__device__ __forceinline__ void scale_acc(Frag& acc, float scale) {
  cute::warpgroup_fence_operand(acc);
  CUTE_UNROLL
  for (int i = 0; i < cute::size(acc); ++i) acc(i) *= scale;
}

// GEMM1 waited for: acc = scale_I k_I q_I^T.
template <class T, class Frag>
__device__ __forceinline__ void gemm1(typename T::Element* k_stage, typename T::Element* q,
                                      float scale, Frag& acc, int wtid) {
  gemm1_issue<T>(k_stage, q, acc, wtid);
  cute::warpgroup_wait<0>();
  scale_acc(acc, scale);
}

// Pass 2, after GEMM1 (rows g, g + 8 of warp `warp` of the warpgroup): G = dI [a > 0] in bf16
// -> shared memory at sg ([key][head], swizzled: g_offset), dw_j += dI relu(a_j); kRs: also the
// RS A operand of dK, scale_I w_j G in bf16 (ag32: its 32-bit words, the C fragment's order).
template <class T, bool kRs, class Frag, class AFrag>
__device__ __forceinline__ void g_epilogue(const Frag& acc, const float (&di)[2], const float* s_w,
                                           float scale, float (&dw_acc)[T::kNt][2], AFrag& ag32,
                                           uint32_t sg, int warp) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  CUTE_UNROLL
  for (int nt = 0; nt < T::kNt; ++nt) {
    const float2 wv = *reinterpret_cast<const float2*>(s_w + 8 * nt + 2 * t4);
    float gv[4];
    CUTE_UNROLL
    for (int c = 0; c < 4; ++c) {
      const float a = acc(4 * nt + c);
      const float dI = di[c >> 1];
      dw_acc[nt][c & 1] = fmaf(dI, fmaxf(a, 0.f), dw_acc[nt][c & 1]);
      gv[c] = a > 0.f ? dI : 0.f;
    }
    if constexpr (kRs) {
      float coef[4];
      CUTE_UNROLL
      for (int c = 0; c < 4; ++c) coef[c] = gv[c] * ((c & 1) ? wv.y : wv.x) * scale;
      ag32(2 * nt) = pack2<__nv_bfloat16>(coef[0], coef[1]);
      ag32(2 * nt + 1) = pack2<__nv_bfloat16>(coef[2], coef[3]);
    }
    CUTE_UNROLL
    for (int i = 0; i < 2; ++i)
      st_shared_u32(sg + T::g_offset(8 * nt + 2 * t4, 16 * warp + g + 8 * i),
                    pack2<__nv_bfloat16>(gv[2 * i], gv[2 * i + 1]));
  }
}

// The RS A operand of dK (ag32, g_epilogue<kRs>'s words) rebuilt from the G that g_epilogue
// stored at sg (the words this thread stored itself, so no barrier is needed): G_ij is dI_i where
// a_ij > 0 and 0 elsewhere, so A_ij = dI_i w_j scale_I where G_ij != 0, else 0 -- g_epilogue's
// fp32 product and bits, except where dI_i != 0 rounds to a bf16 zero (|dI| < 2^-133: A = 0 here)
// or w_j is not finite where G_ij = 0 (0 here, NaN there).
template <class T, class AFrag>
__device__ __forceinline__ void rs_a_from_g(const float (&di)[2], const float* s_w, float scale,
                                            AFrag& ag32, uint32_t sg, int warp) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  CUTE_UNROLL
  for (int nt = 0; nt < T::kNt; ++nt) {
    const float2 wv = *reinterpret_cast<const float2*>(s_w + 8 * nt + 2 * t4);
    CUTE_UNROLL
    for (int i = 0; i < 2; ++i) {
      const uint32_t gw = ld_shared_u32(sg + T::g_offset(8 * nt + 2 * t4, 16 * warp + g + 8 * i));
      const float lo = (gw & 0x7fffu) != 0u ? di[i] * wv.x * scale : 0.f;
      const float hi = (gw & 0x7fff0000u) != 0u ? di[i] * wv.y * scale : 0.f;
      ag32(2 * nt + i) = pack2<__nv_bfloat16>(lo, hi);
    }
  }
}

// dQ^T (128 x H_I) += k_I^T G over a chunk, appended as one wgmma batch (arrive, issue, commit;
// the caller waits): A = the k_I stage seen MN-major, B = the token's G (MN-major).
template <class T, class Thr, class Frag>
__device__ __forceinline__ void dq_issue(typename T::Mma3& mma3, Thr& thr3,
                                         typename T::Element* k_stage, typename T::Element* g,
                                         Frag& dq) {
  using namespace cute;
  Tensor sKt = make_tensor(make_smem_ptr(k_stage), typename T::LayoutKT{});
  Tensor sGt = make_tensor(make_smem_ptr(g), typename T::LayoutG{});
  Tensor tA3 = thr3.partition_fragment_A(sKt);  // (MMA, 2, 4)
  Tensor tB3 = thr3.partition_fragment_B(sGt);  // (MMA, 1, 4)
  warpgroup_fence_operand(dq);
  warpgroup_arrive();
  gemm_ss(mma3, tA3, tB3, dq, false);
  warpgroup_commit_batch();
}

// dK of a chunk, columns [64 half, +64): dk[64 keys x 64] = (scale_I w G, the RS A fragment tAg:
// g_epilogue's ag32) x q_I's panel `half` seen MN-major (H_I x 64), appended as one wgmma batch
// (arrive, issue, commit; the caller waits, then fences dk and tAg before touching them).
template <class T, class Thr, class AFrag, class Frag>
__device__ __forceinline__ void dk_rs_issue(typename T::Mma2& mma2, Thr& thr2,
                                            typename T::Element* q_el, int half, AFrag& tAg,
                                            Frag& dk) {
  using namespace cute;
  Tensor sQh = make_tensor(make_smem_ptr(fresh_ptr(q_el) + half * (T::kQPanelBytes / 2)),
                           typename T::LayoutQPanelT{});
  Tensor tBq = thr2.partition_fragment_B(sQh);  // (MMA, 1, H_I / 16)
  warpgroup_fence_operand(dk);
  warpgroup_fence_operand(tAg);
  warpgroup_arrive();
  mma2.accumulate_ = SM90::GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int kb = 0; kb < T::kKSteps; ++kb) {
    cute::gemm(mma2, tAg(_, _, kb), tBq(_, _, kb), dk);
    mma2.accumulate_ = SM90::GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

// [f] dq_I[t, j, d] = scale_I w_j dq^T[d, j] (bf16); dq fragment (c + 2 r + 4 j, m): d = 64 m
// + 16 warp + g + 8 r, head 8 j + 2 t4 + c.
template <class T, class Frag>
__device__ __forceinline__ void store_dq(const Frag& dq, const LossParams& p, int64_t tok,
                                         const float* s_w, int warp) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  __nv_bfloat16* const dq_tok = p.dq_I + tok * p.dq_ss;
  CUTE_UNROLL
  for (int nt = 0; nt < T::kNt; ++nt) {
    CUTE_UNROLL
    for (int c = 0; c < 2; ++c) {
      const int j = 8 * nt + 2 * t4 + c;
      const float f = p.scale_I * s_w[j];
      __nv_bfloat16* const row = dq_tok + j * p.dq_sh;
      CUTE_UNROLL
      for (int m = 0; m < 2; ++m)
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r)
          row[64 * m + 16 * warp + g + 8 * r] =
              __float2bfloat16_rn(dq(4 * nt + 2 * r + c, m, 0) * f);
    }
  }
}

// [c] q_I of token `tok` (two K-major 128-byte-swizzled panels at `sq`) and its w (s_w), by the
// `kCopiers` threads `thread` of the token's warpgroup(s), each copying the 16-byte chunks
// cp_chunk (= thread & 15, as the caller's k_I gather) of its rows; zeros for a token that is not
// live.
template <class T, int kCopiers>
__device__ __forceinline__ void load_q_and_w(const LossParams& p, int64_t tok, bool live,
                                             uint32_t sq, float* s_w, int thread, int cp_chunk) {
  const __nv_bfloat16* q_tok = p.q_I + (live ? tok : 0) * p.qi_ss;
  for (int r = thread >> 4; r < T::kHeads; r += kCopiers / 16)
    cp_async_16_zfill(sq + (cp_chunk >> 3) * T::kQPanelBytes + swz(r, cp_chunk & 7),
                      q_tok + r * p.qi_sh + cp_chunk * 8, live ? 16 : 0);
  for (int j = thread; j < T::kHeads; j += kCopiers)
    s_w[j] = live ? p.w[tok * p.w_ss + j * p.w_sh] : 0.f;
}

// A chunk's 64 k_I rows into `stage` of the ring at `sk` by the CTA's `kCopiers` threads:
// position pos of the chunk is key key_of(pos) when pos < n, else a zero-filled row.
template <class T, int kCopiers, class KeyOf>
__device__ __forceinline__ void gather_k_rows(const LossParams& p, uint32_t sk, int chunk,
                                              int stage, int n, KeyOf key_of, int thread) {
  const int cp_chunk = thread & 15;  // 16-byte chunk of a 256-byte row: panel cp_chunk / 8
  CUTE_UNROLL
  for (int i = 0; i < T::kChunk / (kCopiers / 16); ++i) {
    const int r = (thread >> 4) + i * (kCopiers / 16);
    const int pos = chunk * T::kChunk + r;
    const bool valid = pos < n;
    const __nv_bfloat16* src = valid ? p.k_I + key_of(pos) * p.ki_ss + cp_chunk * 8 : p.k_I;
    cp_async_16_zfill(sk + stage * T::kStageBytes + (cp_chunk >> 3) * T::kPanelBytes +
                          swz(r, cp_chunk & 7),
                      src, valid ? 16 : 0);
  }
}

// Every thread's cp.async data (and, in pass 2, G) visible to the wgmma (async proxy) of the
// whole CTA.
__device__ __forceinline__ void landed_barrier() {
  cp_async_wait_all();
  fence_proxy_async_shared();
  __syncthreads();
}

// The fp32 reductions of a dK fragment's 64 columns (m64n64 C layout) into the accumulator rows,
// in quad-16 column order (quad16_pair, dsa_common.cuh; the driver converts dk_acc with
// AccColumns::kQuad16): row_dst(R) gives the accumulator row of the warpgroup's fragment row R
// (0..63) at this fragment's column 0, or nullptr when R adds nothing. Each red.v4 warp
// instruction covers four rows' 128 contiguous bytes (with red.v2 in natural order, eight rows'
// 32: a quarter of the L2 requests and half the instructions).
template <class Frag, class RowDst>
__device__ __forceinline__ void reduce_dk_rows(const Frag& dk, int lane, int warp,
                                               RowDst&& row_dst) {
  const int g = lane >> 2;
  const int at = 16 * (g & 1) + 4 * (lane % 4);
  CUTE_UNROLL
  for (int r = 0; r < 2; ++r) {
    float4 evn[2], odd[2];
    quad16_pair(dk, r, lane, evn, odd);
    const int re = 16 * warp + 8 * r + (g & 6);
    float* const de = row_dst(re);
    float* const dd = row_dst(re + 1);
    if (de != nullptr) {
      red_add_f32x4(de + at, evn[0]);
      red_add_f32x4(de + at + 32, evn[1]);
    }
    if (dd != nullptr) {
      red_add_f32x4(dd + at, odd[0]);
      red_add_f32x4(dd + at + 32, odd[1]);
    }
  }
}

template <class T, bool kDense>
__global__ void __launch_bounds__(T::kThreads, 2) loss_sm90_kernel(const __grid_constant__ LossParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using Element = typename T::Element;
  using namespace portable::indexer;  // the row math both loss kernels share
  constexpr int kT = T::kThreads;
  constexpr int kChunk = T::kChunk;
  constexpr int kHeads = T::kHeads;
  const float kInf = INFINITY;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = align_smem_1024(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  // Dense: the heaviest tokens first; sparse: token order (indexer_decisions.md, session 46).
  const int64_t tok = p.tok_begin + (kDense ? heavy_first_cta() : blockIdx.x);
  const IndexerDims& d = p.dims;
  const int slots = kDense ? 0 : T::list_slots(p.topk);
  // Sparse: the per-slot list. Dense: log A_g of two chunks, [stage][group][64] fp32.
  int32_t* s_key = reinterpret_cast<int32_t*>(smem + T::kListOff);
  int32_t* s_slot = s_key + slots;
  float* s_la = reinterpret_cast<float*>(s_slot + slots);
  float* s_val = s_la + slots;
  float* const s_lag = reinterpret_cast<float*>(smem + T::kListOff);
  float* s_w = reinterpret_cast<float*>(smem + T::kWOff);
  float* s_red = reinterpret_cast<float*>(smem + T::kRedOff);
  float* s_dw = reinterpret_cast<float*>(smem + T::kDwOff);
  int* s_count = reinterpret_cast<int*>(smem + T::kCountOff);
  const uint32_t sq = smem_u32(smem + T::kQOff);
  const uint32_t sk = smem_u32(smem + T::kKOff);
  const uint32_t sg = smem_u32(smem + T::kGOff);

  // [a] K_t: sparse in slot order (no deterministic partial rows here); dense the range.
  int n = 0;
  int64_t begin = 0;
  if constexpr (kDense) {
    begin = p.meta.range_begin(tok, d);
    n = static_cast<int>(p.meta.range_size(tok, d));
  } else {
    n = compact_slots<kT>(p, tok, s_key, s_slot, s_la, s_count, [](int) {});
  }

  // [b] log Z_A; an empty row.
  auto la_of = [&](int i) { return kDense ? log_a_at(p, tok, i) : s_la[i]; };
  const float log_za = row_log_z_a<kT>(n, la_of, s_red);
  if (n == 0 || log_za == -kInf) {
    write_empty_row<kT, kHeads>(p, tok);
    return;
  }

  // [c] q_I (two K-major panels) and w of the token; chunk 0 of the k_I rows (dense: and of
  // log A_g).
  load_q_and_w<T, kT>(p, tok, true, sq, s_w, tid, tid & 15);
  const int n_chunks = (n + kChunk - 1) / kChunk;
  // The key of position i of K_t: dense keys are contiguous, so a chunk is 64 consecutive rows.
  auto key_of = [&](int i) {
    if constexpr (kDense) return begin + i;
    else return int64_t{s_key[i]};
  };
  // A chunk's k_I rows (rows past |K_t| zero-filled) and, dense, its keys' log A_g (4-byte
  // copies: a token's row of the workspace has no alignment; positions past |K_t| not copied,
  // never read).
  auto gather = [&](int chunk, int stage) {
    gather_k_rows<T, kT>(p, sk, chunk, stage, n, key_of, tid);
    if constexpr (kDense) {
      const float* la_row = p.log_a + (tok - p.la_tok0) * p.la_ts + chunk * kChunk;
      for (int e = tid; e < p.head_groups * kChunk; e += kT) {
        const int hg = e / kChunk, r = e % kChunk;
        if (chunk * kChunk + r < n)
          cp_async_4(smem_u32(s_lag + (stage * p.head_groups + hg) * kChunk + r),
                     la_row + hg * p.la_gs + r);
      }
    }
  };
  // log A of row r of the chunk in `stage` (dense), from the copied parts.
  auto chunk_la = [&](int stage, int r) {
    return log_a_combine(s_lag + stage * p.head_groups * kChunk + r, kChunk, p.head_groups);
  };
  gather(0, 0);
  cp_async_commit();

  Element* const q_el = reinterpret_cast<Element*>(smem + T::kQOff);
  auto k_el = [&](int stage) {
    return fresh_ptr(reinterpret_cast<Element*>(smem + T::kKOff)) +
           stage * (T::kStageBytes / 2);
  };
  typename T::Mma1 mma1;
  using FragA = decltype(partition_fragment_C(mma1, Shape<typename T::N64, typename T::HT>{}));

  // Pass 1: I of every position of K_t; sparse -> the list, dense: folded into running sums
  // (one lane per quad).
  DenseRowSums sums;
  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    const int stage = chunk & 1;
    landed_barrier();
    if (chunk + 1 < n_chunks) {
      gather(chunk + 1, stage ^ 1);
      cp_async_commit();
    }
    FragA acc = partition_fragment_C(mma1, Shape<typename T::N64, typename T::HT>{});
    gemm1<T>(k_el(stage), q_el, p.scale_I, acc, tid);
    float row[2];
    wg_row_scores<T>(acc, s_w, row);
    CUTE_UNROLL
    for (int i = 0; i < 2; ++i) {
      const int r = 16 * warp + g + 8 * i;
      const int pos = chunk * kChunk + r;
      if (t4 != 0 || pos >= n) continue;
      if constexpr (kDense)
        sums.add(row[i], chunk_la(stage, r) - log_za);
      else
        s_val[pos] = row[i];
    }
  }
  __syncthreads();

  // [d] log Z_I, the row's loss (sparse: and dI in place of I).
  float log_zi = 0.f;
  const float row_loss = kDense ? dense_row_loss<kT>(sums, p.coeff, s_red, &log_zi)
                                : sparse_row_loss<kT>(n, s_la, s_val, log_za, p.coeff, s_red);
  write_row_loss<kT>(p, tok, row_loss);
  if (!p.grads) return;

  // [e] Pass 2.
  gather(0, 0);
  cp_async_commit();
  typename T::Mma2 mma2;
  typename T::Mma3 mma3;
  auto thr2 = mma2.get_thread_slice(tid);
  auto thr3 = mma3.get_thread_slice(tid);
  // dq^T (128 x H_I): ((2, 2, H_I / 8), 2 M tiles, 1).
  Tensor dq = partition_fragment_C(mma3, Shape<typename T::D128, typename T::HT>{});
  clear(dq);
  float dw_acc[T::kNt][2];
  CUTE_UNROLL
  for (int nt = 0; nt < T::kNt; ++nt) dw_acc[nt][0] = dw_acc[nt][1] = 0.f;
  // The RS A operand of dK: scale_I w G in bf16, ((2, 2, 2), 1, H_I / 16).
  Tensor tAg = make_tensor<Element>(
      partition_shape_A(mma2, Shape<typename T::N64, typename T::HT>{}));
  auto ag32 = recast<uint32_t>(tAg);
  static_assert(decltype(size(tAg))::value == 2 * T::kNt * 4 / 2, "Gw fragment: 64 x H_I");
  Element* const g_el = reinterpret_cast<Element*>(smem + T::kGOff);

  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    const int stage = chunk & 1;
    landed_barrier();  // the chunk landed; the previous chunk's dQ has retired (wait below)
    if (chunk + 1 < n_chunks) {
      gather(chunk + 1, stage ^ 1);
      cp_async_commit();
    }
    FragA acc = partition_fragment_C(mma1, Shape<typename T::N64, typename T::HT>{});
    gemm1<T>(k_el(stage), q_el, p.scale_I, acc, tid);
    // dI of the two rows (sparse: from [d]; dense: from I and log A again).
    float di[2];
    int pos[2];
    float row[2];
    if constexpr (kDense) wg_row_scores<T>(acc, s_w, row);
    CUTE_UNROLL
    for (int i = 0; i < 2; ++i) {
      const int r = 16 * warp + g + 8 * i;
      pos[i] = chunk * kChunk + r;
      di[i] = 0.f;
      if (pos[i] < n) {
        if constexpr (kDense)
          di[i] = dense_di(p.coeff, row[i], log_zi, chunk_la(stage, r), log_za);
        else
          di[i] = s_val[pos[i]];
      }
    }
    g_epilogue<T, true>(acc, di, s_w, p.scale_I, dw_acc, ag32, sg, warp);
    // dK of the chunk's 64 keys, two halves of 64 columns.
    CUTE_UNROLL
    for (int half = 0; half < 2; ++half) {
      Tensor dk = partition_fragment_C(mma2, Shape<typename T::N64, typename T::D64>{});
      dk_rs_issue<T>(mma2, thr2, q_el, half, tAg, dk);
      warpgroup_wait<0>();
      warpgroup_fence_operand(dk);
      warpgroup_fence_operand(tAg);
      reduce_dk_rows(dk, lane, warp, [&](int r) -> float* {
        const int at = chunk * kChunk + r;
        return at < n ? p.dk_acc + key_of(at) * 128 + 64 * half : nullptr;
      });
    }
    fence_proxy_async_shared();
    __syncthreads();  // G of every warp in shared memory, visible to the async proxy
    dq_issue<T>(mma3, thr3, k_el(stage), fresh_ptr(g_el), dq);
    warpgroup_wait<0>();
    warpgroup_fence_operand(dq);
  }

  // [f]
  store_dq<T>(dq, p, tok, s_w, warp);
  store_dw<kT, kHeads>(dw_acc, s_dw, p, tok);
#endif
}

// Shared memory and the dK MMA of the dense pair kernel (two tokens per CTA, a warpgroup each).
template <class T>
struct PairTraits {
  using Element = typename T::Element;
  using H2 = cute::Int<2 * T::kHeads>;
  static constexpr int kGPanelBytes = T::kChunk * T::kHeads * 2;  // one token's G
  // dK of the pair, 64 columns: (64 keys x 2 H_I: both tokens' G, K-major, token 0's heads
  // first) x (2 H_I x 64 columns: both tokens' q_w, MN-major).
  using Mma2 = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<Element, Element, float,
                                       cute::Shape<typename T::N64, typename T::D64,
                                                   typename T::K16>,
                                       cute::SM90::GMMA::Major::K,
                                       cute::SM90::GMMA::Major::MN>()));
  // G of both tokens seen K-major (keys x heads, heads contiguous; the same bytes as LayoutG,
  // token 1's panel kGPanelBytes after token 0's).
  using GKAtom = std::conditional_t<
      T::kHeads == 64, cute::SM90::GMMA::Layout_K_SW128_Atom<Element>,
      std::conditional_t<T::kHeads == 32, cute::SM90::GMMA::Layout_K_SW64_Atom<Element>,
                         cute::SM90::GMMA::Layout_K_SW32_Atom<Element>>>;
  using LayoutG2 = decltype(cute::tile_to_shape(GKAtom{}, cute::Shape<typename T::N64, H2>{}));
  // q_w of both tokens for one half of the columns: (64 columns, 2 H_I), MN-major: token w's
  // panel (H_I rows of 128 swizzled bytes, q_I's panel layout) at w H_I 128 bytes.
  using LayoutQw = decltype(cute::tile_to_shape(cute::SM90::GMMA::Layout_MN_SW128_Atom<Element>{},
                                                cute::Shape<typename T::D64, H2>{}));
  static constexpr int kQOff = 0;                             // q_I of token w: w kQBytes
  static constexpr int kQwOff = kQOff + 2 * T::kQBytes;       // q_w, [half][token] panels
  static constexpr int kKOff = kQwOff + 2 * T::kQBytes;       // k_I, 2 stages
  static constexpr int kGOff = kKOff + 2 * T::kStageBytes;    // G, [token]
  static constexpr int kWOff = kGOff + 2 * kGPanelBytes;      // w, [token][H_I] fp32
  static constexpr int kRedOff = kWOff + 2 * T::kHeads * 4;   // [token][128] fp32
  static constexpr int kDwOff = kRedOff + 2 * T::kThreads * 4;  // [token][warp][H_I] fp32
  static constexpr int kRangeOff = kDwOff + 2 * T::kWarps * T::kHeads * 4;  // [token][2] int64
  static constexpr int kLagOff = kRangeOff + 64;  // log A_g, [stage][token][group][64] fp32
  static_assert(kQwOff % 1024 == 0 && kKOff % 1024 == 0 && kGOff % 1024 == 0 &&
                    kGPanelBytes % 1024 == 0 && T::kQPanelBytes % 1024 == 0,
                "swizzled tiles on 1024 bytes");
  static constexpr int smem_bytes(int groups) {
    return kLagOff + 2 * 2 * groups * T::kChunk * 4 + 1024;
  }
};

// q_w = scale_I w_j q_I[t, j] in bf16 of one token: from its q_I panels at q_src (K-major, two
// 128-byte-swizzled panels) to its panel of each half at qw_dst (half h at qw_dst + h 2
// kQPanelBytes: the [half][token] panels of the pair's dK B operand), by the token's 128 threads.
template <class T>
__device__ __forceinline__ void store_q_w(const LossParams& p, const uint8_t* q_src,
                                          uint8_t* qw_dst, const float* s_w, int wtid) {
  for (int e = wtid; e < T::kHeads * 16; e += T::kThreads) {
    const int j = e >> 4, ch = e & 15;
    const uint32_t at = swz(j, ch & 7);
    const uint4 v = *reinterpret_cast<const uint4*>(q_src + (ch >> 3) * T::kQPanelBytes + at);
    const float f = p.scale_I * s_w[j];
    uint4 o;
    const uint32_t* vi = reinterpret_cast<const uint32_t*>(&v);
    uint32_t* oi = reinterpret_cast<uint32_t*>(&o);
    CUTE_UNROLL
    for (int k = 0; k < 4; ++k) {
      const float2 x = unpack_bf16x2(vi[k]);
      oi[k] = pack2<__nv_bfloat16>(x.x * f, x.y * f);
    }
    *reinterpret_cast<uint4*>(qw_dst + (ch >> 3) * 2 * T::kQPanelBytes + at) = o;
  }
}

// The pair's dK of 64 columns, dk = [G_0 | G_1] [q_w,0 ; q_w,1] (K = 2 H_I), appended as one
// wgmma batch: A = both tokens' G at g_el (PairTraits::LayoutG2), B = both tokens' q_w panels of
// this warpgroup's half at qw_el (PairTraits::LayoutQw).
template <class T, class Mma, class Thr, class Frag>
__device__ __forceinline__ void pair_dk_issue(Mma& mma2, Thr& thr2, typename T::Element* g_el,
                                              typename T::Element* qw_el, Frag& dk) {
  using namespace cute;
  using L = PairTraits<T>;
  Tensor sG2 = make_tensor(make_smem_ptr(fresh_ptr(g_el)), typename L::LayoutG2{});
  Tensor sQw = make_tensor(make_smem_ptr(fresh_ptr(qw_el)), typename L::LayoutQw{});
  Tensor tA = thr2.partition_fragment_A(sG2);  // (MMA, 1, 2 H_I / 16)
  Tensor tB = thr2.partition_fragment_B(sQw);  // (MMA, 1, 2 H_I / 16)
  warpgroup_fence_operand(dk);
  warpgroup_arrive();
  gemm_ss(mma2, tA, tB, dk, true);
  warpgroup_commit_batch();
}

// ---- Dense mode, two tokens per CTA (tuning sm90_indexer_loss_kernel = 2) ----------------------
// Tokens t0 = tok_begin + 2 heavy_first_cta() and t0 + 1 (absent past tok_end), warpgroup w on
// token t0 + w; both on the same chunks of the span [min begin, max end) of the live tokens' ranges
// (a causal pair: the second range, one key longer). Per chunk, against two single-token CTAs: the
// k_I rows are loaded once, and dK = G_pair q_w,pair takes K = 2 H_I (A = both tokens' G from
// shared memory, K-major, token panels side by side; B = both tokens' q_I rows times scale_I w_j in
// bf16, MN-major), warpgroup w computing the columns [64 w, +64) of both tokens' sum, so each
// (pair, key) is reduced once: half the fp32 reductions. GEMM1 and dQ^T are the single-token
// kernel's, per warpgroup. A key of the span outside a token's range has dI = 0 there (G = 0, not
// folded into its sums); a token with an empty row (or absent) runs the loops with every key masked
// and writes nothing more than write_empty_row's zeros. Every barrier is the CTA's (both warpgroups
// run the same chunks and the same reductions), the per-token reductions reduce within each
// warpgroup (block_reduce over 128 threads, s_red per warpgroup).
template <class T>
__global__ void __launch_bounds__(2 * T::kThreads, 1)
    loss_sm90_pair_kernel(const __grid_constant__ LossParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using Element = typename T::Element;
  using namespace portable::indexer;
  using L = PairTraits<T>;
  constexpr int kT = T::kThreads;  // per token
  constexpr int kChunk = T::kChunk;
  constexpr int kHeads = T::kHeads;
  const float kInf = INFINITY;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = align_smem_1024(smem_raw);
  const int tid = threadIdx.x, wg = tid / kT, wtid = tid % kT;
  const int lane = tid & 31, warp = wtid >> 5;  // warp: in the warpgroup
  const int g = lane >> 2, t4 = lane & 3;
  const int64_t tok = p.tok_begin + 2 * int64_t{heavy_first_cta()} + wg;  // later: more keys
  const bool present = tok < p.tok_end;
  const IndexerDims& d = p.dims;
  float* const s_w = reinterpret_cast<float*>(smem + L::kWOff) + wg * kHeads;
  float* const s_red = reinterpret_cast<float*>(smem + L::kRedOff) + wg * kT;
  float* const s_dw = reinterpret_cast<float*>(smem + L::kDwOff) + wg * T::kWarps * kHeads;
  int64_t* const s_range = reinterpret_cast<int64_t*>(smem + L::kRangeOff);  // [2][begin, end]
  float* const s_lag = reinterpret_cast<float*>(smem + L::kLagOff);  // [stage][token][group][64]
  const uint32_t sq = smem_u32(smem + L::kQOff + wg * T::kQBytes);
  const uint32_t sk = smem_u32(smem + L::kKOff);
  const uint32_t sg = smem_u32(smem + L::kGOff + wg * L::kGPanelBytes);

  // [a] the token's range; [b] its log Z_A; an empty row.
  int64_t begin = 0;
  int n = 0;
  if (present) {
    begin = p.meta.range_begin(tok, d);
    n = static_cast<int>(p.meta.range_size(tok, d));
  }
  const float log_za =
      row_log_z_a<kT, 2>(n, [&](int i) { return log_a_at(p, tok, i); }, s_red);
  const bool live = n > 0 && log_za != -kInf;
  if (present && !live) write_empty_row<kT, kHeads, 2>(p, tok);
  if (wtid == 0) {
    s_range[2 * wg] = live ? begin : INT64_MAX;
    s_range[2 * wg + 1] = live ? begin + n : INT64_MIN;
  }
  __syncthreads();
  const int64_t b0 = s_range[0], e0 = s_range[1], b1 = s_range[2], e1 = s_range[3];
  const int64_t span_b = b0 < b1 ? b0 : b1;
  const int64_t span_e = e0 > e1 ? e0 : e1;
  if (span_e <= span_b) return;  // neither token live (the CTA's uniform exit)
  const int ns = static_cast<int>(span_e - span_b);
  const int64_t my_b = wg == 0 ? b0 : b1, my_e = wg == 0 ? e0 : e1;  // empty when not live
  auto mine = [&](int64_t key) { return key >= my_b && key < my_e; };
  auto either = [&](int64_t key) { return (key >= b0 && key < e0) || (key >= b1 && key < e1); };

  // [c] q_I and w of the token (zeros when not live), chunk 0 of the span's k_I rows and each
  // live token's log A_g of them.
  load_q_and_w<T, kT>(p, tok, live, sq, s_w, wtid, tid & 15);
  const int n_chunks = (ns + kChunk - 1) / kChunk;
  auto gather = [&](int chunk, int stage) {
    gather_k_rows<T, 2 * kT>(p, sk, chunk, stage, ns, [&](int pos) { return span_b + pos; }, tid);
    for (int e = wtid; e < p.head_groups * kChunk; e += kT) {
      const int hg = e / kChunk, r = e % kChunk;
      const int64_t key = span_b + chunk * kChunk + r;
      if (mine(key))
        cp_async_4(smem_u32(s_lag + ((stage * 2 + wg) * p.head_groups + hg) * kChunk + r),
                   p.log_a + hg * p.la_gs + (tok - p.la_tok0) * p.la_ts + (key - my_b));
    }
  };
  auto chunk_la = [&](int stage, int r) {
    return log_a_combine(s_lag + (stage * 2 + wg) * p.head_groups * kChunk + r, kChunk,
                         p.head_groups);
  };
  gather(0, 0);
  cp_async_commit();

  Element* const q_el = reinterpret_cast<Element*>(smem + L::kQOff) + wg * (T::kQBytes / 2);
  auto k_el = [&](int stage) {
    return fresh_ptr(reinterpret_cast<Element*>(smem + L::kKOff)) + stage * (T::kStageBytes / 2);
  };
  typename T::Mma1 mma1;
  using FragA = decltype(partition_fragment_C(mma1, Shape<typename T::N64, typename T::HT>{}));

  // Pass 1.
  DenseRowSums sums;
  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    const int stage = chunk & 1;
    landed_barrier();
    if (chunk + 1 < n_chunks) {
      gather(chunk + 1, stage ^ 1);
      cp_async_commit();
    }
    FragA acc = partition_fragment_C(mma1, Shape<typename T::N64, typename T::HT>{});
    gemm1<T>(k_el(stage), q_el, p.scale_I, acc, wtid);
    float row[2];
    wg_row_scores<T>(acc, s_w, row);
    CUTE_UNROLL
    for (int i = 0; i < 2; ++i) {
      const int r = 16 * warp + g + 8 * i;
      const int64_t key = span_b + chunk * kChunk + r;
      if (t4 == 0 && mine(key)) sums.add(row[i], chunk_la(stage, r) - log_za);
    }
  }
  __syncthreads();

  // [d] (a token not live: its sums are empty, the results unused).
  float log_zi = 0.f;
  const float row_loss = dense_row_loss<kT, 2>(sums, p.coeff, s_red, &log_zi);
  if (live) write_row_loss<kT, 2>(p, tok, row_loss);
  if (!p.grads) return;

  // [e] Pass 2. q_w = scale_I w_j q_I[t, j] in bf16, [half][token] panels (the dK B operand).
  gather(0, 0);
  cp_async_commit();
  store_q_w<T>(p, smem + L::kQOff + wg * T::kQBytes, smem + L::kQwOff + wg * T::kQPanelBytes,
               s_w, wtid);
  typename L::Mma2 mma2;
  typename T::Mma3 mma3;
  auto thr2 = mma2.get_thread_slice(wtid);
  auto thr3 = mma3.get_thread_slice(wtid);
  Tensor dq = partition_fragment_C(mma3, Shape<typename T::D128, typename T::HT>{});
  clear(dq);
  float dw_acc[T::kNt][2];
  CUTE_UNROLL
  for (int nt = 0; nt < T::kNt; ++nt) dw_acc[nt][0] = dw_acc[nt][1] = 0.f;
  Element* const g_el = reinterpret_cast<Element*>(smem + L::kGOff);
  // This warpgroup's dK columns: half wg of q_w (both tokens' panels of that half).
  Element* const qw_el = reinterpret_cast<Element*>(smem + L::kQwOff + wg * 2 * T::kQPanelBytes);

  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    const int stage = chunk & 1;
    landed_barrier();  // the chunk landed; both warpgroups' previous dK and dQ have retired
    if (chunk + 1 < n_chunks) {
      gather(chunk + 1, stage ^ 1);
      cp_async_commit();
    }
    FragA acc = partition_fragment_C(mma1, Shape<typename T::N64, typename T::HT>{});
    gemm1<T>(k_el(stage), q_el, p.scale_I, acc, wtid);
    float row[2], di[2];
    wg_row_scores<T>(acc, s_w, row);
    CUTE_UNROLL
    for (int i = 0; i < 2; ++i) {
      const int r = 16 * warp + g + 8 * i;
      const int64_t key = span_b + chunk * kChunk + r;
      di[i] = mine(key) ? dense_di(p.coeff, row[i], log_zi, chunk_la(stage, r), log_za) : 0.f;
    }
    int no_rs_operand = 0;
    g_epilogue<T, false>(acc, di, s_w, p.scale_I, dw_acc, no_rs_operand, sg, warp);
    fence_proxy_async_shared();
    __syncthreads();  // both tokens' G (and, chunk 0, q_w) visible to the async proxy
    // dK columns [64 wg, +64) of the pair (K = 2 H_I), then this token's dQ^T, one batch each;
    // the dK reductions run while the dQ batch is in flight.
    Tensor dk = partition_fragment_C(mma2, Shape<typename T::N64, typename T::D64>{});
    pair_dk_issue<T>(mma2, thr2, g_el, qw_el, dk);
    dq_issue<T>(mma3, thr3, k_el(stage), fresh_ptr(g_el) + wg * (L::kGPanelBytes / 2), dq);
    warpgroup_wait<1>();
    warpgroup_fence_operand(dk);
    reduce_dk_rows(dk, lane, warp, [&](int r) -> float* {
      const int64_t key = span_b + chunk * kChunk + r;
      return either(key) ? p.dk_acc + key * 128 + 64 * wg : nullptr;
    });
    warpgroup_wait<0>();
    warpgroup_fence_operand(dq);
  }

  // [f]
  if (live) store_dq<T>(dq, p, tok, s_w, warp);
  store_dw<kT, kHeads, 2>(dw_acc, s_dw, p, tok, live);
#endif
}

}  // namespace sa::sm90::loss
