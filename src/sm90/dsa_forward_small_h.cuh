// The Hopper DSA forward for H = 16 (DeepSeek's 128 heads under 8-way tensor parallelism):
// every product transposed, so that the keys, not the heads, fill wgmma's 64-row M side. The
// 64-row kernel (dsa_forward_kernel.cuh) pads such a token to 64 heads and wastes 75% of its MMA
// work; here a work item is one token with all of its H heads:
//
//   S^T = K Q^T      M = the chunk's 64 keys, N = H heads, K = D_qk    A = the gathered kv rows,
//                                                                      B = Q, both K-major
//   softmax over the keys (the M side: shuffles over a warp's 16 rows, then the 4 warps through
//   shared memory), P^T -> shared memory as [head][key]
//   O^T += V^T P^T   M = 512 value columns (8 tiles), N = H, K = 64 keys  A = the kv rows' first
//                                                                      512 columns seen as
//                                                                      (columns, keys), MN-major
//
// Roles (384 threads, as the 64-row kernels): the producer warpgroup gathers each 64-key chunk of
// the token's active slots (dsa_common.cuh's gather_chunk, cp.async, lane-parallel indices loaded
// one chunk ahead; inactive slots zero-filled, bias -inf) into one of two buffers, and Q with the
// item's first chunk, without waiting for its copies (they complete on kv_full by
// cp.async.mbarrier.arrive.noinc), so both buffers' gathers are in flight. Consumer warpgroup w
// owns buffer w, i.e. the CTA's chunks of parity w (the chunk ring runs on across items), with
// its own running maximum, row sums and O^T. At the end of an item warpgroup 1 hands its state to
// warpgroup 0 through shared memory (xchg, in passes of 32 KB, on mbarriers every writing /
// reading thread arrives on), and warpgroup 0 merges, normalises (lse and sink as the 64-row
// kernel's epilogue) and stores.
//
// Measured (H200, S 4096, topk 2048, bench/notes-archive session 21): H 16 198-200 TFLOPS at
// D_qk 576 and 512, 1.15x the padded 64-row kernel (1.17x with topk_length), and +1.9% more with
// the lazy running maximum (~204 TFLOPS). At H 32 this kernel (before the lazy maximum) ran 0.90x
// the padded one (there the padding wastes half, not three quarters, and a warpgroup's chain of
// m64n32 products and softmax barriers is longer), so H 32 stays on the 64-row kernel; the
// traits still take kH = 32.
//
// Shared memory (bytes; D_qk 576, H 16): kv 2 x 73,728, Q 18,432, P^T 2 x 2,048, xchg 32,768,
// bias / reductions / merge scalars ~1.4 K, mbarriers: ~ 200 K.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "sm90/dsa_common.cuh"
#include "sm90/dsa_forward_kernel.cuh"  // DsaFwdSm90Params
#include "sm90/hopper_primitives.cuh"
#include "sm90/persistent_items.cuh"

namespace sa::sm90::dsa_fwd {

template <int kDqk_, int kH_>
struct DsaFwdSmallHTraits : DsaCta<kDqk_> {
  using Base = DsaCta<kDqk_>;
  using Element = typename Base::Element;
  using H64 = typename Base::H64;
  using D512 = typename Base::D512;
  using D64 = typename Base::D64;
  static constexpr int kH = kH_;
  static_assert(kH == 16 || kH == 32, "H 16 or 32");
  using HN = cute::Int<kH>;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static constexpr int kXchgFloats = 8192;                     // 32 KB
  static constexpr int kOFloats = 512 * kH / 128;              // O^T per thread
  static constexpr int kPasses = 512 * kH / kXchgFloats;       // 1 (H 16) or 2 (H 32)
  static constexpr int kTilesPerPass = 8 / kPasses;            // 64-column tiles of O^T
  using Major = cute::SM90::GMMA::Major;
  using AtomS = std::conditional_t<
      kH == 16, cute::SM90::GMMA::MMA_64x16x16_F32BF16BF16_SS<Major::K, Major::K>,
      cute::SM90::GMMA::MMA_64x32x16_F32BF16BF16_SS<Major::K, Major::K>>;
  using AtomO = std::conditional_t<
      kH == 16, cute::SM90::GMMA::MMA_64x16x16_F32BF16BF16_SS<Major::MN, Major::K>,
      cute::SM90::GMMA::MMA_64x32x16_F32BF16BF16_SS<Major::MN, Major::K>>;
  using TiledMmaS = decltype(cute::make_tiled_mma(AtomS{}));
  using TiledMmaO = decltype(cute::make_tiled_mma(AtomO{}));
  // The kv rows: DsaCta's SmemLayoutRows512 / Rows64 (K-major) and, their first 512 columns seen
  // column-major (the A operand V^T), SmemLayoutCols512. Q's H rows x 512 / x 64 and P^T as
  // [head][key] here.
  using SmemLayoutQNope = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<HN, D512>{}));
  using SmemLayoutQRope = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<HN, D64>{}));
  using SmemLayoutP = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<HN, H64>{}));
};

