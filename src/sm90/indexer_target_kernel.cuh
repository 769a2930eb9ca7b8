// The Hopper (sm_90a) attention target of the indexer KL loss (SPEC 5): the same contract as the
// portable target (src/sm80/indexer_target_kernel.cuh; TargetParams in
// cuda/indexer_loss_driver.hpp), per slot i of token t and head group g (64 heads):
//
//   log A_g[t, i] = ln 2 * log2 sum_{h in g} 2^(x_h),   x_h = scale log2(e) <q[t, h], kv[key]> -
//                                                            lse_h log2(e)
//
// over the heads whose lse is finite (lse = +inf and rows past H: no term; -inf when no head has
// one, or every term is below 2^-126: reduce_store_chunk), stored for every slot below the active
// prefix (sparse: key = idx[t, i], an inactive index reads nothing and its kv row is zeros) or
// every key of the token's range (dense mode, kDense:
// key = range_begin(t) + i, contiguous rows, no index loads). Nothing else of log_a is written.
//
// Work split. A CTA is one token and a PAIR of head groups (2 x 64 heads; the pair's second group
// may not exist: H <= 64, or an odd group count), one CTA per (token, pair), not persistent. The
// portable target (as would a Hopper kernel with one group per CTA) gathers each selected kv row
// once per 64 heads: 64 x 2 FLOP per gathered byte, so at H 128 it needs twice the L2 -> SM
// bandwidth of this split (128 FLOP per byte, the DSA forward's intensity). Both groups' Q stay
// resident (147 KB), which leaves room for two stages of 32 keys. (An opt-in variant keeps Q in
// registers instead, with six stages: indexer_target_rs_kernel.cuh.)
//
// Roles (384 threads, 3 warpgroups; no register reconfiguration: nobody needs more than the
// launch's 168):
//   producer  warpgroup 0: gathers Q of both groups once (rows past H zero-filled, an absent
//             group not at all) onto q_full, then the token's kv rows stage by stage (32 keys x
//             D_qk, cp.async, inactive slots zero-filled without a read), each stage's copies
//             completing on full[stage] (cp.async.mbarrier.arrive.noinc), after empty[stage].
//             Indices are loaded one stage ahead.
//   consumer  warpgroup 1 + w (w = 0, 1) owns group 2 pair + w (returns at once when it does not
//             exist: empty's arrival count is 128 per present group): S = Q_w K^T (m64n32, K =
//             D_qk, wgmma SS from the 128B-swizzled panels) for EVERY stage; both consumers read
//             the same stage.
//
// Consumer timeline (S double-buffered in registers; chunk c in stage c % 2 and tS[c % 2]):
//   issue c     wait full[c % 2]; S[c % 2] = Q K_c^T, 32 (D_qk 512) or 36 wgmma m64n32k16, one
//               commit group
//   retire c    wgmma wait<0> (chunk c's batch, the only one in flight); every thread arrives on
//               empty[c % 2]: the producer refills the stage while chunk c + 1's copies may still
//               be landing (two fills in flight)
//   issue c + 1
//   [E1] c      2^(x + 64), x = S scale_log2 - lse2 (no maximum: reduce_store_chunk says why),
//               summed over the thread's 2 rows, then reduce-scattered over the 8 lanes of a
//               column (xor shuffles 16, 8, 4) -> one key's sum over the warp's 16 heads per
//               lane -> smem part[w][c % 2][warp]
//   [E2] c      named barrier of the warpgroup (128 threads); lanes 0..7 of each warp take 8 keys:
//               the 4 warps' sums added in warp order (deterministic), log A_g = ln 2 (log2 l -
//               64) (-inf when l = 0) -> global, slot < n_slots
//   retire c + 1, issue c + 2, epilogue c + 1, ...
// so each epilogue runs under the next chunk's batch, and both warpgroups' batches share the
// tensor pipe. part is double-buffered by chunk parity: chunk c + 2's writes follow every read of
// chunk c's through chunk c + 1's barrier. The loop's head always has exactly one batch in flight
// and its exits none: ptxas keeps the batches asynchronous (no injected waits, no serialization).
//
// Shared memory (bytes, D_qk 576; 512 leaves the rope panels unused): Q 2 groups x (64 x 512 +
// 64 x 64) x 2 = 147,456; kv 2 stages x (32 x 512 + 32 x 64) x 2 = 73,728; part 2 x 2 x 4 x 32 x
// 4 = 2,048; 5 mbarriers: 223,272, rounded to 224,256 by the 1024-byte alignment, + 1,024 slack
// for aligning the dynamic base = 225,280 of sm_90's 232,448.
//
// Registers (ptxas 13.0 -v, sparse and dense): 58 per thread at D_qk 512, 60 at 576, no stack
// frame, no spill; no register reconfiguration. The operand descriptors are
// rebuilt at each issue from a pointer the compiler cannot hoist (fresh_ptr): built once before
// the loop, the issue sites' descriptors stayed live (168 registers and 76-140 bytes of spills).
#pragma once

