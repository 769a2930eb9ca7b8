// The Hopper (sm_90a) indexer score kernel (SPEC 5): scores[t, s] = I[t, s] in range, -inf
// outside, every element of [S_q, S_kv] written, with
//
//   I[t, s] = sum_j w[t, j] * relu(scale_I * <q_I[t, j], k_I[s]>).
//
// Device code only; indexer_scores.cu checks the problem, builds the TMA descriptors and
// instantiates it. Design and its numbers: docs/indexer_decisions.md ("The sm90 score kernel").
//
// The GEMM is keys x (token, head) columns: S^T[key, col] = <k_I[key], q_I[col]>, one wgmma
// m64n256k16 per k16 step (A = a 64-key tile, B = 256 (token, head) rows of q_I, both K-major in
// shared memory). Keys are the M side so that the weighted ReLU sum over a token's heads is a sum
// over the columns a thread holds (the wgmma accumulator gives lane (g, t4) of warp w the rows
// 16 w + g (+ 8) and the columns 8 j + 2 t4 (+ 1)), then a reduce-scatter over the quad; no
// exchange across warps. This is the portable score tile's association (indexer_score_tile.cuh):
// per (key, token) a lane sums its columns n-tile by n-tile, column 0 then 1, and the quad adds
// (p0 + p2) + (p1 + p3); so every score is computed the same way whatever its position in the
// tile (equal keys give equal bits).
//
// Work split. A CTA owns kTokensPerCta consecutive query tokens (2 consumer warpgroups x
// kTokensPerWg = 256 / H_I tokens: H_I 64 -> 4 + 4, 32 -> 8 + 8, 16 -> 16 + 16) and one key chunk
// of kChunkKeys keys. The grid is (query block, key chunk), the key chunks of one query block
// adjacent (their q_I block stays in L2), query blocks from the last (the longest causal rows)
// to the first.
//
// Roles (warpgroups, 384 threads, one CTA per SM):
//   kProducer  warpgroup 0, setmaxnreg down to kProducerRegs; one thread issues the TMA loads:
//              q_I once (2 panels x kTokensPerCta boxes of H_I rows), then the key tiles of the
//              chunk that meet the union of the CTA's ranges, into a kStages ring.
//   kConsumer0, kConsumer1  warpgroups 1 and 2, setmaxnreg up to kConsumerRegs; each multiplies
//              every key tile by its own 256 columns (8 wgmma m64n256k16), releases the stage,
//              then reduces and stores its tokens' 64 scores per token.
//
// Timeline (one CTA, tiles i0 i1 ...; at H_I 64 / 32 the consumers take turns to issue
// (IssueTurn), so one's GEMM runs on the tensor core while the other reduces and stores):
//   producer |Q|K0|K1|K2|K3|      K4      |      K5      | ...   (a load waits for a free stage)
//   WG0      |    |GEMM0|epi0   |GEMM1|epi1   |GEMM2| ...
//   WG1      |    |     |GEMM0|epi0   |GEMM1|epi1   | ...
//
// Pipeline objects (shared memory):
//   q_full      mbarrier, TMA -> consumers: the CTA's q_I rows landed (one phase)
//   k_full[s]   mbarrier, TMA -> consumers: stage s holds its key tile
//   k_empty[s]  mbarrier, one arrive per consumer warp after its wgmma wait -> producer
//
// Shared memory (bytes): q_I 2 x 256 rows x 256 (131,072; per warpgroup two 64-column panels of
// 128-byte rows, 128-byte swizzle: where TMA boxes (64, H_I) put them), keys kStages x 64 x 256
// (65,536), w' = |scale_I| w per column 2 x 256 fp32 (2,048), ranges, mbarriers: 199,680 with
// the 1,024-byte rounding, + 1,024 slack to align the base = 200,704 (one CTA per SM).
//
// Registers (ptxas, CUDA 13, -v, all three instantiations): 168 per thread at launch (384
// threads, one CTA per SM), producer setmaxnreg 40, consumers 232; no stack frame, no spill. The
// accumulator is 128 fp32 per consumer thread (64 x 256 over 128 threads).
//
// Numerics: relu(scale_I a) = |scale_I| relu(+-a): the sign is applied to the accumulator, the
// magnitude is folded into w'. Keys past S_kv are zero rows (TMA zero fill) and never stored;
// tokens past S_q are zero rows and never stored.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only)

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "common/indexer_problem.hpp"
#include "sm90/hopper_primitives.cuh"

