// The pipelined Hopper indexer loss kernels (SPEC 5; internal tuning sm90_indexer_loss_kernel =
// 4, the default): dense mode's pair kernel here, sparse mode's one-token kernel at the end of
// this file (loss_sm90_sparse_pipe_kernel, its own header there).
//
// Dense mode (loss_sm90_pipe_kernel): the dense
// pair kernel's work split and math (two tokens per CTA on the same 64-key chunks of the span of
// their ranges, warpgroup w on token t0 + w; GEMM1, the pair dK with K = 2 H_I, dQ^T, the
// shared row functions), with the loads moved to a producer warpgroup and each consumer's GEMMs
// in flight while its epilogue and dk reductions run. Why, with the arithmetic and the
// prediction: docs/indexer_decisions.md, "The pipelined sm90 loss kernel".
//
// Roles (384 threads, one CTA per SM, setmaxnreg 40 / 232):
//   warpgroup 0, producer: every chunk of pass 1, then (gradients) every chunk of pass 2, into a
//     kStages ring: the 64 k_I rows (gather_k_rows, 16-byte cp.async; the chunk's rows are
//     consecutive) and each token's log A_g of the chunk's keys (4-byte cp.async), combined by
//     the producer into one log A per (token, key) once landed (kLag chunks later), then
//     full[stage] (128 arrivals); it waits for empty[stage] (256 consumer arrivals) before
//     refilling. Ring index k: pass 1 chunk c is k = c, pass 2 chunk c is k = n_chunks + c; stage
//     k % kStages, phase (k / kStages) & 1.
//   warpgroups 1, 2, consumers of tokens t0, t0 + 1. No [b] sweep: pass 1 folds log A into the
//     online sums beside I (DenseOnlineSums), so log Z_A comes with log Z_I after pass 1.
//
// Consumer timeline (G1 = GEMM1 of a chunk, dK = the pair's dK of this warpgroup's 64 columns,
// dQ = this token's dQ^T, E = epilogue, R = the chunk's dk reductions, | = the consumers' named
// barrier, [x, y] = batches in flight while the code on the left runs):
//
//   pass 1 (chunk_loop, two accumulators):
//     G1(0) | wait G1(0); G1(1); E1(0) [G1(1)] ; wait G1(1); G1(2); E1(1) [G1(2)] ; ...
//     E1(c) = I, the online sums (t4 = 0 lanes, keys of the token's range), release(c)
//   [d] dense_online_row_loss: log Z_I, log Z_A, the loss; q_w
//   pass 2 (one accumulator of each kind):
//     G1(0); wait; E2(0) |
//     chunk c: dK(c); wait dQ(c-1); release(c-1)    [dK(c)]
//              G1(c+1); dQ(c); wait dK(c); R(c)      [G1(c+1), dQ(c)]
//              wait G1(c+1); E2(c+1) |               [dQ(c)]
//     (the last chunk: dK(c); dQ(c); R(c); wait all; release(c))
//     E2(c) = I, dI, G -> the G ring slot c % 2, dw; fence.proxy.async; the barrier (both tokens'
//     G of chunk c visible before either warpgroup's dK(c))
//
// So the tensor pipe holds at least one batch of each consumer while that consumer runs E2 or R:
// per pair-chunk 1,536 tensor cycles (6 batches of 256: G1, dK, dQ per warpgroup) against E2 and
// R of both warpgroups interleaved on the SM's four schedulers.
//
// Shared-memory reuse: a k_I stage and its log A are released after the chunk's dQ retired
// (pass 2) or its E1 (pass 1). Warpgroup w's panel of G ring slot c % 2 is rewritten by its
// E2(c + 2) in body c + 1: dQ(c) retired in every consumer thread (E2 waits for empty[]'s phase of
// chunk c's stage: a thread's wgmma.wait_group covers its own warp's slice only), and both
// warpgroups' dK(c) (which read both panels) retired before they reached the barrier of E2(c + 1).
//
// Registers (H_I 64, per consumer thread): dq^T 64, G1 accumulator 32 (two in pass 1), dK 32, dw
// 16, the rest (addresses, dI, ring state): ptxas (CUTLASS 4.2, CUDA 13.0) allocates R0..R178 in
// the consumer region (setmaxnreg 232; H_I 32 / 16: R123 / R101) and R0..R37 in the producer's
// (40); no spills, no C75xx.
// Shared memory (bytes from a 1024-aligned base; H_I 64, 2 head groups, 6 stages): q_I 2 x
// 16,384, q_w 2 x 16,384, k_I ring 6 x 16,384, G ring 2 x 2 x 8,192, w / scratch / dw / ranges /
// barriers ~3.7 KB, log A ring 6 x 2 x 256, log A_g ring 6 x 2 x groups x 256, + 1,024 slack:
// 210,560 bytes at 2 groups (one CTA per SM, as the registers of 384 threads require anyway).
#pragma once

#include <cstdint>

#include "sm90/indexer_loss_kernel.cuh"
#include "sm90/indexer_target_kernel.cuh"  // chunk_loop

