// The Hopper (sm_90a) DSA forward kernel (sparse MLA prefill, SPEC 2): cp.async gather of the
// selected kv rows by a producer warpgroup, wgmma (SS) for S = Q K^T and O += P V, two consumer
// warpgroups sharing S through shared memory (FlashMLA-style split of O's 512 columns).
// Device code only; dsa_forward.cu checks the problem and instantiates it.
//
// Work split. A work item is one (query token t, group of 64 heads), one CTA each, except that the
// seesaw kernels run one persistent CTA per SM over the items (the kernel function): without
// topk_length items b, b + gridDim.x, ...; with it (items of different lengths) the items after
// the first come from a counter in the workspace, and without that workspace one CTA per item.
// H = 128 runs two items per token
// (one CTA of 128 heads would need 64 x 512 fp32 O accumulators per 64 heads twice over: 4
// consumer warpgroups of 128 registers of O each, more than the register file). The token's
// active slots are walked in chunks of 64 keys; each gathered kv row is the key (D_qk columns)
// and, through its first 512 columns in the same buffer, the value.
//
// Roles (warpgroups, 384 threads):
//   kProducer  warpgroup 0, setmaxnreg down to kProducerRegs: loads Q once and gathers each
//              chunk's 64 kv rows with 16-byte cp.async (8 lanes per row, one 128-byte line per
//              step); a chunk's indices are read lane-parallel (lane i of warp w: slot 16 w + i)
//              and broadcast with __shfl_sync. Inactive slots are never dereferenced: cp.async
//              with src-size 0 zero-fills the row, and the slot's bias is -inf.
//   kConsumer0/1  warpgroups 1 and 2, setmaxnreg up to kConsumerRegs. Consumer w computes
//              S[:, 32 w : 32 w + 32] = Q K^T for its 32 keys of the chunk (wgmma 64x32, 36 or
//              32 k-steps), shares its row maxima and its half of P (bf16) through shared memory,
//              and accumulates O[:, 256 w : 256 w + 256] += P V over all 64 keys (wgmma 64x256).
//
// Timeline of chunk c (stage st = c % 2):
//
//   producer  [P1] wait kv_empty[st]; indices of chunk c; cp.async rows -> stage st, bias[st];
//             [P2] wait for its own copies; fence.proxy.async; arrive kv_full[st] (128 arrivals)
//   consumer  [C1] wait kv_full[st]; S_c = Q K_half^T (issued and waited)
//             [C2] x = S * scale * log2(e) + bias; row max -> red_max[wg]; bar kMaxReady (256)
//             [C3] m_new = max(m, both halves) if above m + 8; P = 2^(x - m_new); l = l alpha +
//                  rowsum; O *= alpha (skipped by warps whose rows kept their maximum)
//                  P -> bf16 -> sP[:, 32 wg : +32]; fence.proxy.async; bar kPReady (256)
//             [C4] O += P V (sP, V[:, 256 wg : +256] of stage st), waited; release stage st (one
//                  arrive per warp)
//   epilogue  [C5] row sums of both halves (red_sum, bar kSumReady); lse = ln2 (m + log2 l)
//                  (+inf if l == 0); out = O / (l (1 + e^(sink - lse))) (0 if l == 0 or the
//                  exponential overflows: sink +inf or huge), bf16 pairs stored to rows < H.
//
//   producer  |gather 0|gather 1|.......|gather 2 ..............|gather 3 ...
//   WG0/WG1            |S0|mx|P0|PV0    |S1|mx|P1|PV1           |S2 ...
//
// The stage of chunk c is released at the end of iteration c, so the gather of chunk c + 2 (73.7
// KB of random rows) has all of iteration c + 1 to land. Session 9's order issued P_{c-1} V_{c-1}
// together with S_c (overlapping the softmax), which freed the stage only during iteration c + 1:
// the gather then had one softmax to land and sat on the critical path (this order measured
// +20%, bench/NOTES.md session 10). Issuing S_{c+1} right behind P_c V_c measured 3-4% slower:
// the wait for chunk c + 1 then delays the release of stage c, so the gather is still the limit.
// Publishing each chunk in two halves (S starting on the first) measured 1% slower: the halves
// land nearly together, the gather is throughput-bound (bench/NOTES.md session 10).
//
// Shared memory (bytes), every operand tile in 64-column panels of 128-byte rows with the
// 128-byte swizzle (chunk c of row r at c ^ (r % 8)), the layout wgmma descriptors expect:
//   q_nope 64 x 512 (65,536), q_rope 64 x 64 (8,192, D_qk 576 only used), kv_nope 2 stages x
//   64 x 512 (131,072), kv_rope 2 x 64 x 64 (16,384), P 64 x 64 (8,192), bias 2 x 64 fp32,
//   red_max / red_sum 2 x 64 fp32 each, mbarriers: 229,376 + 1,568, rounded to 231,424 by the
//   1024-byte alignment, + 1,024 slack to align the dynamic base = 232,448: exactly sm_90's 227 KB.
//
// Registers (ptxas 13.0, -v, both instantiations): 168 per thread at launch (384 threads, 1 CTA
// per SM), producer setmaxnreg 56, consumers 224 (O 128 + S 16 + x 16 + state; SASS uses R0-R217);
// no C7508/C7515/C7520. Nothing is in flight across a loop iteration (an in-flight P V batch
// across the back edge made ptxas serialize every wgmma, C7515). No stack frame (ptxas 13.0,
// all four instantiations).
//
// Numerics and edge cases follow the portable kernel (src/portable/dsa_forward_kernel.cuh): the
// running max is over x (log2 units, scale folded in, so any sign of scale works; lazily updated,
// so P <= 2^8); a chunk with no active key gives P = 0 (max guarded: 2^(-inf - 0)); empty rows
// give out = 0, lse = +inf.
#pragma once