#include <cstdint>

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "common/device_math.cuh"
#include "common/dsa_device.cuh"
#include "cuda/indexer_loss_driver.hpp"  // TargetParams
#include "sm90/dsa_common.cuh"
#include "sm90/hopper_primitives.cuh"

namespace sa::sm90::indexer {

using portable::indexer::TargetParams;

template <int kDqk_>
struct TargetTraits {
  using Element = cutlass::bfloat16_t;
  static constexpr int kDqk = kDqk_;  // 512 or 576
  static constexpr bool kRope = kDqk == 576;
  static constexpr int kGroups = 2;   // head groups (consumer warpgroups) per CTA
  static constexpr int kHeads = 64;   // rows of a group
  static constexpr int kBlockN = 32;  // keys per stage
  static constexpr int kStages = 2;
  static constexpr int kThreads = 384;
  static constexpr int kProducerThreads = 128;
  static constexpr int kConsumerThreads = 128;  // per warpgroup
  static constexpr int kQNopeElems = kHeads * 512;
  static constexpr int kQRopeElems = kHeads * 64;
  static constexpr int kKNopeElems = kBlockN * 512;
  static constexpr int kKRopeElems = kBlockN * 64;
  using H64 = cute::Int<kHeads>;
  using N32 = cute::Int<kBlockN>;
  using D512 = cute::Int<512>;
  using D64 = cute::Int<64>;
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::MMA_64x32x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K,
                                                    cute::SM90::GMMA::Major::K>{}));
  // 64-column panels of 128-byte rows, 128-byte swizzle (panel p of a tile of R rows at byte
  // p R 128; gather_row<kRope, R> writes the same layout).
  using SmemLayoutQNope = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<H64, D512>{}));
  using SmemLayoutQRope = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<H64, D64>{}));
  using SmemLayoutKNope = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<N32, D512>{}));
  using SmemLayoutKRope = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<N32, D64>{}));
};

template <class T>
struct alignas(1024) TargetStorage {
  using Element = typename T::Element;
  Element q_nope[T::kGroups][T::kQNopeElems];
  Element q_rope[T::kGroups][T::kQRopeElems];
  Element kv_nope[T::kStages][T::kKNopeElems];
  Element kv_rope[T::kStages][T::kKRopeElems];
  float part[T::kGroups][2][4][T::kBlockN];  // sums per group, chunk parity, warp, key
  uint64_t q_full;                            // producer's Q copies (128, noinc)
  uint64_t full[T::kStages];                  // producer's kv copies (128, noinc)
  uint64_t empty[T::kStages];                 // every thread of the present consumers
};

template <class T>
constexpr size_t target_smem_bytes() {
  return sizeof(TargetStorage<T>) + 1024;  // + the slack that aligns the dynamic base
}