namespace sa::sm90::loss {

// Named barriers of the pipelined kernel (0 is __syncthreads, taken only before the roles split).
enum class PipeBarrier : uint32_t {
  kConsumers = 1,  // both consumer warpgroups (256 threads): row reductions, the G ring, q_w
  kSparseConsumer = 1,  // the sparse kernel's one consumer warpgroup (128 threads)
};

// The shared row functions' barrier (portable::indexer::CtaBarrier's place) over the consumers.
struct ConsumerBarrier {
  __device__ __forceinline__ static void sync() {
    named_barrier_sync(static_cast<uint32_t>(PipeBarrier::kConsumers), 256);
  }
};

// The k_I ring's mbarriers (full[kStages], then empty[kStages], from `bars`), by ring index k
// (stage k % kStages, use k / kStages): the producer acquires a stage (its previous use released;
// use 0 at once) and arrives on full; a consumer waits for full, then fences (the copies are
// cp.async, read by wgmma), and releases; wait_released(k) waits until every consumer released
// use k (whose next use no one can release before this thread does).
template <int kStages>
struct StageRing {
  uint64_t* full;
  __device__ __forceinline__ explicit StageRing(uint8_t* bars)
      : full(reinterpret_cast<uint64_t*>(bars)) {}
  __device__ __forceinline__ static uint32_t use_parity(int k) {
    return static_cast<uint32_t>(k / kStages) & 1u;
  }
  __device__ __forceinline__ uint64_t* full_of(int k) const { return full + k % kStages; }
  __device__ __forceinline__ uint64_t* empty_of(int k) const {
    return full + kStages + k % kStages;
  }
  // One thread, before the CTA barrier that precedes every use.
  __device__ __forceinline__ void init(uint32_t producers, uint32_t consumers) const {
    for (int b = 0; b < kStages; ++b) {
      mbarrier_init(full + b, producers);
      mbarrier_init(full + kStages + b, consumers);
    }
    fence_mbarrier_init();
  }
  __device__ __forceinline__ void acquire(int k) const {
    mbarrier_wait(empty_of(k), use_parity(k) ^ 1u);
  }
  __device__ __forceinline__ void wait_full(int k) const {
    mbarrier_wait(full_of(k), use_parity(k));
    fence_proxy_async_shared();
  }
  __device__ __forceinline__ void release(int k) const { mbarrier_arrive(empty_of(k)); }
  __device__ __forceinline__ void wait_released(int k) const {
    mbarrier_wait(empty_of(k), use_parity(k));
  }
};

template <class T>
struct PipeTraits {
  using Pair = PairTraits<T>;
  static constexpr int kStages = 6;
  static constexpr int kThreads = 384;
  static constexpr int kProducerThreads = 128;
  static constexpr int kConsumerThreads = 256;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static_assert(kProducerThreads * kProducerRegs + kConsumerThreads * kConsumerRegs <=
                    setmaxnreg_pool(kThreads, 1),
                "register split exceeds the CTA's register pool");
  static constexpr int kQOff = 0;                                   // q_I, [token]
  static constexpr int kQwOff = kQOff + 2 * T::kQBytes;             // q_w, [half][token] panels
  static constexpr int kKOff = kQwOff + 2 * T::kQBytes;             // k_I ring, [stage]
  static constexpr int kGOff = kKOff + kStages * T::kStageBytes;    // G ring, [slot][token]
  static constexpr int kGSlotBytes = 2 * Pair::kGPanelBytes;
  static constexpr int kWOff = kGOff + 2 * kGSlotBytes;             // w, [token][H_I] fp32
  static constexpr int kRedOff = kWOff + 2 * T::kHeads * 4;         // [token][128] fp32
  static constexpr int kDwOff = kRedOff + 2 * T::kThreads * 4;      // [token][warp][H_I] fp32
  static constexpr int kRangeOff = kDwOff + 2 * T::kWarps * T::kHeads * 4;  // [token][2] int64
  static constexpr int kBarOff = kRangeOff + 32;                    // full[kStages], empty[]
  static constexpr int kLaOff = kBarOff + 2 * kStages * 8;  // log A, [stage][token][64] fp32
  static constexpr int kLagOff = kLaOff + kStages * 2 * T::kChunk * 4;  // log A_g, [stage][token]
                                                                        // [group][64] fp32
  // The producer publishes chunk k - kLag after issuing chunk k's copies (below).
  static constexpr int kLag = 2;
  static_assert(kStages >= kLag + 2, "a consumer waiting for chunk j has released j - 2 only");
  static_assert(kQwOff % 1024 == 0 && kKOff % 1024 == 0 && kGOff % 1024 == 0 &&
                    kGSlotBytes % 1024 == 0 && Pair::kGPanelBytes % 1024 == 0,
                "swizzled tiles on 1024 bytes");
  static_assert(kRangeOff % 8 == 0 && kBarOff % 8 == 0, "int64 ranges and mbarriers aligned");
  static constexpr int smem_bytes(int groups) {
    return kLagOff + kStages * 2 * groups * T::kChunk * 4 + 1024;
  }
};

// The CTA's two tokens and the span of their ranges (every thread computes it: the producer
// streams its chunks without waiting for the consumers' [b]).
struct PipeSpan {
  int64_t t0;          // token of warpgroup 1; t0 + 1 of warpgroup 2 (absent at tok_end)
  int64_t rb0, rb1;    // range begin of each token
  int rn0, rn1;        // range size (0: absent or empty)
  int64_t begin;       // the span [begin, begin + n)
  int n, n_chunks;
  // Token w's range (selects, not an indexed array: no local memory).
  __device__ __forceinline__ int64_t range_b(int w) const { return w == 0 ? rb0 : rb1; }
  __device__ __forceinline__ int range_n(int w) const { return w == 0 ? rn0 : rn1; }
};

template <class T>
__device__ __forceinline__ PipeSpan pipe_span(const LossParams& p) {
  PipeSpan sp;
  sp.t0 = p.tok_begin + 2 * int64_t{heavy_first_cta()};  // dense, causal: later tokens, more keys
  int64_t b = INT64_MAX, e = INT64_MIN;
  int64_t rb[2] = {0, 0};
  int rn[2] = {0, 0};
  CUTE_UNROLL
  for (int w = 0; w < 2; ++w) {
    const int64_t tok = sp.t0 + w;
    if (tok < p.tok_end) {
      rb[w] = p.meta.range_begin(tok, p.dims);
      rn[w] = static_cast<int>(p.meta.range_size(tok, p.dims));
    }
    if (rn[w] > 0) {
      b = b < rb[w] ? b : rb[w];
      e = e > rb[w] + rn[w] ? e : rb[w] + rn[w];
    }
  }
  sp.rb0 = rb[0];
  sp.rb1 = rb[1];
  sp.rn0 = rn[0];
  sp.rn1 = rn[1];
  sp.begin = b;
  sp.n = e > b ? static_cast<int>(e - b) : 0;
  sp.n_chunks = (sp.n + T::kChunk - 1) / T::kChunk;
  return sp;
}

// ---- producer (warpgroup 0, 128 threads) --------------------------------------------------------
// Ring index k (chunk c of pass 1 or 2): wait for empty[stage], copy the chunk's k_I rows
// (gather_k_rows) and, thread t, the log A_g of key t % 64 of token t / 64 (when in its range) as
// one cp.async group; then publish chunk k - kLag: wait for its group (cp.async.wait_group kLag),
// combine its key's log A_g into log A (log_a_combine: the consumers' loop, the same fp32
// operations) in s_la, arrive on full[its stage] (128 arrivals, release). One log A per key
// instead of every consumer warp combining its rows: per pair-chunk ~4 producer warp-instructions
// per key and group instead of ~15 consumer warp-instructions per row and group.
template <class T>
__device__ __forceinline__ void pipe_producer(const LossParams& p, uint8_t* smem,
                                              const PipeSpan& sp) {
  using L = PipeTraits<T>;
  constexpr int kChunk = T::kChunk;
  constexpr int kStages = L::kStages;
  static_assert(L::kProducerThreads == 2 * kChunk, "a producer thread per (token, key)");
  const int t = threadIdx.x;  // 0..127
  const int w = t / kChunk, r = t % kChunk;
  const uint32_t sk = smem_u32(smem + L::kKOff);
  float* const s_la = reinterpret_cast<float*>(smem + L::kLaOff);
  float* const s_lag = reinterpret_cast<float*>(smem + L::kLagOff);
  const StageRing<kStages> ring(smem + L::kBarOff);
  const int groups = p.head_groups;
  const int total = (p.grads ? 2 : 1) * sp.n_chunks;
  const int64_t rb = sp.range_b(w), re = rb + sp.range_n(w);
  const float* const la_tok = p.log_a + (sp.t0 + w - p.la_tok0) * p.la_ts;
  auto chunk_of = [&](int k) { return k < sp.n_chunks ? k : k - sp.n_chunks; };
  // Chunk j's copies have landed (this thread's): its log A, then the arrival (the consumers also
// fence after their wait: the order of the kernels' landed_barrier on both sides).
  auto publish = [&](int j) {
    const int stage = j % kStages;
    const int64_t key = sp.begin + chunk_of(j) * kChunk + r;
    const float la = key >= rb && key < re
                         ? portable::indexer::log_a_combine(
                               s_lag + (stage * 2 + w) * groups * kChunk + r, kChunk, groups)
                         : -INFINITY;
    s_la[(stage * 2 + w) * kChunk + r] = la;
    fence_proxy_async_shared();  // this thread's landed k_I rows, for the consumers' wgmma
    mbarrier_arrive(ring.full_of(j));
  };
#pragma unroll 1
  for (int k = 0; k < total; ++k) {
    const int stage = k % kStages;
    const int c = chunk_of(k);
    ring.acquire(k);
    gather_k_rows<T, L::kProducerThreads>(p, sk, c, stage, sp.n,
                                          [&](int pos) { return sp.begin + pos; }, t);
    const int64_t key = sp.begin + c * kChunk + r;
    if (key >= rb && key < re)
      for (int hg = 0; hg < groups; ++hg)
        cp_async_4(smem_u32(s_lag + ((stage * 2 + w) * groups + hg) * kChunk + r),
                   la_tok + hg * p.la_gs + (key - rb));
    cp_async_commit();
    if (k >= L::kLag) {
      cp_async_wait<L::kLag>();
      publish(k - L::kLag);
    }
  }
  cp_async_wait<0>();
  for (int j = total > L::kLag ? total - L::kLag : 0; j < total; ++j) publish(j);
}

// ---- consumers (warpgroups 1, 2; wg 0 / 1 here) -------------------------------------------------
template <class T>
__device__ __forceinline__ void pipe_consumer(const LossParams& p, uint8_t* smem,
                                              const PipeSpan& sp, int wg) {
  using namespace cute;
  using Element = typename T::Element;
  using namespace portable::indexer;
  using L = PipeTraits<T>;
  using P = PairTraits<T>;
  using Bar = ConsumerBarrier;
  constexpr int kT = T::kThreads;  // per token
  constexpr int kChunk = T::kChunk;
  constexpr int kHeads = T::kHeads;
  constexpr int kStages = L::kStages;
  const int wtid = threadIdx.x % kT;
  const int lane = wtid & 31, warp = wtid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int64_t tok = sp.t0 + wg;
  const bool present = tok < p.tok_end;
  const int n_chunks = sp.n_chunks;
  float* const s_w = reinterpret_cast<float*>(smem + L::kWOff) + wg * kHeads;
  float* const s_red = reinterpret_cast<float*>(smem + L::kRedOff) + wg * kT;
  float* const s_dw = reinterpret_cast<float*>(smem + L::kDwOff) + wg * T::kWarps * kHeads;
  int64_t* const s_range = reinterpret_cast<int64_t*>(smem + L::kRangeOff);  // [2][begin, end]
  const float* const s_la = reinterpret_cast<const float*>(smem + L::kLaOff);
  const StageRing<kStages> ring(smem + L::kBarOff);
  const uint32_t sq = smem_u32(smem + L::kQOff + wg * T::kQBytes);

  // [c] q_I and w of the token (zeros when absent), visible to both consumers' wgmma.
  load_q_and_w<T, kT>(p, tok, present, sq, s_w, wtid, wtid & 15);
  cp_async_commit();
  cp_async_wait_all();
  fence_proxy_async_shared();
  Bar::sync();

  Element* const q_el = reinterpret_cast<Element*>(smem + L::kQOff) + wg * (T::kQBytes / 2);
  auto k_el = [&](int k) {
    return fresh_ptr(reinterpret_cast<Element*>(smem + L::kKOff)) +
           (k % kStages) * (T::kStageBytes / 2);
  };
  auto wait_full = [&](int k) { ring.wait_full(k); };
  auto release = [&](int k) { ring.release(k); };
  auto chunk_la = [&](int k, int r) { return s_la[((k % kStages) * 2 + wg) * kChunk + r]; };
  const int64_t raw_b = sp.range_b(wg), raw_e = raw_b + sp.range_n(wg);
  auto key_at = [&](int c, int r) { return sp.begin + c * kChunk + r; };

  typename T::Mma1 mma1;
  using FragA = decltype(partition_fragment_C(mma1, Shape<typename T::N64, typename T::HT>{}));

  // Pass 1 (ring indices 0 .. n_chunks - 1): I and log A of the token's keys into the sums.
  DenseOnlineSums sums;
  {
    FragA acc0 = partition_fragment_C(mma1, Shape<typename T::N64, typename T::HT>{});
    FragA acc1 = partition_fragment_C(mma1, Shape<typename T::N64, typename T::HT>{});
    clear(acc0);  // defined before the first batch (no phi copies of undefined values later)
    clear(acc1);
    warpgroup_fence_operand(acc0);
    warpgroup_fence_operand(acc1);
    auto issue = [&](auto, auto& acc, int c) {
      wait_full(c);
      gemm1_issue<T>(k_el(c), q_el, acc, wtid);
    };
    auto retire = [&](auto, auto& acc, int) {
      warpgroup_wait<0>();  // only this chunk's batch is in flight here
      scale_acc(acc, p.scale_I);
    };
    auto epilogue = [&](auto, auto& acc, int c) {
      float row[2];
      wg_row_scores<T>(acc, s_w, row);
      CUTE_UNROLL
      for (int i = 0; i < 2; ++i) {
        const int r = 16 * warp + g + 8 * i;
        const int64_t key = key_at(c, r);
        if (t4 == 0 && key >= raw_b && key < raw_e) sums.add(row[i], chunk_la(c, r));
      }
      release(c);
    };
    indexer::chunk_loop(n_chunks, acc0, acc1, issue, retire, epilogue);
  }

  // [b] + [d] log Z_I, log Z_A and the row's loss; an empty row (no range or no target mass).
  float log_zi = 0.f, log_za = 0.f;
  const float row_loss = dense_online_row_loss<kT, 2, Bar>(sums, p.coeff, s_red, &log_zi, &log_za);
  const bool live = present && sp.range_n(wg) > 0 && log_za != -INFINITY;
  if (live)
    write_row_loss<kT, 2>(p, tok, row_loss);
  else if (present)
    write_empty_row<kT, kHeads, 2>(p, tok);
  if (!p.grads) return;

  // [e] Pass 2 (ring indices n_chunks + c). The live ranges of both tokens; q_w of this token.
  if (wtid == 0) {
    s_range[2 * wg] = live ? raw_b : INT64_MAX;
    s_range[2 * wg + 1] = live ? raw_e : INT64_MIN;
  }
  store_q_w<T>(p, smem + L::kQOff + wg * T::kQBytes, smem + L::kQwOff + wg * T::kQPanelBytes,
               s_w, wtid);
  Bar::sync();
  const int64_t b0 = s_range[0], e0 = s_range[1], b1 = s_range[2], e1 = s_range[3];
  const int64_t my_b = wg == 0 ? b0 : b1, my_e = wg == 0 ? e0 : e1;  // empty when not live
  auto mine = [&](int64_t key) { return key >= my_b && key < my_e; };
  auto either = [&](int64_t key) { return (key >= b0 && key < e0) || (key >= b1 && key < e1); };

  typename P::Mma2 mma2;
  typename T::Mma3 mma3;
  auto thr2 = mma2.get_thread_slice(wtid);
  auto thr3 = mma3.get_thread_slice(wtid);
  Tensor dq = partition_fragment_C(mma3, Shape<typename T::D128, typename T::HT>{});
  clear(dq);
  float dw_acc[T::kNt][2];
  CUTE_UNROLL
  for (int nt = 0; nt < T::kNt; ++nt) dw_acc[nt][0] = dw_acc[nt][1] = 0.f;
  auto g_slot = [&](int c) {  // both tokens' G of chunk c
    return fresh_ptr(reinterpret_cast<Element*>(smem + L::kGOff)) +
           (c & 1) * (L::kGSlotBytes / 2);
  };
  Element* const qw_el = reinterpret_cast<Element*>(smem + L::kQwOff + wg * 2 * T::kQPanelBytes);
  FragA acc = partition_fragment_C(mma1, Shape<typename T::N64, typename T::HT>{});
  Tensor dk = partition_fragment_C(mma2, Shape<typename T::N64, typename T::D64>{});
  const int k0 = n_chunks;

  // Before E2(c) rewrites slot c % 2: chunk c - 2's dQ, which read it, retired in every consumer
  // thread. A thread's wgmma.wait_group covers only its own warp's slice, and each slice reads
  // the whole panel; every thread releases chunk c - 2's stage right after its dQ retired, so the
  // completed phase of that use of empty[] says all of them have (no later phase of that barrier
  // can complete before this thread's next release).
  auto wait_g_slot_read = [&](int c) {
    if (c >= 2) ring.wait_released(k0 + c - 2);
  };
  // E2(c): acc holds G1(c) (retired), a = scale_I acc (a copy: no instruction but a wgmma
  // defines accumulator registers while a batch is in flight). dI, G -> slot c % 2, dw; then
  // both tokens' G visible.
  auto epilogue2 = [&](int c) {
    warpgroup_fence_operand(acc);
    FragA a = make_fragment_like(acc);
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) a(i) = acc(i) * p.scale_I;
    float row[2], di[2];
    wg_row_scores<T>(a, s_w, row);
    CUTE_UNROLL
    for (int i = 0; i < 2; ++i) {
      const int r = 16 * warp + g + 8 * i;
      di[i] = mine(key_at(c, r))
                  ? dense_di(p.coeff, row[i], log_zi, chunk_la(k0 + c, r), log_za)
                  : 0.f;
    }
    wait_g_slot_read(c);
    int no_rs_operand = 0;
    g_epilogue<T, false>(a, di, s_w, p.scale_I, dw_acc, no_rs_operand,
                         smem_u32(g_slot(c)) + wg * P::kGPanelBytes, warp);
    fence_proxy_async_shared();
    Bar::sync();
  };