namespace sa::sm90::indexer {

// Kernel arguments; TMA descriptors first (64-byte aligned).
struct ScoresParams {
  CUtensorMap tma_q;  // q_I [S_q, H_I, 128] as dims (128, H_I, S_q, 1), box (64, H_I, 1, 1), SW128
  CUtensorMap tma_k;  // k_I [S_kv, 128] as dims (128, S_kv, 1, 1), box (64, 64, 1, 1), SW128
  const float* w;     // [S_q, H_I]: (t, j) at t * w_ss + j * w_sh
  int64_t w_ss, w_sh;
  float* out;         // [S_q, S_kv]: (t, s) at t * out_ss + s
  int64_t out_ss;
  IndexerDims dims;
  IndexerMeta meta;   // k_start, k_end
  float scale;        // scale_I
  int32_t q_blocks;   // ceil(S_q / kTokensPerCta)
  int32_t key_chunks; // ceil(S_kv / kChunkKeys)
  bool in_range_only; // elements outside a row's range are left unwritten (no -inf stores)
};

template <int kHeads_>
struct ScoresTraits {
  using Element = cutlass::bfloat16_t;
  static constexpr int kHeads = kHeads_;                 // H_I
  static constexpr int kCols = 256;                      // (token, head) columns per consumer
  static constexpr int kTokensPerWg = kCols / kHeads;    // 4, 8, 16
  static constexpr int kConsumers = 2;
  static constexpr int kTokensPerCta = kConsumers * kTokensPerWg;
  static constexpr int kTileKeys = 64;                   // wgmma M
  static constexpr int kDim = 128;                       // D_I
  static constexpr int kStages = 4;
  static constexpr int kChunkTiles = 32;
  static constexpr int kChunkKeys = kChunkTiles * kTileKeys;  // 2048 keys per CTA
  static constexpr int kThreads = 384;
  static constexpr int kConsumerWarps = 8;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static constexpr int kNtPerToken = kHeads / 8;         // 8-column wgmma tiles per token
  static constexpr uint32_t kQBytes = kTokensPerCta * kHeads * kDim * 2;  // 131,072
  static constexpr uint32_t kKBytes = kTileKeys * kDim * 2;               // 16,384
  // The consumers take turns to issue (IssueTurn) at H_I 64 and 32: +4.8-6.0% there, -1.7 to
  // -2.4% at H_I 16 (H100, session 35), whose 16 tokens per warpgroup make the epilogue longer.
  static constexpr bool kTurns = kHeads >= 32;
  static_assert(kHeads == 16 || kHeads == 32 || kHeads == 64, "H_I 16, 32 or 64");
  static_assert(kTokensPerWg % 4 == 0, "the reduce-scatter takes tokens four at a time");
  static_assert(kProducerRegs * 128 + kConsumerRegs * 256 <= setmaxnreg_pool(kThreads, 1),
                "register split exceeds the CTA's register pool");

