// The Hopper (sm_90a) fused indexer top-k (SPEC 5): per query token t, the k keys of range(t) with
// the largest scores I[t, s] (ties to the smaller key, NaN last), in increasing key order, then
// -1; topk_length[t] = min(k, |range(t)|). No dense score buffer.
//
// Composition of shared pieces, no kernel of its own making:
//   scores     the sm90 score kernel's producer loads and consume_key_tile
//              (indexer_scores_kernel.cuh): the same TMA + wgmma m64n256k16 GEMM, the same
//              reduction, so each score has the bits the score kernel writes;
//   selection  the portable top-k's TopkRows and warp_compact (cuda/indexer_topk_select.cuh):
//              exact, order-free, deterministic; buffers of topk_buffer_cap(k) candidates.
//
// Work split: persistent CTAs (one per SM, grid <= query blocks); CTA c takes the query blocks
// c, c + grid, ... of kTokensPerCta tokens (8 / 16 / 32 at H_I 64 / 32 / 16) and streams, for
// each, every 64-key tile that meets the union of the block's ranges (no key chunks: a token's
// selection sees all its keys in one CTA). Warp w of consumer warpgroup g owns the
// kRowsPerWarp = kTokensPerWg / 4 tokens g * kTokensPerWg + w * kRowsPerWarp + [0, kRowsPerWarp)
// of the block, and one candidate buffer per token slot (workspace: grid x kTokensPerCta x cap
// entries of 8 bytes, O(k) per CTA, independent of S).
//
// Timeline (one CTA; block b's tiles i0 i1 ...; the two consumers share each key stage):
//   producer |Qb|K0|K1|K2|K3|   K4 ...   | wait q_empty |Qb+1|K0 ...
//   WGg      |  |GEMM0 -> stage0|sel0|GEMM1 -> stage1|sel1| ... last tile: arrive q_empty |rows|
//   (stage: the tile's 64 scores per token into shared memory; sel: each warp offers its tokens'
//   64 keys to their rows; rows: the rows written after the block's last tile)
//
// Pipeline objects (shared memory), in addition to the score kernel's q_full / k_full / k_empty:
//   q_full   now one phase per block with work (index jb: the CTA's jb-th such block);
//   q_empty  mbarrier, one arrival per consumer warp after its last GEMM of block jb -> the
//            producer loads block jb + 1's q_I after phase jb;
//   named barrier 1 + g (128 threads of consumer g): the tile's scores staged / read.
// The key-tile counter n runs on across blocks in producer and consumers alike, so the ring's
// stage/phase rule (producer_load_k) holds unchanged.
#pragma once

#include "cuda/indexer_topk_select.cuh"
#include "sm90/indexer_scores_kernel.cuh"