  // R(c): the dk reductions of chunk c (dK(c) retired), keys of either live range.
  auto reduce_chunk = [&](int c) {
    warpgroup_fence_operand(dk);
    reduce_dk_rows(dk, lane, warp, [&](int r) -> float* {
      const int64_t key = key_at(c, r);
      return either(key) ? p.dk_acc + key * 128 + 64 * wg : nullptr;
    });
  };

  clear(acc);
  clear(dk);
  warpgroup_fence_operand(acc);
  warpgroup_fence_operand(dk);
  wait_full(k0);
  gemm1_issue<T>(k_el(k0), q_el, acc, wtid);
  warpgroup_wait<0>();
  epilogue2(0);
  // Chunk c's body issues dK(c) and reads it, issues G1(c + 1) and reads it (E2(c + 1)): the
  // accumulators a body reads come from batches it issued (ptxas then keeps the batches in
  // flight: no C7514); only dQ(c), whose registers nothing but wgmma touches, crosses the loop's
  // back edge. Every chunk but the last; the wait counts are immediates.
#pragma unroll 1
  for (int c = 0; c + 1 < n_chunks; ++c) {
    pair_dk_issue<T>(mma2, thr2, g_slot(c), qw_el, dk);
    warpgroup_wait<1>();  // dQ(c - 1); dK(c) in flight
    warpgroup_fence_operand(dq);
    if (c > 0) release(k0 + c - 1);
    wait_full(k0 + c + 1);
    gemm1_issue<T>(k_el(k0 + c + 1), q_el, acc, wtid);
    dq_issue<T>(mma3, thr3, k_el(k0 + c), g_slot(c) + wg * (P::kGPanelBytes / 2), dq);
    warpgroup_wait<2>();  // dK(c); G1(c + 1), dQ(c) in flight
    reduce_chunk(c);
    warpgroup_wait<1>();  // G1(c + 1); dQ(c) in flight
    epilogue2(c + 1);
  }
  {
    const int c = n_chunks - 1;
    pair_dk_issue<T>(mma2, thr2, g_slot(c), qw_el, dk);
    warpgroup_wait<1>();  // dQ(c - 1); dK(c) in flight
    warpgroup_fence_operand(dq);
    if (c > 0) release(k0 + c - 1);
    dq_issue<T>(mma3, thr3, k_el(k0 + c), g_slot(c) + wg * (P::kGPanelBytes / 2), dq);
    warpgroup_wait<1>();  // dK(c); dQ(c) in flight
    reduce_chunk(c);
    warpgroup_wait<0>();
    warpgroup_fence_operand(dq);
    release(k0 + c);
  }