#include <cstdint>

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "sm90/dsa_common.cuh"
#include "sm90/hopper_primitives.cuh"
#include "sm90/persistent_items.cuh"

namespace sa::sm90::dsa_fwd {

// Kernel arguments: typed pointers and element strides, resolved and checked on the host.
struct DsaFwdSm90Params {
  const void* q;       // [S_q, H, D_qk] bf16: (t, h, d) at t * q_ss + h * q_sh + d
  const void* kv;      // [S_kv, D_qk] bf16: row j at j * kv_ss
  void* out;           // [S_q, H, 512] bf16: (t, h, d) at t * o_ss + h * o_sh + d
  float* lse;          // [S_q, H]: (t, h) at t * lse_ss + h * lse_sh
  const int32_t* idx;  // [S_q, topk]: (t, i) at t * idx_ss + i * idx_si
  const int32_t* len;  // [S_q] at t * len_s; may be null
  const float* sink;   // [H] at h * sink_s; may be null
  int64_t q_ss, q_sh, kv_ss, o_ss, o_sh, lse_ss, lse_sh, idx_ss, idx_si, len_s, sink_s;
  int64_t skv;          // S_kv
  int32_t topk;         // slots per row
  int32_t head_groups;  // H / 64 (1 with head padding)
  float scale_log2;     // scale * log2(e)
  int32_t heads;        // H
  int64_t items;        // S_q * head_groups: the work items (token, head group)
  // Seesaw kernels with topk_length: zeroed before the launch; a CTA's items after its first
  // (blockIdx.x) are gridDim.x + atomicAdd(item_counter, 1). Null: items b, b + gridDim.x, ...
  uint32_t* item_counter;
};

// Named barriers (id 0 is __syncthreads), all over the 256 consumer threads.
enum class NamedBarrier : uint32_t {
  kMaxReady = 1,
  kPReady = 2,
  kSumReady = 3,
  // Seesaw: warpgroup w's P tile of the iteration is published (256 threads).
  kP0 = 6,
  kP1 = 7,
};
__device__ __forceinline__ uint32_t id(NamedBarrier b) { return static_cast<uint32_t>(b); }

// The running maximum of a row (log2 units) moves only when a chunk exceeds it by more than
// kLazyRescaleLog2 = 8 (FlashAttention-4's rule: P then stays <= 2^8 = 256, and the result is
// exact after the final normalisation, which uses the same maximum), and a warp skips the rescale
// of its O accumulators when none of its rows moved (measured +3-4%, bench/NOTES.md session 10).
constexpr float kLazyRescaleLog2 = 8.f;

// kPadHeads_: H < 64 (16 or 32) runs one 64-row CTA per token whose rows >= H are padding
// (zero Q rows, never stored) with the lockstep schedule below; H 64 and 128 (kPadHeads_ false)
// run the seesaw schedule (kSeesaw, dsa_forward_seesaw.cuh: +9-10% over the lockstep one,
// bench/NOTES.md session 13).
template <int kDqk_, bool kPadHeads_ = false>
struct DsaFwdTraits : DsaCta<kDqk_> {
  static constexpr bool kPadHeads = kPadHeads_;
  static constexpr bool kSeesaw = true;
  using Base = DsaCta<kDqk_>;
  using Element = typename Base::Element;
  using H64 = typename Base::H64;
  using D512 = typename Base::D512;
  using D64 = typename Base::D64;
  using WgLayout = typename Base::WgLayout;
  static constexpr int kStages = 2;
  // The seesaw's consumers hold P in fp32 and bf16 besides O: 8 registers more for them.
  static constexpr int kProducerRegs = kSeesaw ? 40 : 56;
  static constexpr int kConsumerRegs = kSeesaw ? 232 : 224;
  using StagesT = cute::Int<kStages>;
  using AtomQK = cute::SM90::GMMA::MMA_64x32x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K,
                                                               cute::SM90::GMMA::Major::K>;
  using AtomPV = cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K,
                                                                cute::SM90::GMMA::Major::MN>;
  using TiledMmaQK = decltype(cute::make_tiled_mma(AtomQK{}, WgLayout{}));
  using TiledMmaPV = decltype(cute::make_tiled_mma(AtomPV{}, WgLayout{}));
  // Seesaw: S of a warpgroup's own 64-key block (one warpgroup, N = 64), and P V with P from
  // registers (RS; the warpgroups split N = 512 as in TiledMmaPV).
  using TiledMmaQK64 = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K,
                                                    cute::SM90::GMMA::Major::K>{}));
  using TiledMmaPVrs = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K,
                                                     cute::SM90::GMMA::Major::MN>{},
      WgLayout{}));

  using SmemLayoutQNope = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<H64, D512>{}));
  using SmemLayoutQRope = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<H64, D64>{}));
  using SmemLayoutKNope = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<H64, D512, StagesT>{}));
  using SmemLayoutKRope = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<H64, D64, StagesT>{}));
  // V = the nope part of the K rows, seen as the (D_v, keys) B operand of P V.
  using SmemLayoutVt = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_MN_SW128_Atom<Element>{}, cute::Shape<D512, H64, StagesT>{},
      cute::Step<cute::_2, cute::_1, cute::_3>{}));
  using SmemLayoutP = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<H64, H64>{}));
  // Seesaw: one buffer's V (a per-buffer base pointer: descriptors indexed by a runtime stage
  // stay live and spill).
  using SmemLayoutVt1 = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_MN_SW128_Atom<Element>{}, cute::Shape<D512, H64>{},
      cute::Step<cute::_2, cute::_1>{}));
};