  using KT = cute::Int<kTileKeys>;
  using NT = cute::Int<kCols>;
  using DT = cute::Int<kDim>;
  // S^T = K Q^T: M = keys, N = (token, head) columns, K = D_I; both operands K-major.
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K,
                                                      cute::SM90::GMMA::Major::K>{}));
  // 64-column panels of 128-byte rows, 128-byte swizzle (panel-major: panel p at p x rows x 64).
  using SmemLayoutK = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<KT, DT>{}));
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<NT, DT>{}));

  // Invariants the producer and the epilogue hard-code, checked against CuTe's layouts (swizzle
  // aside: TMA's 128-byte swizzle and the atom's are the same function of the 1024-aligned
  // address).
  // (a) Shared tiles: (row, col) at panel (col / 64) x rows x 64 + row x 64 + col % 64 elements,
  //     where the producer's boxes land (row = key, or token x H_I + head).
  static_assert(SmemLayoutK{}.layout_b()(1, 0) == 64 && SmemLayoutK{}.layout_b()(0, 1) == 1 &&
                    SmemLayoutK{}.layout_b()(0, 64) == kTileKeys * 64,
                "key tile: 64-column panels of kTileKeys 128-byte rows");
  static_assert(SmemLayoutQ{}.layout_b()(1, 0) == 64 && SmemLayoutQ{}.layout_b()(0, 1) == 1 &&
                    SmemLayoutQ{}.layout_b()(0, 64) == kCols * 64,
                "q_I tile: 64-column panels of kCols 128-byte rows");
  // (b) Accumulator: thread 4 g + t4 + 32 w, value v0 + 2 v1 + 4 j holds S^T[16 w + g + 8 v1,
  //     8 j + 2 t4 + v0] (offsets row + 64 col), which consumer_main's acc(4 j + 2 r + c) reads.
  using LayoutCTV = decltype(TiledMma{}.get_layoutC_TV());
  static_assert(LayoutCTV{}(1, 0) == 2 * 64 && LayoutCTV{}(4, 0) == 1 && LayoutCTV{}(32, 0) == 16,
                "accumulator threads: t4 -> column 2 t4, g -> row g, warp -> row 16 w");
  static_assert(LayoutCTV{}(0, 1) == 64 && LayoutCTV{}(0, 2) == 8 && LayoutCTV{}(0, 4) == 8 * 64,
                "accumulator values: v0 -> column + 1, v1 -> row + 8, j -> column + 8 j");
  using LayoutAcc =
      decltype(cute::partition_fragment_C(TiledMma{}, cute::Shape<KT, NT>{}).layout());
  static_assert(LayoutAcc{}(1) == 1 && LayoutAcc{}(2) == 2 && LayoutAcc{}(4) == 4 &&
                    LayoutAcc{}(127) == 127,
                "acc(i) is value i of the thread (v0 fastest, then v1, then j)");
  // (c) Transaction bytes: each mbarrier phase expects exactly the bytes of the boxes issued on
  //     it (a box counts whole, zero-filled past S_q / S_kv), within the tx-count range (2^20).
  static_assert(kKBytes == 2 * 64 * kTileKeys * sizeof(Element), "a key stage: two boxes");
  static_assert(kQBytes == kTokensPerCta * 2 * 64 * kHeads * sizeof(Element),
                "q_I: two boxes per token");
  static_assert(kQBytes < (1u << 20), "mbarrier tx-count limit");
  // (d) k_empty completes a phase when every consumer warp has waited for its wgmma of the stage.
  static_assert(kConsumerWarps == kConsumers * 4, "one k_empty arrival per consumer warp");
};

template <class T>
struct alignas(1024) ScoresSmem {
  using Element = typename T::Element;
  Element q[T::kConsumers][T::kCols * T::kDim];
  Element k[T::kStages][T::kTileKeys * T::kDim];
  float w[T::kConsumers][T::kCols];  // w' = |scale_I| w[t, j]; 0 past S_q
  int2 range[T::kTokensPerCta];      // clamped [begin, end); empty: (0, 0); past S_q: empty
  uint64_t q_full;
  uint64_t k_full[T::kStages];
  uint64_t k_empty[T::kStages];
};

enum class Role : int { kProducer = 0, kConsumer0 = 1, kConsumer1 = 2 };

// The CTA's work: tokens [t0, t0 + kTokensPerCta), chunk keys [k0, k0 + n_tiles x 64) of which
// tiles [i_lo, i_hi) meet the union of the tokens' ranges (read from shared memory).
struct CtaWork {
  int64_t t0;
  int64_t k0;
  int n_tiles, i_lo, i_hi;
};