  // [f]
  if (live) store_dq<T>(dq, p, tok, s_w, warp);
  store_dw<kT, kHeads, 2, Bar>(dw_acc, s_dw, p, tok, live);
}

// Dense mode, two tokens per CTA, pipelined (tuning sm90_indexer_loss_kernel = 4).
template <class T>
__global__ void __launch_bounds__(PipeTraits<T>::kThreads, 1)
    loss_sm90_pipe_kernel(const __grid_constant__ LossParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = PipeTraits<T>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = align_smem_1024(smem_raw);
  const PipeSpan sp = pipe_span<T>(p);
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  if (sp.n_chunks == 0) {  // no key in either range: empty rows (CTA-uniform)
    if (wg > 0 && sp.t0 + wg - 1 < p.tok_end)
      portable::indexer::write_empty_row<T::kThreads, T::kHeads, 2>(p, sp.t0 + wg - 1);
    return;
  }
  if (threadIdx.x == 0)
    StageRing<L::kStages>(smem + L::kBarOff).init(L::kProducerThreads, L::kConsumerThreads);
  __syncthreads();
  if (wg == 0) {
    setmaxnreg_dec<L::kProducerRegs>();
    pipe_producer<T>(p, smem, sp);
  } else {
    setmaxnreg_inc<L::kConsumerRegs>();
    pipe_consumer<T>(p, smem, sp, wg - 1);
  }
#endif
}