// The same pointer through a volatile move: values derived from it cannot be hoisted out of the
// loop that computes them.
template <class E>
__device__ __forceinline__ E* fresh_ptr(E* p) {
  uint64_t v;
  asm volatile("mov.b64 %0, %1;\n" : "=l"(v) : "l"(reinterpret_cast<uint64_t>(p)));
  return reinterpret_cast<E*>(v);
}

// The work of a CTA: token, pair of head groups, slots.
struct TargetItem {
  int64_t tok;
  int pair;
  int n_slots;
  int64_t begin;  // dense: the range's first key
};

template <bool kDense>
__device__ __forceinline__ TargetItem target_item(const TargetParams& p) {
  TargetItem it;
  const int pairs = (p.head_groups + 1) / 2;
  // Dense: the heaviest tokens first; sparse: token order (indexer_decisions.md, session 46).
  const unsigned cta = kDense ? heavy_first_cta() : blockIdx.x;
  it.tok = p.tok_begin + static_cast<int64_t>(cta / static_cast<unsigned>(pairs));
  it.pair = static_cast<int>(cta % static_cast<unsigned>(pairs));
  if constexpr (kDense) {
    it.begin = p.meta.range_begin(it.tok, p.dims);
    it.n_slots = static_cast<int>(p.meta.range_size(it.tok, p.dims));
  } else {
    it.begin = 0;
    it.n_slots = dsa_active_slots(p.len, p.len_s, p.topk, it.tok);
  }
  return it;
}

// ---- consumer pieces both target kernels share -------------------------------------------------
// The sum over heads runs without a per-key maximum: each term is 2^(x_h + kTargetBias) with
// x_h = S scale_log2 - lse2_h. When lse is the attention forward's LSE over the same keys (SPEC 5),
// x_h <= 0 up to rounding, so a term is at most 2^kTargetBias and 64 of them at most 2^70: no
// overflow. The bias keeps terms down to x_h = -190 in fp32's normal range; a key whose every head
// has x_h < -190 (probability below 2^-190) gets log A = -inf. With the attention's lse such a
// key's target probability A / sum A = A / H_finite is below 2^-184, under fp32's smallest
// denormal, so the loss sees the same p. An lse more than 57 log2 units (39.5 nats) below the
// attention's can overflow the 64-head sum (log A = +inf, and the loss NaN); docs/indexer.md
// states the contract (indexer_decisions.md, "Session 44": the window above, and the precision).
constexpr float kTargetBias = 64.f;

// This thread's rows of group g (fragment slot r: row 16 warp + lane / 4 + 8 r): kTargetBias -
// lse log2(e), the offset of x_h + kTargetBias; -inf: no term (lse = +inf, or a row past H).
__device__ __forceinline__ void load_target_offset2(const TargetParams& p, int64_t tok, int h0,
                                                    int warp, int lane, float (&off2)[2]) {
  constexpr float kLog2e = 1.4426950408889634f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = h0 + 16 * warp + lane / 4 + 8 * r;
    const float l = h < p.H ? p.lse[tok * p.lse_ss + h * p.lse_sh] : INFINITY;
    off2[r] = l == INFINITY ? -INFINITY : kTargetBias - l * kLog2e;
  }
}

// One reduce-scatter step over the lanes lane and lane ^ xor_mask: each keeps the half of its 2N
// values that its lane bit `hi` selects (the upper half when set) and adds the partner's copy of
// that half.
template <int N>
__device__ __forceinline__ void reduce_scatter_half(const float (&in)[2 * N], float (&out)[N],
                                                    bool hi, int xor_mask) {
  CUTE_UNROLL
  for (int i = 0; i < N; ++i) {
    const float keep = hi ? in[i + N] : in[i];
    const float send = hi ? in[i] : in[i + N];
    out[i] = keep + __shfl_xor_sync(0xffffffffu, send, xor_mask);
  }
}