template <class T>
__device__ __forceinline__ CtaWork cta_work(const ScoresParams& p, const ScoresSmem<T>& s) {
  CtaWork c;
  const int qb = p.q_blocks - 1 - static_cast<int>(blockIdx.x / p.key_chunks);
  const int kc = static_cast<int>(blockIdx.x % p.key_chunks);
  c.t0 = int64_t{qb} * T::kTokensPerCta;
  c.k0 = int64_t{kc} * T::kChunkKeys;
  const int64_t skv = p.dims.Skv;
  c.n_tiles = static_cast<int>(
      min(int64_t{T::kChunkTiles}, (skv - c.k0 + T::kTileKeys - 1) / T::kTileKeys));
  int lo = INT32_MAX, hi = 0;
  for (int i = 0; i < T::kTokensPerCta; ++i) {
    const int2 r = s.range[i];
    if (r.y > r.x) {
      lo = min(lo, r.x);
      hi = max(hi, r.y);
    }
  }
  c.i_lo = c.i_hi = c.n_tiles;
  if (lo < hi && hi > c.k0 && lo < c.k0 + int64_t{c.n_tiles} * T::kTileKeys) {
    c.i_lo = static_cast<int>(max(int64_t{0}, (lo - c.k0) / T::kTileKeys));
    c.i_hi = static_cast<int>(min(int64_t{c.n_tiles}, (hi - 1 - c.k0) / T::kTileKeys + 1));
  }
  return c;
}

// ---- producer (one thread) ------------------------------------------------------------------
// Pieces the top-k kernel's producer shares (sm90/indexer_topk_kernel.cuh).
// [1] q_I of tokens [t0, t0 + kTokensPerCta): per token, two boxes (64 columns x H_I heads), H_I
// rows into each panel of its warpgroup's tile. Tokens past S_q are zero-filled (the bytes still
// count). The caller owns q_full's phase and the q_I tile being free.
template <class T>
__device__ __forceinline__ void producer_load_q(const ScoresParams& p, ScoresSmem<T>& s,
                                                int64_t t0) {
  mbarrier_arrive_expect_tx(&s.q_full, T::kQBytes);
  for (int i = 0; i < T::kTokensPerCta; ++i) {
    const int wg = i / T::kTokensPerWg, row = (i % T::kTokensPerWg) * T::kHeads;
    const int32_t t = static_cast<int32_t>(t0 + i);
#pragma unroll
    for (int pnl = 0; pnl < 2; ++pnl)
      tma_load_4d(&p.tma_q, &s.q[wg][pnl * T::kCols * 64 + row * 64], &s.q_full, pnl * 64, 0, t,
                  0);
  }
}

// [2] The CTA's n-th key tile (keys s0 .. s0 + 63, zero rows past S_kv) into the ring. Invariant:
// producer and consumers count the same tiles from n = 0; tile n is the (n / kStages)-th use of
// stage n % kStages: k_full completes phase n / kStages when its bytes land; the refill waits for
// k_empty's phase n / kStages - 1 (parity ^ 1; on a fresh barrier that parity passes at once),
// i.e. for all 8 consumer warps to finish reading tile n - kStages.
template <class T>
__device__ __forceinline__ void producer_load_k(const ScoresParams& p, ScoresSmem<T>& s, int n,
                                                int64_t s0) {
  const int stage = n % T::kStages;
  mbarrier_wait(&s.k_empty[stage], ((n / T::kStages) & 1) ^ 1);
  mbarrier_arrive_expect_tx(&s.k_full[stage], T::kKBytes);
#pragma unroll
  for (int pnl = 0; pnl < 2; ++pnl)
    tma_load_4d(&p.tma_k, &s.k[stage][pnl * T::kTileKeys * 64], &s.k_full[stage], pnl * 64,
                static_cast<int32_t>(s0), 0, 0);
}

template <class T>
__device__ __forceinline__ void producer_main(const ScoresParams& p, ScoresSmem<T>& s,
                                              const CtaWork& c) {
  if (c.i_lo >= c.i_hi) return;
  prefetch_tensor_map(&p.tma_q);
  prefetch_tensor_map(&p.tma_k);
  producer_load_q<T>(p, s, c.t0);
  for (int i = c.i_lo, n = 0; i < c.i_hi; ++i, ++n)
    producer_load_k<T>(p, s, n, c.k0 + int64_t{i} * T::kTileKeys);
}