// ---- Sparse mode: one token per CTA, pipelined ------------------------------------------------
// loss_sm90_sparse_pipe_kernel: loss_sm90_kernel's sparse contract, list and math ([a] .. [f],
// the same shared row functions, GEMM1, the RS dK of scale_I w G, dQ^T), with the k_I gathers on
// a producer warpgroup and the consumer warpgroup's GEMMs in flight while its epilogue and dk
// reductions run (the one-token kernel waits for every GEMM before the next step and takes a CTA
// barrier per chunk). Why, the arithmetic and the prediction: docs/indexer_decisions.md, "The
// pipelined sm90 loss kernel, sparse mode".
//
// 256 threads, two CTAs per SM (shared memory and the register pool: setmaxnreg 40 / 216).
//   Every thread: [a] the list (compact_slots: key and log A per position; no slot kept, this
//   kernel is not deterministic), [b] log Z_A, the empty row; then the roles split.
//   warpgroup 0, producer: ring index k, pass 1 chunk c is k = c, pass 2 chunk c is k = n_chunks +
//     c, into kStages stages of 64 k_I rows (gather_k_rows, 16-byte cp.async, keys from the list;
//     positions past |K_t| zero-filled); each thread's copies arrive on full[stage] when they land
//     (cp.async.mbarrier.arrive.noinc, 128 arrivals: no wait in the producer; the consumers fence
//     after their wait, as in the Hopper target kernel); it waits for empty[stage] (128 consumer
//     arrivals) before refilling (the dense kernel's publish-after-the-next-issue left the
//     consumer waiting at full[] with three stages: docs/indexer_decisions.md).
//   warpgroup 1, consumer (A = the RS A operand of dK, scale_I w G in bf16, rebuilt at each
//   body's start from G and dI (rs_a_from_g: the one-token kernel's values), so that no copy of it
//   is live across E2; G in shared memory in two slots by chunk parity, the B operand of dQ^T; |
//   = the warpgroup's named barrier; [x] = batches in flight while the code on the left runs):
//     q_I and w | pass 1 (chunk_loop, two accumulators): G1(c + 1) issued before E1(c) = I of
//     the chunk's positions -> the list; the stage released when G1(c) retired
//     | [d] sparse_row_loss: log Z_I, the loss, dI in place of I
//     pass 2: G1(0); wait; E2(0) |
//       body c (not the last): A(c); dK0(c); wait dQ(c - 1); release(c - 1)   [dK0(c)]
//                              G1(c + 1); wait dK0(c); R0(c)              [G1(c + 1)]
//                              dK1(c); dQ(c); wait G1(c + 1); E2(c + 1) | [dK1(c), dQ(c)]
//                              wait dK1(c); R1(c)                         [dQ(c)]
//       the last chunk: A; dK0; wait dQ(c - 1); release; wait; R0; dK1; dQ; wait; R1; wait;
//       release
//     | [f] dq_I, dw
//   E2(c) = dI of the chunk's positions, G -> slot c % 2, dw; fence.proxy.async; R0 / R1 = the
//   fp32 dk reductions of the chunk's columns [0, 64) / [64, 128) (reduce_dk_rows). Slot c % 2 is
//   rewritten by E2(c + 2) in body c + 1, once dQ(c) retired in all four warps (empty[]'s phase of
//   chunk c's stage); A(c + 1) is written after dK1(c) retired. Each body reads only accumulators of batches it issued; dQ(c)
//   alone crosses the loop's back edge (as in the pair kernel above: no C7514).
// Registers (H_I 64, consumer): dq^T 64, G1 accumulator 32 (two in pass 1), dk 32, A 16, dw 16,
// addresses and loop state.
// Shared memory (bytes from a 1024-aligned base; H_I 64, topk 2048, 3 stages): q_I 16,384, k_I
// ring 3 x 16,384, G 2 x 8,192, w / scratch (256 threads) / dw / counts / barriers ~2.4 KB, the
// list 12 bytes per position (topk rounded up to 256): 108,880 + 1,024 slack = 109,904: two CTAs
// per SM up to topk ~2,300, one beyond.
template <class T>
struct SparsePipeTraits {
  static constexpr int kStages = 3;
  static constexpr int kThreads = 256;
  static constexpr int kProducerThreads = 128;
  static constexpr int kConsumerThreads = 128;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 216;
  static_assert(kProducerThreads * kProducerRegs + kConsumerThreads * kConsumerRegs <=
                    setmaxnreg_pool(kThreads, 2),
                "register split exceeds the CTA's register pool at two CTAs per SM");
  static constexpr int kGSlotBytes = T::kChunk * T::kHeads * 2;
  static constexpr int kQOff = 0;                                  // q_I
  static constexpr int kKOff = kQOff + T::kQBytes;                 // k_I ring, [stage]
  static constexpr int kGOff = kKOff + kStages * T::kStageBytes;   // G, [slot]
  static constexpr int kWOff = kGOff + 2 * kGSlotBytes;            // w, H_I fp32
  static constexpr int kRedOff = kWOff + T::kHeads * 4;            // block_reduce, 256 fp32
  static constexpr int kDwOff = kRedOff + kThreads * 4;            // [warp][H_I] fp32
  static constexpr int kCountOff = kDwOff + T::kWarps * T::kHeads * 4;  // compact_slots, 8 int32
  static constexpr int kBarOff = kCountOff + kThreads / 32 * 4;   // full[kStages], empty[]
  static constexpr int kListOff = kBarOff + 2 * kStages * 8;      // key, log A, I / dI per position
  static_assert(kKOff % 1024 == 0 && kGOff % 1024 == 0 && kGSlotBytes % 1024 == 0,
                "swizzled tiles on 1024 bytes");
  static_assert(kBarOff % 8 == 0, "mbarriers aligned");
  static constexpr int list_slots(int topk) {
    return (topk + kThreads - 1) / kThreads * kThreads;
  }
  static constexpr int smem_bytes(int topk) { return kListOff + 12 * list_slots(topk) + 1024; }
};