template <class T>
struct alignas(1024) SmallHStorage {
  using Element = typename T::Element;
  Element kv_nope[2][T::kNopeElems];
  Element kv_rope[2][T::kPanelElems];
  Element q_nope[T::kH * 512];
  Element q_rope[T::kH * 64];
  Element p[2][T::kH * 64];       // per consumer warpgroup: P^T [head][key], bf16
  float xchg[T::kXchgFloats];     // warpgroup 1's O^T, one pass of the end-of-item merge
  float xchg_ml[2][T::kH];        // warpgroup 1's running maximum and row sums per head
  float bias[2][64];              // per buffer: 0 for an active slot, -inf otherwise
  float red[2][2][4][T::kH];      // per warpgroup, chunk parity, warp: per-head maxima / sums
  uint64_t kv_full[2];            // producer's copies (128, noinc) -> warpgroup b: buffer b's rows
  uint64_t bias_full[2];          // producer (128) -> warpgroup b: buffer b's bias
  uint64_t kv_empty[2];           // warpgroup b (128) -> producer: buffer b is free
  uint64_t q_empty;               // consumers (256): the item's Q is no longer read
  uint64_t xchg_full;             // warpgroup 1 (128) -> warpgroup 0: a merge pass is written
  uint64_t xchg_empty;            // warpgroup 0 (128) -> warpgroup 1: ... and read
  ItemHandoff items;
};

// ---- producer (warpgroup 0) ---------------------------------------------------------------------
// Item: token tok with n_slots active slots; its chunks are the ring's g0, g0 + 1, ... (buffer
// g % 2). Q comes with the item's first chunk, once the consumers released the last item's.
template <class T>
__device__ __forceinline__ void producer_small_h(const DsaFwdSm90Params& p, SmallHStorage<T>& s,
                                                 int64_t tok, int n_slots, uint32_t g0,
                                                 uint32_t& q_phase) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_chunks = (n_slots + 63) / 64;
  const DsaElement* kv = static_cast<const DsaElement*>(p.kv);
  const int32_t* idx_row = p.idx + tok * p.idx_ss;
  // The indices of chunk c + 1 are loaded while chunk c is issued (their L2 round trip was the
  // first link of each chunk's chain: ncu, session 21 call 9).
  int32_t j_next = n_chunks > 0 ? chunk_slot_index(idx_row, p.idx_si, n_slots, 0, warp, lane) : -1;
#pragma unroll 1
  for (int c = 0; c < n_chunks; ++c) {
    const uint32_t g = g0 + static_cast<uint32_t>(c);
    const int buf = g & 1;
    const int32_t j = j_next;
    if (c + 1 < n_chunks) j_next = chunk_slot_index(idx_row, p.idx_si, n_slots, c + 1, warp, lane);
    mbarrier_wait(&s.kv_empty[buf], ((g >> 1) & 1) ^ 1);
    gather_chunk<T::kRope>(smem_u32(s.kv_nope[buf]), smem_u32(s.kv_rope[buf]), kv, p.kv_ss, p.skv,
                           ShuffledRowIndex{j}, warp, lane,
                           [&](int row, bool active, int32_t) {
                             s.bias[buf][row] = active ? 0.f : -INFINITY;
                           });
    if (c == 0) {
      mbarrier_wait(&s.q_empty, q_phase ^ 1);
      q_phase ^= 1;
      gather_head_rows<T::kRope, false, T::kH>(
          smem_u32(s.q_nope), smem_u32(s.q_rope),
          static_cast<const DsaElement*>(p.q) + tok * p.q_ss, p.q_sh, 0, warp, lane);
    }
    // No wait here: the copies (Q's too) complete on kv_full by themselves, so the next chunk's
    // gather is issued at once and both buffers can be in flight (a cp.async.wait_all per chunk
    // kept one chunk in flight: ~3 K cycles per chunk, session 21 call 6). The bias stores are
    // released by an ordinary arrive.
    mbarrier_arrive(&s.bias_full[buf]);
    cp_async_arrive_noinc(&s.kv_full[buf]);
  }
}