// ---- consumers --------------------------------------------------------------------------------
// The order in which the two consumer warpgroups issue their GEMMs (FlashAttention-3's
// warp-scheduler barriers). Both wait for the same k_full phase; issued together, their wgmmas
// interleave on each SM sub-partition's tensor core, both GEMMs end together and both epilogues
// then run with the tensor core idle. With turns, warpgroup 0 issues tile n, then warpgroup 1,
// then warpgroup 0 tile n + 1 ..., so one's GEMM runs while the other reduces and stores.
// Warpgroup w syncs on barrier kTurn0 + w (256 threads: its 128 + the other's 128 arrivals)
// before issuing and arrives on the other's after. Warpgroup 1 opens warpgroup 0's first turn
// and skips the arrival after its last tile, so every barrier phase completes.
enum class ScoresBarrier : uint32_t { kTurn0 = 1, kTurn1 = 2 };

struct IssueTurn {
  uint32_t mine = 0, other = 0;  // named barrier ids
  bool pass_on = true;           // arrive on the other's barrier after issuing
  __device__ __forceinline__ void before() const { named_barrier_sync(mine, 256); }
  __device__ __forceinline__ void after() const {
    if (pass_on) named_barrier_arrive(other, 256);
  }
};
// No turns (the fused top-k kernel, whose warpgroups own different tokens' buffers).
struct NoTurn {
  __device__ __forceinline__ void before() const {}
  __device__ __forceinline__ void after() const {}
};

// -inf into this warpgroup's token rows for the keys of tile i (no loads, no MMA).
template <class T>
__device__ __forceinline__ void store_neg_inf(const ScoresParams& p, int64_t t_wg, int64_t s0,
                                              int wtid) {
  for (int idx = wtid; idx < T::kTokensPerWg * T::kTileKeys; idx += 128) {
    const int64_t t = t_wg + idx / T::kTileKeys;
    const int64_t s = s0 + idx % T::kTileKeys;
    if (t < p.dims.Sq && s < p.dims.Skv) p.out[t * p.out_ss + s] = -INFINITY;
  }
}

// [1]-[3] of the CTA's n-th key tile for one consumer warpgroup, shared with the top-k kernel:
// waits for stage n % kStages, S^T = 8 wgmma m64n256k16 into acc, releases the stage, then the
// weighted ReLU sum over each token's heads and the quad's reduce-scatter; calls
// emit(qi, key, score) once for each of the warpgroup's kTokensPerWg tokens qi and the tile's 64
// keys (key: 0 .. 63 within the tile), lane (g, t4) of warp w emitting tokens 4 a + t4 and keys
// 16 w + g (+ 8). The score is a function of the token's and the key's data alone (module
// comment), so both kernels see the same bits.
template <class T, class ThrMma, class TensorB, class TensorAcc, class Emit, class Turn = NoTurn>
__device__ __forceinline__ void consume_key_tile(ScoresSmem<T>& s, int n, const ThrMma& thr,
                                                 const TensorB& tB, TensorAcc& acc, uint32_t s_w,
                                                 bool negative, Emit&& emit,
                                                 const Turn& turn = Turn{}) {
  using namespace cute;
  const int wtid = threadIdx.x % 128;
  const int warp = wtid / 32, lane = wtid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const bool hi1 = (t4 & 1) != 0, hi2 = (t4 & 2) != 0;
  const int stage = n % T::kStages;
  // [1] S^T of the tile: 8 wgmma m64n256k16.
  mbarrier_wait(&s.k_full[stage], (n / T::kStages) & 1);
  Tensor sK = make_tensor(make_smem_ptr(s.k[stage]), typename T::SmemLayoutK{});
  Tensor tA = thr.partition_fragment_A(sK);
  typename T::TiledMma mma;
  turn.before();
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  mma.accumulate_ = SM90::GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int kb = 0; kb < size<2>(tA); ++kb) {
    cute::gemm(mma, tA(_, _, kb), tB(_, _, kb), acc);
    mma.accumulate_ = SM90::GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  turn.after();
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
  // [2] The stage is free.
  __syncwarp();
  if (lane == 0) mbarrier_arrive(&s.k_empty[stage]);

  // [3] Per group of 4 tokens: the lane's partial sums for its 2 keys (rows 16 warp + g + 8 r),
  // then the quad's reduce-scatter; lane t4 keeps token 4 a + t4.
  const int key0 = 16 * warp + g;
  CUTE_UNROLL
  for (int a = 0; a < T::kTokensPerWg / 4; ++a) {
    float part[4][2];
    // The sign of scale_I as a compile-time constant of each branch: a negated operand is free
    // in FMNMX, where a runtime sign cost one FSEL per accumulator value (128 of the ~700
    // instructions of a warp's epilogue, SASS of session 35).
    auto sum_heads = [&](auto neg) {
      constexpr bool kNeg = decltype(neg)::value;
      CUTE_UNROLL
      for (int b = 0; b < 4; ++b) {
        part[b][0] = part[b][1] = 0.f;
        CUTE_UNROLL
        for (int nn = 0; nn < T::kNtPerToken; ++nn) {
          const int j = (4 * a + b) * T::kNtPerToken + nn;
          const float2 wv = ld_shared_f32x2(s_w + 4 * (8 * j + 2 * t4));
          CUTE_UNROLL
          for (int r = 0; r < 2; ++r) {
            const float x0 = acc(4 * j + 2 * r), x1 = acc(4 * j + 2 * r + 1);
            part[b][r] = fmaf(fmaxf(kNeg ? -x0 : x0, 0.f), wv.x, part[b][r]);
            part[b][r] = fmaf(fmaxf(kNeg ? -x1 : x1, 0.f), wv.y, part[b][r]);
          }
        }
      }
    };
    if (negative)
      sum_heads(std::true_type{});
    else
      sum_heads(std::false_type{});
    // Step 1 (partner t4 ^ 2): keep tokens {0, 1} + 2 hi2; step 2 (partner t4 ^ 1): keep
    // token 2 hi2 + hi1 = t4. Each step adds two halves (commutative), so a sum is
    // (p0 + p2) + (p1 + p3) bitwise whichever lane keeps it.
    float h[2][2];
    CUTE_UNROLL
    for (int m = 0; m < 2; ++m)
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        const float send = hi2 ? part[m][r] : part[m + 2][r];
        const float keep = hi2 ? part[m + 2][r] : part[m][r];
        h[m][r] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
      }
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      const float send = hi1 ? h[0][r] : h[1][r];
      const float keep = hi1 ? h[1][r] : h[0][r];
      emit(4 * a + t4, key0 + 8 * r, keep + __shfl_xor_sync(0xffffffffu, send, 1));
    }
  }
}