// The consumer warpgroup's barrier (named barrier 1, 128 threads): the row functions' Bar.
struct SparseConsumerBarrier {
  __device__ __forceinline__ static void sync() {
    named_barrier_sync(static_cast<uint32_t>(PipeBarrier::kSparseConsumer), 128);
  }
};

template <class T>
__device__ __forceinline__ void sparse_pipe_producer(const LossParams& p, uint8_t* smem, int n,
                                                     int n_chunks) {
  using L = SparsePipeTraits<T>;
  constexpr int kStages = L::kStages;
  const int t = threadIdx.x;  // 0..127
  const uint32_t sk = smem_u32(smem + L::kKOff);
  const int32_t* const s_key = reinterpret_cast<const int32_t*>(smem + L::kListOff);
  const StageRing<kStages> ring(smem + L::kBarOff);
  const int total = (p.grads ? 2 : 1) * n_chunks;
#pragma unroll 1
  for (int k = 0; k < total; ++k) {
    const int stage = k % kStages;
    ring.acquire(k);
    gather_k_rows<T, L::kProducerThreads>(p, sk, k < n_chunks ? k : k - n_chunks, stage, n,
                                          [&](int pos) { return int64_t{s_key[pos]}; }, t);
    cp_async_mbarrier_arrive_noinc(ring.full_of(k));
  }
  cp_async_wait_all();  // no copy of this thread in flight when it leaves
}