template <class T>
struct alignas(1024) SharedStorage {
  using Element = typename T::Element;
  Element q_nope[T::kNopeElems];
  Element q_rope[T::kPanelElems];
  Element kv_nope[T::kStages * T::kNopeElems];
  Element kv_rope[T::kStages * T::kPanelElems];
  Element p[T::kPanelElems];
  float bias[T::kStages][64];  // 0 for an active slot, -inf otherwise
  float red_max[2][64];        // per consumer warpgroup, per row
  float red_sum[2][64];
  uint64_t kv_full[T::kStages];
  uint64_t kv_empty[T::kStages];
  // Seesaw only: per buffer (block parity) and half (0: columns 0-255, 1: 256-575), the producer's
  // cp.async completions (128) / the releasing warpgroup's (kReleaseArrivals / 2); the buffer's
  // bias (128).
  uint64_t half_full[2][2];
  uint64_t half_empty[2][2];
  uint64_t bias_full[2];
  // Seesaw only: warpgroup w's row maxima of the iteration are in red_max[w] (its 128 threads
  // arrive, each after its own store or its last load of red_max[1 - w]).
  uint64_t max_full[2];
  // Seesaw only (persistent CTAs): every consumer thread is done with the item's Q (after its last
  // S; items without iterations have no Q); the producer waits before gathering the next item's.
  uint64_t q_empty;
  // Seesaw with an item counter: the dynamic items' hand-off (persistent_items.cuh).
  ItemHandoff items;
};