// ---- consumers (warpgroups 1, 2) ----------------------------------------------------------------
// Accumulator element i of a 64 x H tile: row 16 warp + lane / 4 + 8 ((i / 2) % 2), column
// 8 (i / 4) + 2 (lane % 4) + i % 2; a thread's heads are hd = 2 (i / 4) + i % 2, head
// 8 (hd / 2) + 2 (lane % 4) + hd % 2 (kH / 4 of them).
__device__ __forceinline__ int small_h_head(int hd, int lane) {
  return 8 * (hd / 2) + 2 * (lane % 4) + hd % 2;
}
// The head slot hd of accumulator element i of a 64 x H tile.
__device__ __forceinline__ int small_h_slot(int i) { return 2 * (i / 4) + i % 2; }

template <class T>
__device__ __forceinline__ void consumer_small_h(const DsaFwdSm90Params& p, SmallHStorage<T>& s,
                                                 int64_t tok, int n_slots, uint32_t g0, int wg,
                                                 uint32_t& xk) {
  using namespace cute;
  using Element = typename T::Element;
  constexpr int kH = T::kH;
  constexpr int kHd = kH / 4;  // heads per thread
  const int wtid = threadIdx.x % 128, lane = threadIdx.x % 32, warp = wtid / 32;
  const int frag_row = 16 * warp + lane / 4;  // + 8 r
  const int n_chunks = (n_slots + 63) / 64;
  const uint32_t bar_wg = 1 + wg;  // named barrier of this warpgroup (128 threads)

  typename T::TiledMmaS mma_s;
  typename T::TiledMmaO mma_o;
  auto thr_s = mma_s.get_thread_slice(wtid);
  auto thr_o = mma_o.get_thread_slice(wtid);
  Tensor sKn = make_tensor(make_smem_ptr(s.kv_nope[wg]), typename T::SmemLayoutRows512{});
  Tensor sKr = make_tensor(make_smem_ptr(s.kv_rope[wg]), typename T::SmemLayoutRows64{});
  Tensor sQn = make_tensor(make_smem_ptr(s.q_nope), typename T::SmemLayoutQNope{});
  Tensor sQr = make_tensor(make_smem_ptr(s.q_rope), typename T::SmemLayoutQRope{});
  Tensor sVt = make_tensor(make_smem_ptr(s.kv_nope[wg]), typename T::SmemLayoutCols512{});
  Tensor sP = make_tensor(make_smem_ptr(s.p[wg]), typename T::SmemLayoutP{});
  Tensor tSrK = thr_s.partition_fragment_A(sKn);
  Tensor tSrKr = thr_s.partition_fragment_A(sKr);
  Tensor tSrQ = thr_s.partition_fragment_B(sQn);
  Tensor tSrQr = thr_s.partition_fragment_B(sQr);
  Tensor tOrV = thr_o.partition_fragment_A(sVt);
  Tensor tOrP = thr_o.partition_fragment_B(sP);
  Tensor tOrO = partition_fragment_C(mma_o, Shape<typename T::D512, typename T::HN>{});
  static_assert(decltype(size(tOrO))::value == T::kOFloats, "O^T: 512 x H per warpgroup");

  float m_run[kHd], l_run[kHd];  // log2 units (scale folded); l_run: this thread's keys only
  CUTE_UNROLL
  for (int hd = 0; hd < kHd; ++hd) m_run[hd] = -INFINITY, l_run[hd] = 0.f;
  clear(tOrO);
  const float scale_log2 = p.scale_log2;
  const bool releaser = lane < T::kReleaseLanes;
  const uint32_t p_base = smem_u32(s.p[wg]);

  // This warpgroup's chunks of the item: the ring's chunks g of parity wg. Every consumer thread
  // arrives on q_empty once per item with chunks: after its last S^T, or, without a chunk of its
  // own, in the merge after its pass-0 wait (below). There the other warpgroup has passed its
  // own arrival for this item, and neither can arrive for the next item before both did for
  // this one (a next-item S^T waits for the next Q, which waits for q_empty), so a q_empty phase
  // never completes with a next item's arrivals.
  const int c_first = static_cast<int>((static_cast<uint32_t>(wg) - g0) & 1u);
  const bool no_chunk = n_chunks > 0 && c_first >= n_chunks;
#pragma unroll 1
  for (int c = c_first; c < n_chunks; c += 2) {
    const uint32_t g = g0 + static_cast<uint32_t>(c);
    const uint32_t use = g >> 1;  // this buffer's fill count before the chunk
    mbarrier_wait(&s.kv_full[wg], use & 1);
    mbarrier_wait(&s.bias_full[wg], use & 1);
    fence_proxy_async_shared();  // the rows (and Q) landed by cp.async, read by wgmma
    Tensor tSrS = partition_fragment_C(mma_s, Shape<typename T::H64, typename T::HN>{});
    warpgroup_fence_operand(tSrS);
    warpgroup_arrive();
    gemm_ss(mma_s, tSrK, tSrQ, tSrS, true);
    if constexpr (T::kRope) gemm_ss(mma_s, tSrKr, tSrQr, tSrS, false);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    if (c + 2 >= n_chunks) mbarrier_arrive(&s.q_empty);  // this warpgroup's last read of Q

    // Scores in log2 units with the slot's bias; the maximum over the chunk's keys per head.
    float x[kH / 2];
    float cmax[kHd];
    CUTE_UNROLL
    for (int hd = 0; hd < kHd; ++hd) cmax[hd] = -INFINITY;
    CUTE_UNROLL
    for (int i = 0; i < kH / 2; ++i) {
      const int key = frag_row + 8 * ((i / 2) % 2);
      x[i] = fmaf(tSrS(i), scale_log2, s.bias[wg][key]);
      const int hd = small_h_slot(i);
      cmax[hd] = fmaxf(cmax[hd], x[i]);
    }
    const int par = use & 1;
    CUTE_UNROLL
    for (int hd = 0; hd < kHd; ++hd) {
      CUTE_UNROLL
      for (int off = 4; off < 32; off *= 2)
        cmax[hd] = fmaxf(cmax[hd], __shfl_xor_sync(0xffffffffu, cmax[hd], off));
      if (lane < 4) s.red[wg][par][warp][small_h_head(hd, lane)] = cmax[hd];
    }
    named_barrier_sync(bar_wg, 128);
    // The running maximum moves lazily (the 64-row kernel's rule, kLazyRescaleLog2: only when the
    // chunk exceeds it by more than 2^8, so P <= 2^8), and O^T and the sums are rescaled only when
    // a head's maximum moved (the same for the whole warpgroup: m_run is reduced over it).
    float m_use[kHd], alpha[kHd];
    bool moved = false;
    CUTE_UNROLL
    for (int hd = 0; hd < kHd; ++hd) {
      const int h = small_h_head(hd, lane);
      float m = m_run[hd];
      CUTE_UNROLL
      for (int w = 0; w < 4; ++w) m = fmaxf(m, s.red[wg][par][w][h]);
      const bool move = m - m_run[hd] > kLazyRescaleLog2;  // false for -inf - -inf (NaN)
      const float m_new = move ? m : m_run[hd];
      m_use[hd] = m_new == -INFINITY ? 0.f : m_new;  // no active key yet: P = 0, not NaN
      alpha[hd] = move ? exp2_approx(m_run[hd] - m_use[hd]) : 1.f;
      m_run[hd] = m_new;
      moved |= move;
    }
    moved = __any_sync(0xffffffffu, moved);  // uniform over the warpgroup (m_run is)
    // P^T = 2^(x - m) -> bf16 [head][key] (128-byte swizzled rows of 64 keys); this thread's row
    // sums; O^T rescaled.
    if (moved) {
      CUTE_UNROLL
      for (int hd = 0; hd < kHd; ++hd) l_run[hd] *= alpha[hd];
    }
    CUTE_UNROLL
    for (int i = 0; i < kH / 2; ++i) {
      const int key = frag_row + 8 * ((i / 2) % 2);
      const int hd = small_h_slot(i);
      const int h = small_h_head(hd, lane);
      const float pv = exp2_approx(x[i] - m_use[hd]);
      l_run[hd] += pv;
      const uint32_t at = p_base + h * 128 + (((key / 8) ^ (h % 8)) << 4) + (key % 8) * 2;
      asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(at),
                   "h"(static_cast<unsigned short>(pack_bf16x2(pv, 0.f) & 0xffffu))
                   : "memory");
    }
    if (moved) {
      CUTE_UNROLL
      for (int i = 0; i < T::kOFloats; ++i) {
        const int j = i % (kH / 2);
        tOrO(i) *= alpha[small_h_slot(j)];
      }
    }
    fence_proxy_async_shared();
    named_barrier_sync(bar_wg, 128);  // every P^T element is written
    warpgroup_fence_operand(tOrO);
    warpgroup_arrive();
    gemm_ss(mma_o, tOrV, tOrP, tOrO, false);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
    if (releaser) mbarrier_arrive(&s.kv_empty[wg]);  // the chunk's K, V and this P^T are read
  }

  // The warpgroup's row sums per head: over the quad groups, then the warps (through s.red[wg][0],
  // free: every warp has passed the barrier after its last chunk's maxima were read).
  CUTE_UNROLL
  for (int hd = 0; hd < kHd; ++hd) {
    CUTE_UNROLL
    for (int off = 4; off < 32; off *= 2)
      l_run[hd] += __shfl_xor_sync(0xffffffffu, l_run[hd], off);
  }
  if (lane < 4) {
    CUTE_UNROLL
    for (int hd = 0; hd < kHd; ++hd) s.red[wg][0][warp][small_h_head(hd, lane)] = l_run[hd];
  }
  named_barrier_sync(bar_wg, 128);
  float l_wg[kHd];
  CUTE_UNROLL
  for (int hd = 0; hd < kHd; ++hd) {
    const int h = small_h_head(hd, lane);
    l_wg[hd] = s.red[wg][0][0][h] + s.red[wg][0][1][h] + s.red[wg][0][2][h] + s.red[wg][0][3][h];
  }
  named_barrier_sync(bar_wg, 128);  // the sums are read before the next item's maxima

  // The merge: warpgroup 1's state into warpgroup 0's, pass by pass (kTilesPerPass of O^T's 8
  // column tiles per pass; fragment order, thread-contiguous: conflict-free).
  constexpr int kPerTile = kH / 2;
  if (wg == 1) {
    CUTE_UNROLL
    for (int pass = 0; pass < T::kPasses; ++pass, ++xk) {
      mbarrier_wait(&s.xchg_empty, (xk & 1) ^ 1);
      if (pass == 0 && no_chunk) mbarrier_arrive(&s.q_empty);
      if (pass == 0 && lane < 4 && warp == 0) {
        CUTE_UNROLL
        for (int hd = 0; hd < kHd; ++hd) {
          s.xchg_ml[0][small_h_head(hd, lane)] = m_run[hd];
          s.xchg_ml[1][small_h_head(hd, lane)] = l_wg[hd];
        }
      }
      CUTE_UNROLL
      for (int k = 0; k < T::kTilesPerPass * kPerTile; ++k)
        s.xchg[k * 128 + wtid] = tOrO(pass * T::kTilesPerPass * kPerTile + k);
      mbarrier_arrive(&s.xchg_full);
    }
    return;
  }
  float f0[kHd], f1[kHd], factor[kHd];
  Element* out = static_cast<Element*>(p.out) + tok * p.o_ss;
  CUTE_UNROLL
  for (int pass = 0; pass < T::kPasses; ++pass, ++xk) {
    mbarrier_wait(&s.xchg_full, xk & 1);
    if (pass == 0) {
      if (no_chunk) mbarrier_arrive(&s.q_empty);
      CUTE_UNROLL
      for (int hd = 0; hd < kHd; ++hd) {
        const int h = small_h_head(hd, lane);
        const float m1 = s.xchg_ml[0][h], l1 = s.xchg_ml[1][h];
        const float m = fmaxf(m_run[hd], m1);
        const float m_use = m == -INFINITY ? 0.f : m;
        f0[hd] = exp2_approx(m_run[hd] - m_use);
        f1[hd] = exp2_approx(m1 - m_use);
        const float l = l_wg[hd] * f0[hd] + l1 * f1[hd];
        const float sink = p.sink != nullptr && l > 0.f ? p.sink[h * p.sink_s] : -INFINITY;
        const RowNorm n = row_norm(m_use, l, sink);
        factor[hd] = n.factor;
        if (warp == 0 && lane < 4) p.lse[tok * p.lse_ss + h * p.lse_sh] = n.lse;
      }
    }
    CUTE_UNROLL
    for (int k = 0; k < T::kTilesPerPass * kPerTile; ++k) {
      const int i = pass * T::kTilesPerPass * kPerTile + k;
      const int j = i % kPerTile;
      const int hd = small_h_slot(j);
      tOrO(i) = (tOrO(i) * f0[hd] + s.xchg[k * 128 + wtid] * f1[hd]) * factor[hd];
    }
    mbarrier_arrive(&s.xchg_empty);
  }
  // out[tok][h][d] = O^T(d, h): 2-byte stores (a warp instruction covers 16 contiguous bytes of
  // 4 heads), once per item.
  CUTE_UNROLL
  for (int i = 0; i < T::kOFloats; ++i) {
    const int j = i % kPerTile;
    const int h = small_h_head(small_h_slot(j), lane);
    const int d = 64 * (i / kPerTile) + frag_row + 8 * ((j / 2) % 2);
    out[static_cast<int64_t>(h) * p.o_sh + d] = static_cast<Element>(tOrO(i));
  }
}