template <class T>
__device__ __forceinline__ void sparse_pipe_consumer(const LossParams& p, uint8_t* smem,
                                                     int64_t tok, int n, int n_chunks,
                                                     float log_za) {
  using namespace cute;
  using Element = typename T::Element;
  using namespace portable::indexer;
  using L = SparsePipeTraits<T>;
  using Bar = SparseConsumerBarrier;
  constexpr int kT = T::kThreads;  // 128: the consumer warpgroup
  constexpr int kChunk = T::kChunk;
  constexpr int kHeads = T::kHeads;
  constexpr int kStages = L::kStages;
  const int wtid = threadIdx.x % kT;
  const int lane = wtid & 31, warp = wtid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int slots = L::list_slots(p.topk);
  const int32_t* const s_key = reinterpret_cast<const int32_t*>(smem + L::kListOff);
  const float* const s_la = reinterpret_cast<const float*>(s_key + slots);
  float* const s_val = const_cast<float*>(s_la) + slots;
  float* const s_w = reinterpret_cast<float*>(smem + L::kWOff);
  float* const s_red = reinterpret_cast<float*>(smem + L::kRedOff);
  float* const s_dw = reinterpret_cast<float*>(smem + L::kDwOff);
  const StageRing<kStages> ring(smem + L::kBarOff);
  const uint32_t sq = smem_u32(smem + L::kQOff);

  // [c] q_I and w, visible to the warpgroup's wgmma.
  load_q_and_w<T, kT>(p, tok, true, sq, s_w, wtid, wtid & 15);
  cp_async_commit();
  cp_async_wait_all();
  fence_proxy_async_shared();
  Bar::sync();

  Element* const q_el = reinterpret_cast<Element*>(smem + L::kQOff);
  auto k_el = [&](int k) {
    return fresh_ptr(reinterpret_cast<Element*>(smem + L::kKOff)) +
           (k % kStages) * (T::kStageBytes / 2);
  };
  auto wait_full = [&](int k) { ring.wait_full(k); };
  auto release = [&](int k) { ring.release(k); };

  typename T::Mma1 mma1;
  using FragA = decltype(partition_fragment_C(mma1, Shape<typename T::N64, typename T::HT>{}));

  // Pass 1 (ring indices 0 .. n_chunks - 1): I of every position -> the list.
  {
    FragA acc0 = partition_fragment_C(mma1, Shape<typename T::N64, typename T::HT>{});
    FragA acc1 = partition_fragment_C(mma1, Shape<typename T::N64, typename T::HT>{});
    clear(acc0);  // defined before the first batch (no phi copies of undefined values later)
    clear(acc1);
    warpgroup_fence_operand(acc0);
    warpgroup_fence_operand(acc1);
    auto issue = [&](auto, auto& acc, int c) {
      wait_full(c);
      gemm1_issue<T>(k_el(c), q_el, acc, wtid);
    };
    auto retire = [&](auto, auto& acc, int c) {
      warpgroup_wait<0>();  // only this chunk's batch is in flight here
      release(c);
      scale_acc(acc, p.scale_I);
    };
    auto epilogue = [&](auto, auto& acc, int c) {
      float row[2];
      wg_row_scores<T>(acc, s_w, row);
      CUTE_UNROLL
      for (int i = 0; i < 2; ++i) {
        const int pos = c * kChunk + 16 * warp + g + 8 * i;
        if (t4 == 0 && pos < n) s_val[pos] = row[i];
      }
    };
    indexer::chunk_loop(n_chunks, acc0, acc1, issue, retire, epilogue);
  }
  Bar::sync();  // every I in the list

  // [d] log Z_I, the row's loss, dI in place of I.
  const float row_loss =
      sparse_row_loss<kT, 2, Bar>(n, s_la, s_val, log_za, p.coeff, s_red);
  write_row_loss<kT, 2>(p, tok, row_loss);
  if (!p.grads) return;

  // [e] Pass 2 (ring indices n_chunks + c).
  typename T::Mma2 mma2;
  typename T::Mma3 mma3;
  auto thr2 = mma2.get_thread_slice(wtid);
  auto thr3 = mma3.get_thread_slice(wtid);
  Tensor dq = partition_fragment_C(mma3, Shape<typename T::D128, typename T::HT>{});
  clear(dq);
  float dw_acc[T::kNt][2];
  CUTE_UNROLL
  for (int nt = 0; nt < T::kNt; ++nt) dw_acc[nt][0] = dw_acc[nt][1] = 0.f;
  // The RS A operand of dK: scale_I w G in bf16, ((2, 2, 2), 1, H_I / 16).
  Tensor tAg = make_tensor<Element>(
      partition_shape_A(mma2, Shape<typename T::N64, typename T::HT>{}));
  FragA acc = partition_fragment_C(mma1, Shape<typename T::N64, typename T::HT>{});
  Tensor dk = partition_fragment_C(mma2, Shape<typename T::N64, typename T::D64>{});
  const int k0 = n_chunks;
  auto g_slot = [&](int c) {
    return fresh_ptr(reinterpret_cast<Element*>(smem + L::kGOff)) +
           (c & 1) * (L::kGSlotBytes / 2);
  };

  // dI of this thread's two positions of chunk c (0 past |K_t|).
  auto chunk_di = [&](int c, float (&di)[2]) {
    CUTE_UNROLL
    for (int i = 0; i < 2; ++i) {
      const int pos = c * kChunk + 16 * warp + g + 8 * i;
      di[i] = pos < n ? s_val[pos] : 0.f;
    }
  };
  // Before E2(c) rewrites slot c % 2: chunk c - 2's dQ, its last reader, retired in all four
  // warps (a warp's wgmma.wait_group covers its own slice only, and each slice reads the whole
  // slot): the completed phase of empty[] for chunk c - 2's stage, which every consumer thread
  // releases right after its dQ retired, as in the pair kernel above.
  auto wait_g_slot_read = [&](int c) {
    if (c >= 2) ring.wait_released(k0 + c - 2);
  };
  // E2(c): acc holds G1(c) (retired): a = scale_I acc (a copy), G -> slot c % 2, dw; then G
  // visible to the wgmma.
  auto epilogue2 = [&](int c) {
    warpgroup_fence_operand(acc);
    FragA a = make_fragment_like(acc);
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) a(i) = acc(i) * p.scale_I;
    float di[2];
    chunk_di(c, di);
    wait_g_slot_read(c);
    int no_rs_operand = 0;
    g_epilogue<T, false>(a, di, s_w, p.scale_I, dw_acc, no_rs_operand, smem_u32(g_slot(c)),
                         warp);
    fence_proxy_async_shared();
    Bar::sync();
  };
  // A(c) from slot c % 2 (dK(c - 1), its last reader, retired).
  auto build_a = [&](int c) {
    float di[2];
    chunk_di(c, di);
    warpgroup_fence_operand(tAg);
    auto ag32 = recast<uint32_t>(tAg);
    rs_a_from_g<T>(di, s_w, p.scale_I, ag32, smem_u32(g_slot(c)), warp);
    warpgroup_fence_operand(tAg);
  };
  // R(c, half): dK(c)'s columns [64 half, +64) retired in dk -> the dk accumulator rows.
  auto reduce_half = [&](int c, int half) {
    warpgroup_fence_operand(dk);
    reduce_dk_rows(dk, lane, warp, [&](int r) -> float* {
      const int pos = c * kChunk + r;
      return pos < n ? p.dk_acc + int64_t{s_key[pos]} * 128 + 64 * half : nullptr;
    });
  };
  // Body c (c + 1 < n_chunks): G(c) in slot c % 2 and visible; dQ(c - 1) may be in flight. The
  // wait counts are immediates.
  auto body = [&](int c) {
    build_a(c);
    dk_rs_issue<T>(mma2, thr2, q_el, 0, tAg, dk);
    warpgroup_wait<1>();  // dQ(c - 1); dK0(c) in flight
    warpgroup_fence_operand(dq);
    if (c > 0) release(k0 + c - 1);
    wait_full(k0 + c + 1);
    gemm1_issue<T>(k_el(k0 + c + 1), q_el, acc, wtid);
    warpgroup_wait<1>();  // dK0(c); G1(c + 1) in flight
    reduce_half(c, 0);
    dk_rs_issue<T>(mma2, thr2, q_el, 1, tAg, dk);
    dq_issue<T>(mma3, thr3, k_el(k0 + c), g_slot(c), dq);
    warpgroup_wait<2>();  // G1(c + 1); dK1(c), dQ(c) in flight
    epilogue2(c + 1);
    warpgroup_wait<1>();  // dK1(c); dQ(c) in flight
    reduce_half(c, 1);
  };
  auto last = [&](int c) {
    build_a(c);
    dk_rs_issue<T>(mma2, thr2, q_el, 0, tAg, dk);
    warpgroup_wait<1>();  // dQ(c - 1); dK0(c) in flight
    warpgroup_fence_operand(dq);
    if (c > 0) release(k0 + c - 1);
    warpgroup_wait<0>();
    reduce_half(c, 0);
    dk_rs_issue<T>(mma2, thr2, q_el, 1, tAg, dk);
    dq_issue<T>(mma3, thr3, k_el(k0 + c), g_slot(c), dq);
    warpgroup_wait<1>();  // dK1(c); dQ(c) in flight
    reduce_half(c, 1);
    warpgroup_wait<0>();
    warpgroup_fence_operand(dq);
    release(k0 + c);
  };

  clear(acc);
  clear(dk);
  warpgroup_fence_operand(acc);
  warpgroup_fence_operand(dk);
  wait_full(k0);
  gemm1_issue<T>(k_el(k0), q_el, acc, wtid);
  warpgroup_wait<0>();
  epilogue2(0);