// ---- producer (warpgroup 0) ---------------------------------------------------------------------
// Thread mapping of every copy: warp w owns rows [16 w, 16 w + 16), 4 rows per pass (8 lanes per
// row, lane % 8 = the 16-byte chunk within each 128-byte panel row).
template <class T>
__device__ __forceinline__ void producer_main(const DsaFwdSm90Params& p, SharedStorage<T>& s,
                                              int64_t tok, int h0, int n_slots) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;  // threads 0..127
  const int n_chunks = (n_slots + T::kBlockN - 1) / T::kBlockN;
  if (n_chunks == 0) return;

  // [P0] Q (64 heads, all < H: H is a multiple of 64); lands with chunk 0's group.
  gather_head_rows<T::kRope, T::kPadHeads>(smem_u32(s.q_nope), smem_u32(s.q_rope),
                                           static_cast<const DsaElement*>(p.q) + tok * p.q_ss,
                                           p.q_sh, h0, warp, lane, p.heads - h0);
  const DsaElement* kv = static_cast<const DsaElement*>(p.kv);
  const int32_t* idx_row = p.idx + tok * p.idx_ss;
#pragma unroll 1
  for (int c = 0; c < n_chunks; ++c) {
    const int st = c % T::kStages;
    const uint32_t phase = (c / T::kStages) & 1;
    // [P1] Indices of this warp's 16 slots, read before waiting for the stage; the rows.
    const int32_t j = chunk_slot_index(idx_row, p.idx_si, n_slots, c, warp, lane);
    mbarrier_wait(&s.kv_empty[st], phase ^ 1);
    gather_chunk<T::kRope>(smem_u32(s.kv_nope + st * T::kNopeElems),
                           smem_u32(s.kv_rope + st * T::kPanelElems), kv, p.kv_ss, p.skv,
                           ShuffledRowIndex{j}, warp, lane, [&](int row, bool active, int32_t) {
                             s.bias[st][row] = active ? 0.f : -INFINITY;
                           });
    cp_async_commit();
    // [P2] This thread's copies (and Q) have landed; make them visible to wgmma (async proxy)
    // and publish (the arrive releases; 128 arrivals complete the phase).
    cp_async_wait_all();
    fence_proxy_async_shared();
    mbarrier_arrive(&s.kv_full[st]);
  }
}

// ---- consumers (warpgroups 1, 2) ----------------------------------------------------------------
// [C5] Row sums of both warpgroups' shares (l_run: this thread's part of its rows' sums of the
// warpgroup's P), lse, sink, normalisation, stores of this warpgroup's 256 columns of O. Both
// warpgroups hold the same running maximum m_run.
template <class T, class FragO>
__device__ __forceinline__ void consumer_epilogue(const DsaFwdSm90Params& p, SharedStorage<T>& s,
                                                  int64_t tok, int h0, int wg, int lane,
                                                  int frag_row, const float (&m_run)[2],
                                                  const float (&l_run)[2], const FragO& tOrO) {
  using Element = typename T::Element;
  float l_half[2];
  CUTE_UNROLL
  for (int r = 0; r < 2; ++r) {
    l_half[r] = quad_sum(l_run[r]);
    if (lane % 4 == 0) s.red_sum[wg][frag_row + 8 * r] = l_half[r];
  }
  named_barrier_sync(id(NamedBarrier::kSumReady), T::kConsumerThreads);
  constexpr float kLn2 = 0.693147180559945309f;
  float factor[2];
  Element* out = static_cast<Element*>(p.out);
  CUTE_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int row = frag_row + 8 * r;
    // Both warpgroups add the halves in the same order: the same l, lse and factor.
    const float l = s.red_sum[0][row] + s.red_sum[1][row];
    const int h = h0 + row;
    const bool real = !T::kPadHeads || h < p.heads;  // a padding row is neither read nor stored
    float lse = INFINITY;  // no active slot: out = 0, lse = +inf
    factor[r] = 0.f;
    if (l > 0.f) {
      lse = (m_run[r] + log2f(l)) * kLn2;
      // out = O / l / (1 + e^(sink - lse)): sink -inf gives e^-inf = 0; +inf or huge gives an
      // infinite denominator, factor 0. Never NaN.
      const float sink = p.sink != nullptr && real ? p.sink[h * p.sink_s] : -INFINITY;
      factor[r] = 1.f / (l * (1.f + expf(sink - lse)));
    }
    if (wg == 0 && lane % 4 == 0 && real) p.lse[tok * p.lse_ss + h * p.lse_sh] = lse;
  }
  // 16-byte stores (out's rows are 16-byte aligned: tensor_checks); a padding row is not stored.
  store_fragment_rows_16b<decltype(cute::size(tOrO))::value / 4>(
      lane,
      [&](int i) {
        const float f = factor[(i / 2) % 2];
        return pack_bf16x2(tOrO(i) * f, tOrO(i + 1) * f);
      },
      [&](int r) -> Element* {
        const int h = h0 + frag_row + 8 * r;
        if (T::kPadHeads && h >= p.heads) return nullptr;
        return out + tok * p.o_ss + static_cast<int64_t>(h) * p.o_sh + 256 * wg;
      });
}