// A chunk's S (64 heads x kBlockN keys, its batch complete) -> log A_g of its keys.
// [E1] Fragment index 4 j + 2 r + e is row slot r, column 8 j + 2 (lane % 4) + e: the thread sums
//      its 2 rows' terms per column (v[2 j + e]), then the 8 lanes of a column (lane / 4 = 0..7,
//      the same lane % 4) reduce-scatter their 8 columns over lane bits 4, 3, 2 (xor 16, 8, 4:
//      4 + 2 + 1 shuffles), so lane l ends with column k = l / 4's sum over the warp's 16 heads
//      -> part[warp][column] (this chunk parity's [4][kBlockN] partials of the warpgroup); the
//      warpgroup's named barrier bar_id.
// [E2] Lanes 0..7 of warp v: keys 8 v .. 8 v + 7, the 4 warps' sums in warp order
//      (deterministic) -> ln 2 (log2 l - kTargetBias) -> out[slot0 + key] for slots < n_slots
//      (-inf when l = 0: no term, or every term under 2^-126).
template <int kBlockN, class FragS>
__device__ __forceinline__ void reduce_store_chunk(const FragS& tS, float* part,
                                                   const float (&off2)[2], float scale_log2,
                                                   uint32_t bar_id, int warp, int lane, float* out,
                                                   int slot0, int n_slots) {
  static_assert(kBlockN == 32, "lanes 0..7 of 4 warps store the chunk's keys");
  constexpr float kLn2 = 0.693147180559945309f;
  float v[8];
  CUTE_UNROLL
  for (int j = 0; j < kBlockN / 8; ++j) {
    CUTE_UNROLL
    for (int e = 0; e < 2; ++e) {
      // off2 = -inf: fmaf(s, scale, -inf) = -inf for finite s, 2^-inf = 0 (no term).
      v[2 * j + e] = exp2_approx(fmaf(tS(4 * j + e), scale_log2, off2[0])) +
                     exp2_approx(fmaf(tS(4 * j + 2 + e), scale_log2, off2[1]));
    }
  }
  // Reduce-scatter over lane bits 4, 3, 2: 8 -> 4 -> 2 -> 1 column sums per lane.
  float v4[4], v2[2], l_warp[1];
  reduce_scatter_half(v, v4, lane & 16, 16);
  reduce_scatter_half(v4, v2, lane & 8, 8);
  reduce_scatter_half(v2, l_warp, lane & 4, 4);
  const int k = lane / 4;  // v index 2 j + e
  part[warp * kBlockN + 8 * (k / 2) + 2 * (lane % 4) + k % 2] = l_warp[0];
  named_barrier_sync(bar_id, 128);
  if (lane < 8) {
    const int key = 8 * warp + lane;
    const float l = ((part[key] + part[kBlockN + key]) + part[2 * kBlockN + key]) +
                    part[3 * kBlockN + key];
    if (slot0 + key < n_slots) out[slot0 + key] = (log2_approx(l) - kTargetBias) * kLn2;
  }
}

// The consumer's chunk loop: issue(b, tS, c) queues chunk c's batch into tS (b = c % 2, a
// cute::Int), retire(b, tS, c) waits for it (the only batch in flight) and releases its stage,
// epilogue(b, tS, c) reduces and stores it under the next chunk's batch. Every entry of the loop's
// head has exactly chunk c's batch (tS0) in flight, and every exit none: ptxas then keeps the
// batches asynchronous (a loop whose exit test could leave a batch in flight, as far as ptxas could
// tell, got wgmma waits injected and serialized, C7514).
template <class FragS, class Issue, class Retire, class Epilogue>
__device__ __forceinline__ void chunk_loop(int n_chunks, FragS& tS0, FragS& tS1, Issue&& issue,
                                           Retire&& retire, Epilogue&& epilogue) {
  const cute::Int<0> b0{};
  const cute::Int<1> b1{};
  issue(b0, tS0, 0);
#pragma unroll 1
  for (int c = 0;; c += 2) {
    retire(b0, tS0, c);
    if (c + 1 >= n_chunks) {
      epilogue(b0, tS0, c);
      break;
    }
    issue(b1, tS1, c + 1);
    epilogue(b0, tS0, c);
    retire(b1, tS1, c + 1);
    if (c + 2 >= n_chunks) {
      epilogue(b1, tS1, c + 1);
      break;
    }
    issue(b0, tS0, c + 2);
    epilogue(b1, tS1, c + 1);
  }
}