#pragma unroll 1
  for (int c = 0; c + 1 < n_chunks; ++c) body(c);
  last(n_chunks - 1);

  // [f]
  store_dq<T>(dq, p, tok, s_w, warp);
  store_dw<kT, kHeads, 2, Bar>(dw_acc, s_dw, p, tok);
}

// Sparse mode, one token per CTA, pipelined (tuning sm90_indexer_loss_kernel = 4, the default).
template <class T>
__global__ void __launch_bounds__(SparsePipeTraits<T>::kThreads, 2)
    loss_sm90_sparse_pipe_kernel(const __grid_constant__ LossParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = SparsePipeTraits<T>;
  using namespace portable::indexer;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = align_smem_1024(smem_raw);  // the list's accesses stay LDS / STS
  const int64_t tok = p.tok_begin + blockIdx.x;  // token order (indexer_decisions.md, session 46)
  const int slots = L::list_slots(p.topk);
  int32_t* const s_key = reinterpret_cast<int32_t*>(smem + L::kListOff);
  float* const s_la = reinterpret_cast<float*>(s_key + slots);
  float* const s_red = reinterpret_cast<float*>(smem + L::kRedOff);
  int* const s_count = reinterpret_cast<int*>(smem + L::kCountOff);

  // [a] K_t in slot order, [b] log Z_A; an empty row (CTA-uniform).
  const int n = compact_slots<L::kThreads>(p, tok, s_key, nullptr, s_la, s_count, [](int) {});
  const float log_za = row_log_z_a<L::kThreads>(n, [&](int i) { return s_la[i]; }, s_red);
  if (n == 0 || log_za == -INFINITY) {
    write_empty_row<L::kThreads, T::kHeads>(p, tok);
    return;
  }
  const int n_chunks = (n + T::kChunk - 1) / T::kChunk;
  if (threadIdx.x == 0)
    StageRing<L::kStages>(smem + L::kBarOff).init(L::kProducerThreads, L::kConsumerThreads);
  __syncthreads();
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  if (wg == 0) {
    setmaxnreg_dec<L::kProducerRegs>();
    sparse_pipe_producer<T>(p, smem, n, n_chunks);
  } else {
    setmaxnreg_inc<L::kConsumerRegs>();
    sparse_pipe_consumer<T>(p, smem, tok, n, n_chunks, log_za);
  }
#endif
}

}  // namespace sa::sm90::loss