// Accumulator fragments of a 64 x N wgmma tile (per thread, register index i):
//   row = 16 * warp_in_warpgroup + lane / 4 + 8 * ((i / 2) % 2)   -> row slot r = (i / 2) % 2
//   col = 8 * (i / 4) + 2 * (lane % 4) + i % 2                     (within the warpgroup's N)
template <class T>
__device__ __forceinline__ void consumer_main(const DsaFwdSm90Params& p, SharedStorage<T>& s,
                                              int64_t tok, int h0, int n_slots, int wg) {
  using namespace cute;
  using Element = typename T::Element;
  const int ctid = threadIdx.x - 128;  // 0..255
  const int wtid = ctid % 128;
  const int lane = threadIdx.x % 32;
  const int warp_in_wg = wtid / 32;
  const int frag_row = 16 * warp_in_wg + lane / 4;  // + 8 r
  const int n_chunks = (n_slots + T::kBlockN - 1) / T::kBlockN;

  typename T::TiledMmaQK mma_qk;
  typename T::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(ctid);
  auto thr_pv = mma_pv.get_thread_slice(ctid);
  Tensor sQn = make_tensor(make_smem_ptr(s.q_nope), typename T::SmemLayoutQNope{});
  Tensor sQr = make_tensor(make_smem_ptr(s.q_rope), typename T::SmemLayoutQRope{});
  Tensor sKn = make_tensor(make_smem_ptr(s.kv_nope), typename T::SmemLayoutKNope{});
  Tensor sKr = make_tensor(make_smem_ptr(s.kv_rope), typename T::SmemLayoutKRope{});
  Tensor sVt = make_tensor(make_smem_ptr(s.kv_nope), typename T::SmemLayoutVt{});
  Tensor sP = make_tensor(make_smem_ptr(s.p), typename T::SmemLayoutP{});
  Tensor tSrQn = thr_qk.partition_fragment_A(sQn);  // descriptors (MMA, 1, 32)
  Tensor tSrQr = thr_qk.partition_fragment_A(sQr);  // (MMA, 1, 4)
  Tensor tSrKn = thr_qk.partition_fragment_B(sKn);  // (MMA, 1, 32, stages): this WG's 32 keys
  Tensor tSrKr = thr_qk.partition_fragment_B(sKr);  // (MMA, 1, 4, stages)
  Tensor tOrP = thr_pv.partition_fragment_A(sP);    // (MMA, 1, 4)
  Tensor tOrV = thr_pv.partition_fragment_B(sVt);   // (MMA, 1, 4, stages): this WG's 256 cols
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<typename T::H64, typename T::H64>{});  // 16
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<typename T::H64, typename T::D512>{});  // 128
  static_assert(decltype(size(tSrS))::value == 16, "S fragment: 64 x 32 per warpgroup");
  static_assert(decltype(size(tOrO))::value == 128, "O fragment: 64 x 256 per warpgroup");

  const float scale_log2 = p.scale_log2;
  const bool releaser = lane < T::kReleaseLanes;
  float m_run[2] = {-INFINITY, -INFINITY};  // running row max of x (log2 units)
  float l_run[2] = {0.f, 0.f};              // this thread's part of the row sums of P
  clear(tOrO);
  uint8_t* p_bytes = reinterpret_cast<uint8_t*>(s.p);