// chunk_loop with each chunk's ring stage known at compile time: chunk c sits in stage (kStage0
// + c) % kStages, and the loop is unrolled by kStages (even: a whole number of the two S
// buffers' turns), so that issue(stage_tag, tS, c) and retire(stage_tag, tS, c) get Int<stage>
// and form their shared-memory descriptors from constants instead of rebuilding them per wgmma
// from a run-time stage. The same batches in flight at the loop's head and exits as chunk_loop;
// epilogue(parity_tag, tS, c) as there. Each step leaves the loop by its own break (steps that
// returned to a common exit made ptxas keep both S accumulators live there: 36-108 B of spill).
template <int kStages, int kStage0, class FragS, class Issue, class Retire, class Epilogue>
__device__ __forceinline__ void chunk_loop_staged(int n_chunks, FragS& tS0, FragS& tS1,
                                                  Issue&& issue, Retire&& retire,
                                                  Epilogue&& epilogue) {
  static_assert(kStages == 6, "the unrolled steps below are written for six stages");
  using cute::Int;
  issue(Int<kStage0 % kStages>{}, tS0, 0);
  // Step i of a pass: chunk c + i in stage (kStage0 + i) % kStages and S buffer i % 2.
  auto step = [&](auto i_tag, int c, auto& cur, auto& nxt) {
    constexpr int kI = decltype(i_tag)::value;
    retire(Int<(kStage0 + kI) % kStages>{}, cur, c + kI);
    if (c + kI + 1 >= n_chunks) {
      epilogue(Int<kI % 2>{}, cur, c + kI);
      return true;
    }
    issue(Int<(kStage0 + kI + 1) % kStages>{}, nxt, c + kI + 1);
    epilogue(Int<kI % 2>{}, cur, c + kI);
    return false;
  };
#pragma unroll 1
  for (int c = 0;; c += kStages) {
    if (step(Int<0>{}, c, tS0, tS1)) break;
    if (step(Int<1>{}, c, tS1, tS0)) break;
    if (step(Int<2>{}, c, tS0, tS1)) break;
    if (step(Int<3>{}, c, tS1, tS0)) break;
    if (step(Int<4>{}, c, tS0, tS1)) break;
    if (step(Int<5>{}, c, tS1, tS0)) break;
  }
}

// ---- producer (warpgroup 0, 128 threads) --------------------------------------------------------
// Thread t copies 16-byte chunk t % 8 of each 128-byte panel row of rows t / 8 and t / 8 + 16 of
// every stage (one swizzle phase for both).
template <class T, bool kDense>
__device__ __forceinline__ void target_producer(const TargetParams& p, TargetStorage<T>& s,
                                                const TargetItem& it, int n_chunks) {
  const int t = threadIdx.x;  // 0..127
  const int warp = t / 32, lane = t % 32;
  // Q of the pair's present groups; rows past H zero-filled.
  const DsaElement* const q_tok = reinterpret_cast<const DsaElement*>(p.q) + it.tok * p.q_ss;
#pragma unroll
  for (int w = 0; w < T::kGroups; ++w) {
    const int g = T::kGroups * it.pair + w;
    if (g < p.head_groups) {
      const int h0 = g * T::kHeads;
      gather_head_rows<T::kRope, true, T::kHeads>(smem_u32(s.q_nope[w]), smem_u32(s.q_rope[w]),
                                                  q_tok, p.q_sh, h0, warp, lane, p.H - h0);
    }
  }
  cp_async_mbarrier_arrive_noinc(&s.q_full);

  const DsaElement* const kv = reinterpret_cast<const DsaElement*>(p.kv);
  const int32_t* const idx_row = kDense ? nullptr : p.idx + it.tok * p.idx_ss;
  auto load_indices = [&](int c, int32_t(&j)[2]) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int slot = c * T::kBlockN + t / 8 + 16 * k;
      if constexpr (kDense) {
        j[k] = slot < it.n_slots ? static_cast<int32_t>(it.begin + slot) : -1;
      } else {
        j[k] = slot < it.n_slots ? __ldg(idx_row + slot * p.idx_si) : -1;
      }
    }
  };
  int32_t j[2];
  load_indices(0, j);
