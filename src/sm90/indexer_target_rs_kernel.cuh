// The Hopper attention target with Q in registers (RS wgmma), the default since it measured 1.07x
// indexer_target_kernel.cuh's loss on an H100 (session 35; internal tuning
// Tuning::sm90_indexer_target = 3, bench `tune.sm90_indexer_target=3`, runs that one): the same
// contract, work split (a token and a pair of 64-head
// groups per CTA) and epilogue (reduce_store_chunk); what differs is where Q lives, and the chunk
// loop, unrolled by the six stages (chunk_loop_staged) so each issue site's stage is a constant.
//
// The default kernel keeps both groups' Q in shared memory (147 KB) for the SS wgmma, which leaves
// room for two kv stages of 32 keys: one stage computing, at most one refilling, so the gather's
// L2 latency is hidden only as far as one stage's compute covers it, and each m64n32k16 reads 2 KB
// of A and 1 KB of B from shared memory. Here each consumer thread holds its warpgroup's Q
// fragment (64 heads x D_qk: 144 registers at D_qk 576, the RS A layout, loaded once by ldmatrix),
// so Q's shared memory is needed only until then: it is staged in the first four of SIX kv stages
// of 32 keys (Q of group w in stages 2w, 2w + 1: 73,728 bytes each), which the consumers release
// once Q is in registers. Up to five fills are in flight behind the stage being computed, and a
// wgmma reads only B (1 KB) from shared memory.
//
// Stages: chunk c (32 keys) in stage (c + 4) % 6, its use u = (c + 4) / 6 of that stage (stages
// 0..3 have Q as their use 0). full[stage] counts the chunk fills (Q lands on q_full), so chunk
// c's full phase is u - (stage < 4); empty[stage] counts every release (Q's included), so the
// producer waits for phase u - 1 before filling chunk c.
//
// Registers: setmaxnreg, producer 40, consumers 232 (Q 144 + two S fragments 32 + the rest).
// Shared memory as the default kernel's: 6 x 36,864 + partials 2,048 + 13 mbarriers = 223,336,
// 224,256 aligned, + 1,024 slack = 225,280 bytes.
#pragma once

#include <cstdint>

#include "sm90/indexer_target_kernel.cuh"

namespace sa::sm90::indexer {

template <int kDqk_>
struct TargetRsTraits {
  using Element = cutlass::bfloat16_t;
  static constexpr int kDqk = kDqk_;  // 512 or 576
  static constexpr bool kRope = kDqk == 576;
  static constexpr int kKBlocks = kDqk / 16;  // k-blocks of Q K^T: 32 or 36
  static constexpr int kGroups = 2;
  static constexpr int kHeads = 64;
  static constexpr int kBlockN = 32;
  static constexpr int kStages = 6;
  static constexpr int kQStages = 4;  // stages that hold Q at the start (2 per group)
  static constexpr int kThreads = 384;
  static constexpr int kProducerThreads = 128;
  static constexpr int kConsumerThreads = 128;  // per warpgroup
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static constexpr int kStageElems = kBlockN * 576;     // nope 32 x 512, then rope 32 x 64
  static constexpr int kStageBytes = kStageElems * 2;   // 36,864
  static constexpr int kNopeBytes = kBlockN * 512 * 2;  // 32,768: the rope panel's offset
  static constexpr int kQGroupBytes = kHeads * 576 * 2;  // 73,728: 8 nope panels, then rope
  static constexpr int kQRopeOffset = kHeads * 512 * 2;  // 65,536
  static_assert(kQGroupBytes == 2 * kStageBytes, "a group's Q fills two stages");
  static_assert(kGroups * kQGroupBytes == kQStages * kStageBytes, "Q staging = 4 stages");
  static_assert(kProducerThreads * kProducerRegs + 2 * kConsumerThreads * kConsumerRegs <=
                    setmaxnreg_pool(kThreads, 1),
                "register split exceeds the CTA's register pool");
  using H64 = cute::Int<kHeads>;
  using N32 = cute::Int<kBlockN>;
  using D512 = cute::Int<512>;
  using D64 = cute::Int<64>;
  using DQK = cute::Int<kDqk>;
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::MMA_64x32x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K,
                                                    cute::SM90::GMMA::Major::K>{}));
  using SmemLayoutKNope = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<N32, D512>{}));
  using SmemLayoutKRope = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<N32, D64>{}));
};

template <class T>
struct alignas(1024) TargetRsStorage {
  using Element = typename T::Element;
  Element kv[T::kStages][T::kStageElems];     // stage: 8 nope panels of 32 rows, the rope panel
  float part[T::kGroups][2][4][T::kBlockN];  // as TargetStorage::part
  uint64_t q_full;                            // producer's Q copies (128, noinc)
  uint64_t full[T::kStages];                  // producer's kv copies of a chunk (128, noinc)
  uint64_t empty[T::kStages];                 // every thread of the present consumers
};