namespace sa::sm90::indexer {

struct TopkParams {
  ScoresParams sc;  // q_I, k_I (TMA), w, dims, meta, scale, q_blocks (out, key_chunks: unused)
  int32_t* idx;     // [S_q, k]: (t, i) at t * idx_ss + i
  int64_t idx_ss;
  int32_t* len;     // [S_q] at t * len_s; may be null
  int64_t len_s;
  uint2* buf;       // workspace: gridDim.x x kTokensPerCta buffers of cap entries
  int32_t k;
  int32_t cap;      // topk_buffer_cap(k)
};

template <class T>
struct alignas(1024) TopkSmem {
  ScoresSmem<T> sc;
  // One tile's scores per token; rows padded by 8 floats so that the epilogue's stores (lanes
  // g + 8 t4 of a warp: key g, token t4) fall in 32 distinct banks.
  static constexpr int kStageRow = T::kTileKeys + 8;
  float stage[T::kConsumers][T::kTokensPerWg][kStageRow];
  uint32_t hist[T::kConsumerWarps][256];                      // warp_compact's bins, per warp
  uint64_t q_empty;
};

enum class TopkBarrier : uint32_t { kConsumer0 = 1, kConsumer1 = 2 };  // 0: __syncthreads

// The key tiles [x, y) that meet the union of the ranges of tokens [t0, t0 + kTokensPerCta) (from
// global memory: producer and consumers compute the same pair); none: x == y.
template <class T>
__device__ __forceinline__ int2 block_tiles(const ScoresParams& p, int64_t t0) {
  int lo = INT32_MAX, hi = 0;
  for (int i = 0; i < T::kTokensPerCta; ++i) {
    const int64_t t = t0 + i;
    if (t >= p.dims.Sq) break;
    const int64_t b = p.meta.range_begin(t, p.dims), e = p.meta.range_end(t, p.dims);
    if (e > b) {
      lo = min(lo, static_cast<int>(b));
      hi = max(hi, static_cast<int>(e));
    }
  }
  if (lo >= hi) return make_int2(0, 0);
  return make_int2(lo / T::kTileKeys, (hi + T::kTileKeys - 1) / T::kTileKeys);  // hi <= S_kv
}

// ---- producer (one thread) ------------------------------------------------------------------
template <class T>
__device__ __forceinline__ void topk_producer(const TopkParams& p, TopkSmem<T>& s) {
  prefetch_tensor_map(&p.sc.tma_q);
  prefetch_tensor_map(&p.sc.tma_k);
  int n = 0, jb = 0;
  for (int64_t qb = blockIdx.x; qb < p.sc.q_blocks; qb += gridDim.x) {
    const int64_t t0 = qb * T::kTokensPerCta;
    const int2 tiles = block_tiles<T>(p.sc, t0);
    if (tiles.x >= tiles.y) continue;
    // [1] q_I of block jb overwrites block jb - 1's once every consumer warp has waited for its
    // last GEMM on it (q_empty phase jb - 1).
    if (jb > 0) mbarrier_wait(&s.q_empty, (jb - 1) & 1);
    producer_load_q<T>(p.sc, s.sc, t0);
    // [2] The block's key tiles into the ring (n runs on across blocks).
    for (int i = tiles.x; i < tiles.y; ++i, ++n)
      producer_load_k<T>(p.sc, s.sc, n, int64_t{i} * T::kTileKeys);
    ++jb;
  }
}

// ---- consumers --------------------------------------------------------------------------------
template <class T>
__device__ __forceinline__ void topk_consumer(const TopkParams& p, TopkSmem<T>& s, int wg) {
  using namespace cute;
  constexpr int kRowsPerWarp = T::kTokensPerWg / 4;  // 1, 2, 4
  const int wtid = threadIdx.x % 128;
  const int warp = wtid / 32, lane = wtid % 32;
  const uint32_t bar = static_cast<uint32_t>(wg == 0 ? TopkBarrier::kConsumer0
                                                     : TopkBarrier::kConsumer1);

  typename T::TiledMma mma;
  auto thr = mma.get_thread_slice(wtid);
  Tensor sQ = make_tensor(make_smem_ptr(s.sc.q[wg]), typename T::SmemLayoutQ{});
  Tensor tB = thr.partition_fragment_B(sQ);
  Tensor acc = partition_fragment_C(mma, Shape<typename T::KT, typename T::NT>{});

  const bool negative = p.sc.scale < 0.f;
  const float mag = fabsf(p.sc.scale);
  float* const s_wf = s.sc.w[wg];
  const uint32_t s_w = smem_u32(s_wf);
  int2* const s_range = s.sc.range + wg * T::kTokensPerWg;
  float(*const stage)[TopkSmem<T>::kStageRow] = s.stage[wg];
  uint32_t* const hist = s.hist[wg * 4 + warp];
  const int row0 = warp * kRowsPerWarp;  // the warp's first token within the warpgroup
  uint2* const bufs =
      p.buf + (int64_t{blockIdx.x} * T::kTokensPerCta + wg * T::kTokensPerWg + row0) *
                  int64_t{p.cap};

  int n = 0, jb = 0;
  for (int64_t qb = blockIdx.x; qb < p.sc.q_blocks; qb += gridDim.x) {
    const int64_t t0 = qb * T::kTokensPerCta;
    const int64_t t_wg = t0 + wg * T::kTokensPerWg;
    // [0] Ranges and w' of the warpgroup's tokens (its own halves of the score kernel's arrays),
    // after every warp of the warpgroup has finished the previous block's reads of them.
    named_barrier_sync(bar, 128);
    for (int i = wtid; i < T::kTokensPerWg; i += 128) {
      const int64_t t = t_wg + i;
      int2 r = make_int2(0, 0);
      if (t < p.sc.dims.Sq) {
        const int64_t b = p.sc.meta.range_begin(t, p.sc.dims);
        const int64_t e = p.sc.meta.range_end(t, p.sc.dims);
        if (e > b) r = make_int2(static_cast<int>(b), static_cast<int>(e));
      }
      s_range[i] = r;
    }
    for (int i = wtid; i < T::kCols; i += 128) {
      const int64_t t = t_wg + i / T::kHeads;
      const int j = i % T::kHeads;
      s_wf[i] = t < p.sc.dims.Sq ? mag * p.sc.w[t * p.sc.w_ss + j * p.sc.w_sh] : 0.f;
    }
    named_barrier_sync(bar, 128);

    portable::indexer::TopkRows<kRowsPerWarp> rows;
    rows.start();
    const int2 tiles = block_tiles<T>(p.sc, t0);
    if (tiles.x < tiles.y) {
      mbarrier_wait(&s.sc.q_full, jb & 1);
#pragma unroll 1
      for (int i = tiles.x; i < tiles.y; ++i, ++n) {
        // [1]-[3] the tile's scores, [4] staged per token (the selection masks the range).
        consume_key_tile<T>(s.sc, n, thr, tB, acc, s_w, negative,
                            [&](int qi, int key, float v) { stage[qi][key] = v; });
        if (i + 1 == tiles.y) {  // this warp's last GEMM on block jb's q_I has completed
          __syncwarp();
          if (lane == 0) mbarrier_arrive(&s.q_empty);
        }
        named_barrier_sync(bar, 128);  // every token's 64 scores are staged
        // [5] Each warp offers its tokens' keys to their rows.
        const int64_t s0 = int64_t{i} * T::kTileKeys;
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r)
          rows.offer(r, bufs + r * int64_t{p.cap}, stage[row0 + r], s0, s_range[row0 + r], p.k,
                     p.cap, hist);
        named_barrier_sync(bar, 128);  // the stage is read before the next tile rewrites it
      }
      ++jb;
    }
    // [6] The rows: buf[0, count) in key order, then -1 (tokens without keys: all -1, length 0).
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t t = t_wg + row0 + r;
      if (t >= p.sc.dims.Sq) continue;
      rows.finish(r, bufs + r * int64_t{p.cap}, p.k, hist, p.idx + t * p.idx_ss,
                  p.len != nullptr ? p.len + t * p.len_s : nullptr);
    }
  }
}

// ---- kernel -------------------------------------------------------------------------------------
template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    indexer_topk_sm90_kernel(const __grid_constant__ TopkParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  TopkSmem<T>& s = aligned_shared_storage<TopkSmem<T>>(smem_raw);
  if (threadIdx.x == 0) {
    mbarrier_init(&s.sc.q_full, 1);
    mbarrier_init(&s.q_empty, T::kConsumerWarps);
#pragma unroll
    for (int i = 0; i < T::kStages; ++i) {
      mbarrier_init(&s.sc.k_full[i], 1);
      mbarrier_init(&s.sc.k_empty[i], T::kConsumerWarps);
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  const Role role = static_cast<Role>(__shfl_sync(0xffffffffu, threadIdx.x / 128, 0));
  if (role == Role::kProducer) {
    setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == 0) topk_producer<T>(p, s);
  } else {
    setmaxnreg_inc<T::kConsumerRegs>();
    topk_consumer<T>(p, s, static_cast<int>(role) - static_cast<int>(Role::kConsumer0));
  }
#endif
}

}  // namespace sa::sm90::indexer