// ---- kernel -------------------------------------------------------------------------------------
template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    dsa_forward_small_h_kernel(const __grid_constant__ DsaFwdSm90Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  SmallHStorage<T>& s = aligned_shared_storage<SmallHStorage<T>>(smem_raw);
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {
      mbarrier_init(&s.kv_full[b], T::kProducerThreads);
      mbarrier_init(&s.bias_full[b], T::kProducerThreads);
      mbarrier_init(&s.kv_empty[b], T::kReleaseArrivals / 2);
    }
    mbarrier_init(&s.q_empty, T::kConsumerThreads);
    mbarrier_init(&s.xchg_full, 128);
    mbarrier_init(&s.xchg_empty, 128);
    item_handoff_init(s.items, T::kThreads);
    fence_mbarrier_init();
  }
  __syncthreads();
  // Items: one per token (p.items = S_q); g0 = the ring index of the item's first chunk.
  auto for_each_item = [&](auto is_producer, auto f) {
    uint32_t g0 = 0;
    for_each_cta_item<decltype(is_producer)::value>(
        s.items, p.item_counter, static_cast<uint32_t>(p.items), [&](uint32_t i) {
          const int32_t t = static_cast<int32_t>(i);
          const int n = dsa_active_slots(p.len, p.len_s, p.topk, t);
          f(static_cast<int64_t>(t), n, g0);
          g0 += static_cast<uint32_t>((n + 63) / 64);
        });
  };
  run_roles<T>(
      [&] {
        uint32_t q_phase = 0;
        for_each_item(cute::true_type{}, [&](int64_t t, int n, uint32_t g0) {
          producer_small_h<T>(p, s, t, n, g0, q_phase);
        });
      },
      [&](int wg) {
        uint32_t xk = 0;
        for_each_item(cute::false_type{}, [&](int64_t t, int n, uint32_t g0) {
          consumer_small_h<T>(p, s, t, n, g0, wg, xk);
        });
      });
#endif
}

}  // namespace sa::sm90::dsa_fwd