template <class T>
constexpr size_t target_rs_smem_bytes() {
  return sizeof(TargetRsStorage<T>) + 1024;
}

// ---- producer (warpgroup 0) ---------------------------------------------------------------------
template <class T, bool kDense>
__device__ __forceinline__ void target_rs_producer(const TargetParams& p, TargetRsStorage<T>& s,
                                                   const TargetItem& it, int n_chunks) {
  const int t = threadIdx.x;  // 0..127
  const int warp = t / 32, lane = t % 32;
  const uint32_t base = smem_u32(&s.kv[0][0]);
  // Q of the present groups into stages 0..3 (64-row panels; rows past H zero-filled).
  const DsaElement* const q_tok = reinterpret_cast<const DsaElement*>(p.q) + it.tok * p.q_ss;
#pragma unroll
  for (int w = 0; w < T::kGroups; ++w) {
    const int g = T::kGroups * it.pair + w;
    if (g < p.head_groups) {
      const int h0 = g * T::kHeads;
      const uint32_t q = base + w * T::kQGroupBytes;
      gather_head_rows<T::kRope, true, T::kHeads>(q, q + T::kQRopeOffset, q_tok, p.q_sh, h0, warp,
                                                  lane, p.H - h0);
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
  // Chunk c's indices sit in set c % 2, loaded right after the set's previous chunk (c - 2) was
  // copied: a fill waits only for a load issued a whole fill earlier, so the indices' L2 latency
  // is off the fill's path (docs/research/indexer_target_profile_s43.md, p2).
  int32_t j0[2], j1[2];
  load_indices(0, j0);
  load_indices(1, j1);
  int stage = T::kQStages;  // (c + 4) % 6
  uint32_t use = 0;         // (c + 4) / 6
  auto fill = [&](int c, int32_t(&j)[2]) {
    // The stage's previous use (Q, or chunk c - 6) released it (use 0 passes at once).
    mbarrier_wait(&s.empty[stage], (use & 1) ^ 1);
    const uint32_t nope = base + stage * T::kStageBytes;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const bool active = j[k] >= 0 && j[k] < p.skv;
      gather_row<T::kRope, T::kBlockN>(nope, nope + T::kNopeBytes, t / 8 + 16 * k,
                                       kv + (active ? j[k] * p.kv_ss : int64_t{0}),
                                       active ? 16 : 0, lane);
    }
    cp_async_mbarrier_arrive_noinc(&s.full[stage]);
    if (++stage == T::kStages) {
      stage = 0;
      ++use;
    }
    load_indices(c + 2, j);  // slots past n_slots: -1 without a load
  };
#pragma unroll 1
  for (int c = 0; c < n_chunks; c += 2) {
    fill(c, j0);
    if (c + 1 < n_chunks) fill(c + 1, j1);
  }
}

// ---- consumers (warpgroups 1, 2) ----------------------------------------------------------------
template <class T, bool kDense>
__device__ __forceinline__ void target_rs_consumer(const TargetParams& p, TargetRsStorage<T>& s,
                                                   const TargetItem& it, int n_chunks, int w) {
  using namespace cute;
  using Element = typename T::Element;
  const int g = T::kGroups * it.pair + w;
  if (g >= p.head_groups) return;  // warpgroup-uniform; empty[] does not count this warpgroup
  const int wtid = threadIdx.x % 128;
  const int lane = threadIdx.x % 32;
  const int warp = wtid / 32;
  const int h0 = g * T::kHeads;
  const uint32_t bar_id = 1 + static_cast<uint32_t>(w);

  typename T::TiledMma mma;
  auto thr = mma.get_thread_slice(wtid);
  Tensor tS0 = partition_fragment_C(mma, Shape<typename T::H64, typename T::N32>{});
  Tensor tS1 = partition_fragment_C(mma, Shape<typename T::H64, typename T::N32>{});
  static_assert(decltype(size(tS0))::value == 16, "S fragment: 64 x 32 per warpgroup");
  // Q of the group as the RS A operand: ((2, 2, 2), 1, k-blocks) bf16; per k-block 4 words, word
  // j = (row + 8 (j % 2), columns 8 (j / 2) + 2 (lane % 4) .. + 1) of the warp's 16 rows.
  Tensor tQ =
      make_tensor<Element>(partition_shape_A(mma, Shape<typename T::H64, typename T::DQK>{}));
  static_assert(decltype(size(tQ))::value == 8 * T::kKBlocks, "Q fragment: 64 x D_qk");

  float off2[2];
  load_target_offset2(p, it.tok, h0, warp, lane, off2);
  const float scale_log2 = p.scale_log2;
  float* const out = p.log_a + int64_t{g} * p.la_gs + (it.tok - p.tok_begin) * p.la_ts;

  // Q -> registers: ldmatrix.x4 per k-block, lane l addressing row 8 ((l / 8) % 2) + l % 8 of the
  // warp's 16 and 16-byte chunk l / 16 of the k-block (matrix l / 8 = word l / 8 above).
  mbarrier_wait(&s.q_full, 0);
  {
    auto q32 = recast<uint32_t>(tQ);
    const uint32_t q_base = smem_u32(&s.kv[0][0]) + w * T::kQGroupBytes;
    const int row = 16 * warp + 8 * ((lane / 8) % 2) + lane % 8;
    const int hi = lane / 16;
    CUTE_UNROLL
    for (int kb = 0; kb < T::kKBlocks; ++kb) {
      const uint32_t addr = kb < 32 ? q_base + (kb / 4) * 8192 + swz(row, 2 * (kb % 4) + hi)
                                    : q_base + T::kQRopeOffset + swz(row, 2 * (kb - 32) + hi);
      uint32_t r[4];
      portable::dsa::ldmatrix_x4(addr, r);
      CUTE_UNROLL
      for (int jw = 0; jw < 4; ++jw) q32(4 * kb + jw) = r[jw];
    }
  }
  // Q's stages go back to the producer (every thread of a present group, after its loads).
  CUTE_UNROLL
  for (int st = 0; st < T::kQStages; ++st) mbarrier_arrive(&s.empty[st]);

  // Chunk c sits in stage (c + kQStages) % kStages, known at compile time at each issue site
  // (chunk_loop_staged): the B descriptors are constants plus the shared base, not rebuilt per
  // wgmma from a run-time stage (docs/research/indexer_target_profile_s43.md).
  auto issue = [&](auto stage_tag, auto& tS, int c) {
    constexpr int kStage = decltype(stage_tag)::value;
    const uint32_t use = static_cast<uint32_t>((c + T::kQStages) / T::kStages);
    mbarrier_wait(&s.full[kStage], (use - (kStage < T::kQStages ? 1u : 0u)) & 1u);
    fence_proxy_async_shared();
    Element* const k_stage = &s.kv[kStage][0];
    Tensor tKn = thr.partition_fragment_B(
        make_tensor(make_smem_ptr(k_stage), typename T::SmemLayoutKNope{}));  // (MMA, 1, 32)
    Tensor tKr = thr.partition_fragment_B(make_tensor(
        make_smem_ptr(k_stage + T::kNopeBytes / 2), typename T::SmemLayoutKRope{}));  // (MMA,1,4)
    warpgroup_fence_operand(tS);
    warpgroup_fence_operand(tQ);
    warpgroup_arrive();
    mma.accumulate_ = SM90::GMMA::ScaleOut::Zero;
    CUTE_UNROLL
    for (int kb = 0; kb < 32; ++kb) {
      cute::gemm(mma, tQ(_, _, kb), tKn(_, _, kb), tS);
      mma.accumulate_ = SM90::GMMA::ScaleOut::One;
    }
    if constexpr (T::kRope) {
      CUTE_UNROLL
      for (int kb = 0; kb < 4; ++kb) cute::gemm(mma, tQ(_, _, 32 + kb), tKr(_, _, kb), tS);
    }
    warpgroup_commit_batch();
  };
  auto retire = [&](auto stage_tag, auto& tS, int) {
    warpgroup_wait<0>();
    warpgroup_fence_operand(tS);
    mbarrier_arrive(&s.empty[decltype(stage_tag)::value]);
  };
  auto epilogue = [&](auto parity_tag, auto& tS, int c) {
    constexpr int kParity = decltype(parity_tag)::value;
    reduce_store_chunk<T::kBlockN>(tS, s.part[w][kParity][0], off2, scale_log2, bar_id, warp,
                                   lane, out, c * T::kBlockN, it.n_slots);
  };
  chunk_loop_staged<T::kStages, T::kQStages>(n_chunks, tS0, tS1, issue, retire, epilogue);
}

// ---- kernel -------------------------------------------------------------------------------------
template <class T, bool kDense>
__global__ void __launch_bounds__(T::kThreads, 1)
    target_rs_sm90_kernel(const __grid_constant__ TargetParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  TargetRsStorage<T>& s = aligned_shared_storage<TargetRsStorage<T>>(smem_raw);
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
    setmaxnreg_dec<T::kProducerRegs>();
    target_rs_producer<T, kDense>(p, s, it, n_chunks);
  } else {
    setmaxnreg_inc<T::kConsumerRegs>();
    target_rs_consumer<T, kDense>(p, s, it, n_chunks, wg - 1);
  }
#endif
}

}  // namespace sa::sm90::indexer