#pragma unroll 1
  for (int c = 0; c < n_chunks; ++c) {
    const int st = c % T::kStages;
    const uint32_t phase = (c / T::kStages) & 1;
    // [C1] S_c = Q K^T over this warpgroup's 32 keys.
    mbarrier_wait(&s.kv_full[st], phase);
    warpgroup_fence_operand(tSrS);
    warpgroup_arrive();
    gemm_ss(mma_qk, tSrQn, tSrKn(_, _, _, st), tSrS, true);
    if constexpr (T::kRope) gemm_ss(mma_qk, tSrQr, tSrKr(_, _, _, st), tSrS, false);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);

    // [C2] Scale, mask, row max over this warpgroup's keys. x and P live in their own
    // registers: S is only ever defined by wgmma.
    const float* bias = s.bias[st] + 32 * wg + 2 * (lane % 4);
    float x[16];
    float mx[2] = {-INFINITY, -INFINITY};
    CUTE_UNROLL
    for (int i = 0; i < 16; ++i) {
      x[i] = fmaf(tSrS(i), scale_log2, bias[8 * (i / 4) + (i % 2)]);
      mx[(i / 2) % 2] = fmaxf(mx[(i / 2) % 2], x[i]);
    }
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      mx[r] = quad_max(mx[r]);
      if (lane % 4 == 0) s.red_max[wg][frag_row + 8 * r] = mx[r];
    }
    // Both warpgroups' maxima are published; both are done with P_{c-1} V_{c-1} (waited at the
    // end of the last iteration), so sP may be rewritten.
    named_barrier_sync(id(NamedBarrier::kMaxReady), T::kConsumerThreads);

    // [C3] Online softmax (both warpgroups compute the same maximum), P -> sP, O *= alpha.
    float m_use[2], alpha[2];
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      const float m_chunk = fmaxf(mx[r], s.red_max[1 - wg][frag_row + 8 * r]);
      // The old maximum stays unless exceeded by more than 2^8 (-inf is exceeded by any key).
      const float m_new = m_chunk > m_run[r] + kLazyRescaleLog2 ? m_chunk : m_run[r];
      m_use[r] = m_new == -INFINITY ? 0.f : m_new;  // no active key yet: 2^(-inf - 0) = 0
      alpha[r] = exp2_approx(m_run[r] - m_use[r]);  // 0 while m_run is -inf
      alpha[r] = m_new == m_run[r] ? 1.f : alpha[r];  // exactly 1 while the maximum stays
      m_run[r] = m_new;
    }
    float rs[2] = {0.f, 0.f};
    CUTE_UNROLL
    for (int i = 0; i < 16; ++i) {
      x[i] = exp2_approx(x[i] - m_use[(i / 2) % 2]);
      rs[(i / 2) % 2] += x[i];
    }
    CUTE_UNROLL
    for (int i = 0; i < 16; i += 2) {
      const int row = frag_row + 8 * ((i / 2) % 2);
      const int chunk = 4 * wg + i / 4;  // 8 keys per 16-byte chunk
      *reinterpret_cast<uint32_t*>(p_bytes + swz(row, chunk) + 4 * (lane % 4)) =
          pack_bf16x2(x[i], x[i + 1]);
    }
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + rs[r];
    // The 128 multiplications of O (on the path to the P V issue) only when a maximum moved:
    // warp-uniform, so the warp skips them when all its rows kept theirs.
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= alpha[(i / 2) % 2];
    }
    fence_proxy_async_shared();  // sP is read by wgmma (async proxy)
    named_barrier_sync(id(NamedBarrier::kPReady), T::kConsumerThreads);

    // [C4] O += P_c V_c, waited here: stage c is free at the end of this iteration, so the gather
    // of chunk c + 2 into it has the whole next iteration to land.
    warpgroup_fence_operand(tOrO);
    warpgroup_arrive();
    gemm_ss(mma_pv, tOrP, tOrV(_, _, _, st), tOrO, false);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
    if (releaser) mbarrier_arrive(&s.kv_empty[st]);
  }

  consumer_epilogue<T>(p, s, tok, h0, wg, lane, frag_row, m_run, l_run, tOrO);
}

}  // namespace sa::sm90::dsa_fwd