#pragma unroll 1
  for (int c = 0; c < n_chunks; ++c) {
    const int stage = c % T::kStages;
    int32_t j_next[2] = {-1, -1};
    if (c + 1 < n_chunks) load_indices(c + 1, j_next);
    // Stage free: its previous chunk's S is done (a fresh barrier passes parity 1 at once).
    mbarrier_wait(&s.empty[stage], ((c / T::kStages) & 1) ^ 1);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const bool active = j[k] >= 0 && j[k] < p.skv;
      gather_row<T::kRope, T::kBlockN>(smem_u32(s.kv_nope[stage]), smem_u32(s.kv_rope[stage]),
                                       t / 8 + 16 * k, kv + (active ? j[k] * p.kv_ss : int64_t{0}),
                                       active ? 16 : 0, lane);
    }
    cp_async_mbarrier_arrive_noinc(&s.full[stage]);
    j[0] = j_next[0];
    j[1] = j_next[1];
  }
  // Every copy completes on a barrier that a consumer waits for before the CTA ends.
}

// ---- consumers (warpgroups 1, 2) ----------------------------------------------------------------
template <class T, bool kDense>
__device__ __forceinline__ void target_consumer(const TargetParams& p, TargetStorage<T>& s,
                                                const TargetItem& it, int n_chunks, int w) {
  using namespace cute;
  const int g = T::kGroups * it.pair + w;
  if (g >= p.head_groups) return;  // warpgroup-uniform; empty[] does not count this warpgroup
  const int wtid = threadIdx.x % 128;
  const int lane = threadIdx.x % 32;
  const int warp = wtid / 32;
  const int h0 = g * T::kHeads;
  const uint32_t bar_id = 1 + static_cast<uint32_t>(w);  // named barrier of this warpgroup

  typename T::TiledMma mma;
  auto thr = mma.get_thread_slice(wtid);
  Tensor tS0 = partition_fragment_C(mma, Shape<typename T::H64, typename T::N32>{});
  Tensor tS1 = partition_fragment_C(mma, Shape<typename T::H64, typename T::N32>{});
  static_assert(decltype(size(tS0))::value == 16, "S fragment: 64 x 32 per warpgroup");

  float off2[2];
  load_target_offset2(p, it.tok, h0, warp, lane, off2);
  const float scale_log2 = p.scale_log2;
  float* const out = p.log_a + int64_t{g} * p.la_gs + (it.tok - p.tok_begin) * p.la_ts;

  // S = Q K^T of chunk c into tS (stage c % 2: compile-time kStage, so that the descriptor
  // fragments are not indexed at run time).
  auto issue = [&](auto stage_tag, auto& tS, int c) {
    constexpr int kStage = decltype(stage_tag)::value;
    mbarrier_wait(&s.full[kStage], (c / T::kStages) & 1);
    fence_proxy_async_shared();
    // The operand descriptors, from addresses the compiler cannot hoist out of the loop (built
    // once before it, the three issue sites' 2 x 36 descriptors stayed live: 168 registers and
    // spills).
    Tensor tQn = thr.partition_fragment_A(make_tensor(
        make_smem_ptr(fresh_ptr(&s.q_nope[w][0])), typename T::SmemLayoutQNope{}));  // (MMA,1,32)
    Tensor tQr = thr.partition_fragment_A(make_tensor(
        make_smem_ptr(fresh_ptr(&s.q_rope[w][0])), typename T::SmemLayoutQRope{}));  // (MMA,1,4)
    Tensor tKn = thr.partition_fragment_B(make_tensor(
        make_smem_ptr(fresh_ptr(&s.kv_nope[kStage][0])), typename T::SmemLayoutKNope{}));
    Tensor tKr = thr.partition_fragment_B(make_tensor(
        make_smem_ptr(fresh_ptr(&s.kv_rope[kStage][0])), typename T::SmemLayoutKRope{}));
    warpgroup_fence_operand(tS);
    warpgroup_arrive();
    mma.accumulate_ = SM90::GMMA::ScaleOut::Zero;
    CUTE_UNROLL
    for (int kb = 0; kb < 32; ++kb) {
      cute::gemm(mma, tQn(_, _, kb), tKn(_, _, kb), tS);
      mma.accumulate_ = SM90::GMMA::ScaleOut::One;
    }
    if constexpr (T::kRope) {
      CUTE_UNROLL
      for (int kb = 0; kb < 4; ++kb) cute::gemm(mma, tQr(_, _, kb), tKr(_, _, kb), tS);
    }
    warpgroup_commit_batch();
  };

  // Chunk c's batch (the only one in flight) completes; the stage goes back to the producer at
  // once, so that its refill overlaps the next chunk's copies still in flight.
  auto retire = [&](auto stage_tag, auto& tS, int) {
    constexpr int kStage = decltype(stage_tag)::value;
    warpgroup_wait<0>();
    warpgroup_fence_operand(tS);
    mbarrier_arrive(&s.empty[kStage]);  // this thread's wgmma reads of the stage are done
  };

  // Chunk c's S (its batch complete): reduce over the heads, store (under chunk c + 1's batch).
  auto epilogue = [&](auto stage_tag, auto& tS, int c) {
    constexpr int kStage = decltype(stage_tag)::value;
    reduce_store_chunk<T::kBlockN>(tS, s.part[w][kStage][0], off2, scale_log2, bar_id, warp,
                                   lane, out, c * T::kBlockN, it.n_slots);
  };

  mbarrier_wait(&s.q_full, 0);
  chunk_loop(n_chunks, tS0, tS1, issue, retire, epilogue);
}

// ---- kernel -------------------------------------------------------------------------------------
template <class T, bool kDense>
__global__ void __launch_bounds__(T::kThreads, 1)
    target_sm90_kernel(const __grid_constant__ TargetParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  TargetStorage<T>& s = aligned_shared_storage<TargetStorage<T>>(smem_raw);
  const TargetItem it = target_item<kDense>(p);
  const int n_chunks = (it.n_slots + T::kBlockN - 1) / T::kBlockN;
  if (n_chunks == 0) return;  // nothing to store (CTA-uniform)
  if (threadIdx.x == 0) {
    const int present = min(T::kGroups, p.head_groups - T::kGroups * it.pair);
    mbarrier_init(&s.q_full, T::kProducerThreads);
    for (int b = 0; b < T::kStages; ++b) {
      mbarrier_init(&s.full[b], T::kProducerThreads);
      mbarrier_init(&s.empty[b], T::kConsumerThreads * present);
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  if (wg == 0) {
    target_producer<T, kDense>(p, s, it, n_chunks);
  } else {
    target_consumer<T, kDense>(p, s, it, n_chunks, wg - 1);
  }
#endif
}

}  // namespace sa::sm90::indexer