template <class T>
__device__ __forceinline__ void consumer_main(const ScoresParams& p, ScoresSmem<T>& s,
                                              const CtaWork& c, int wg) {
  using namespace cute;
  const int wtid = threadIdx.x % 128;
  const int64_t t_wg = c.t0 + wg * T::kTokensPerWg;  // this warpgroup's first token

  // [0] Tiles of the chunk outside the span: -inf.
  for (int i = 0; i < c.n_tiles && !p.in_range_only; ++i) {
    if (i >= c.i_lo && i < c.i_hi) continue;
    store_neg_inf<T>(p, t_wg, c.k0 + int64_t{i} * T::kTileKeys, wtid);
  }
  if (c.i_lo >= c.i_hi) return;

  typename T::TiledMma mma;
  auto thr = mma.get_thread_slice(wtid);
  Tensor sQ = make_tensor(make_smem_ptr(s.q[wg]), typename T::SmemLayoutQ{});
  Tensor tB = thr.partition_fragment_B(sQ);  // descriptors (MMA, 1, D/16)
  Tensor acc = partition_fragment_C(mma, Shape<typename T::KT, typename T::NT>{});
  static_assert(decltype(size(acc))::value == 128, "64 x 256 fp32 over 128 threads");

  const bool negative = p.scale < 0.f;
  const uint32_t s_w = smem_u32(s.w[wg]);  // read by explicit ld.shared (not generic loads)
  const int2* s_range = s.range + wg * T::kTokensPerWg;

  mbarrier_wait(&s.q_full, 0);

  using Turn = std::conditional_t<T::kTurns, IssueTurn, NoTurn>;
  Turn turn;
  if constexpr (T::kTurns) {
    turn.mine = static_cast<uint32_t>(ScoresBarrier::kTurn0) + wg;
    turn.other = static_cast<uint32_t>(ScoresBarrier::kTurn0) + (1 - wg);
    if (wg == 1) named_barrier_arrive(turn.other, 256);  // warpgroup 0 issues first
  }
  // The rows this thread stores, once per CTA (its tokens are the CTA's): token 4 a + t4 of each
  // group a of four (consume_key_tile's emit order), its output row, the keys it stores there
  // ([0, S_kv), or the range alone with in_range_only; none past S_q) and its range. Per key
  // then: one add, two compares for the store, two and a select for the value.
  constexpr int kGroups = T::kTokensPerWg / 4;
  const int t4 = threadIdx.x % 4;
  float* row[kGroups];
  int st_lo[kGroups], st_hi[kGroups], in_lo[kGroups], in_hi[kGroups];
  CUTE_UNROLL
  for (int a = 0; a < kGroups; ++a) {
    const int64_t t = t_wg + 4 * a + t4;
    const int2 rg = s_range[4 * a + t4];
    const bool live = t < p.dims.Sq;
    row[a] = p.out + (live ? t * p.out_ss : 0);
    in_lo[a] = rg.x;
    in_hi[a] = rg.y;
    st_lo[a] = live ? (p.in_range_only ? rg.x : 0) : 0;
    st_hi[a] = live ? (p.in_range_only ? rg.y : static_cast<int>(p.dims.Skv)) : 0;
  }
#pragma unroll 1
  for (int i = c.i_lo, n = 0; i < c.i_hi; ++i, ++n) {
    const int s0 = static_cast<int>(c.k0) + i * T::kTileKeys;  // S_kv < 2^31 (indexer limits)
    if constexpr (T::kTurns) turn.pass_on = wg == 0 || i + 1 < c.i_hi;
    // [4] Masked stores: row t, key s0 + key.
    consume_key_tile<T>(
        s, n, thr, tB, acc, s_w, negative,
        [&](int qi, int key, float v) {
          const int a = qi >> 2;  // qi = 4 a + t4
          const int sk = s0 + key;
          if (sk >= st_lo[a] && sk < st_hi[a])
            row[a][sk] = sk >= in_lo[a] && sk < in_hi[a] ? v : -INFINITY;
        },
        turn);
  }
}