#include "sm90/dsa_forward_seesaw.cuh"  // producer_seesaw, consumer_seesaw (kSeesaw)

namespace sa::sm90::dsa_fwd {

// ---- kernel -------------------------------------------------------------------------------------
template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    dsa_forward_sm90_kernel(const __grid_constant__ DsaFwdSm90Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  SharedStorage<T>& s = aligned_shared_storage<SharedStorage<T>>(smem_raw);

  const int64_t tok = blockIdx.x / p.head_groups;
  const int h0 = (blockIdx.x % p.head_groups) * T::kHeads;
  const int n_slots = dsa_active_slots(p.len, p.len_s, p.topk, tok);

  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < T::kStages; ++i) {
      mbarrier_init(&s.kv_full[i], T::kProducerThreads);
      mbarrier_init(&s.kv_empty[i], T::kReleaseArrivals);
    }
    if constexpr (T::kSeesaw) {
      for (int b = 0; b < 2; ++b) {
        for (int h = 0; h < 2; ++h) {
          mbarrier_init(&s.half_full[b][h], T::kProducerThreads);
          // Buffer 0's half 1 holds the rope tile that warpgroup 0 overwrites with sP0: its
          // threads release their stores too.
          mbarrier_init(&s.half_empty[b][h], T::kReleaseArrivals / 2 +
                                                 (b == 0 && h == 1 ? T::kConsumerThreads / 2 : 0));
        }
        mbarrier_init(&s.bias_full[b], T::kProducerThreads);
        mbarrier_init(&s.max_full[b], T::kConsumerThreads / 2);
      }
      mbarrier_init(&s.q_empty, T::kConsumerThreads);
      item_handoff_init(s.items, T::kThreads);
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  if constexpr (T::kSeesaw) {
    // Persistent when the host launches fewer CTAs than items (equal items: no topk_length): CTA b
    // takes items b, b + gridDim.x, ... The barriers' parities run on across the items (it0: the
    // CTA's iterations before the item; kq: its items with iterations before it, which alone
    // gather Q and release it, so that the consumers cannot complete two q_empty phases before
    // the producer waited for the first).
    // With an item counter (topk_length: items of different lengths) the items after the first
    // come from it instead (p.item_counter; persistent_items.cuh).
    auto for_each_item = [&](auto is_producer, auto f) {
      uint32_t it0 = 0, kq = 0;
      // Item indices fit in 31 bits (the host checks S_q * H / 64 < 2^31).
      for_each_cta_item<decltype(is_producer)::value>(
          s.items, p.item_counter, static_cast<uint32_t>(p.items), [&](uint32_t i) {
            const int32_t t = static_cast<int32_t>(i / static_cast<uint32_t>(p.head_groups));
            const int n = dsa_active_slots(p.len, p.len_s, p.topk, t);
            f(static_cast<int64_t>(t),
              static_cast<int>(i % static_cast<uint32_t>(p.head_groups)) * T::kHeads, n, it0, kq);
            const uint32_t n_iter = seesaw_iterations<T>(n);
            it0 += n_iter;
            kq += n_iter > 0 ? 1 : 0;
          });
    };
    run_roles<T>(
        [&] {
          for_each_item(cute::true_type{}, [&](int64_t t, int h, int n, uint32_t it0, uint32_t kq) {
            producer_seesaw<T>(p, s, t, h, n, it0, kq);
          });
        },
        [&](int wg) {
          for_each_item(cute::false_type{}, [&](int64_t t, int h, int n, uint32_t it0, uint32_t kq) {
            consumer_seesaw<T>(p, s, t, h, n, wg, it0);
            (void)kq;
          });
        });
  } else {
    run_roles<T>([&] { producer_main<T>(p, s, tok, h0, n_slots); },
                 [&](int wg) { consumer_main<T>(p, s, tok, h0, n_slots, wg); });
  }
#endif
}

}  // namespace sa::sm90::dsa_fwd