// ---- kernel -------------------------------------------------------------------------------------
template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    indexer_scores_sm90_kernel(const __grid_constant__ ScoresParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  ScoresSmem<T>& s = aligned_shared_storage<ScoresSmem<T>>(smem_raw);

  // [0] Barriers, ranges and w' (every thread), then the CTA barrier.
  if (threadIdx.x == 0) {
    mbarrier_init(&s.q_full, 1);
#pragma unroll
    for (int i = 0; i < T::kStages; ++i) {
      mbarrier_init(&s.k_full[i], 1);
      mbarrier_init(&s.k_empty[i], T::kConsumerWarps);
    }
    fence_mbarrier_init();
  }
  const int64_t t0 =
      int64_t{p.q_blocks - 1 - static_cast<int>(blockIdx.x / p.key_chunks)} * T::kTokensPerCta;
  for (int i = threadIdx.x; i < T::kTokensPerCta; i += T::kThreads) {
    const int64_t t = t0 + i;
    int2 r = make_int2(0, 0);
    if (t < p.dims.Sq) {
      const int64_t b = p.meta.range_begin(t, p.dims), e = p.meta.range_end(t, p.dims);
      if (e > b) r = make_int2(static_cast<int>(b), static_cast<int>(e));
    }
    s.range[i] = r;
  }
  const float mag = fabsf(p.scale);
  for (int i = threadIdx.x; i < T::kConsumers * T::kCols; i += T::kThreads) {
    const int64_t t = t0 + i / T::kHeads;
    const int j = i % T::kHeads;
    s.w[i / T::kCols][i % T::kCols] = t < p.dims.Sq ? mag * p.w[t * p.w_ss + j * p.w_sh] : 0.f;
  }
  __syncthreads();
  const CtaWork c = cta_work<T>(p, s);

  const Role role = static_cast<Role>(__shfl_sync(0xffffffffu, threadIdx.x / 128, 0));
  if (role == Role::kProducer) {
    setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == 0) producer_main<T>(p, s, c);
  } else {
    setmaxnreg_inc<T::kConsumerRegs>();
    consumer_main<T>(p, s, c, static_cast<int>(role) - static_cast<int>(Role::kConsumer0));
  }
#endif
}

}  // namespace sa::sm90::indexer
