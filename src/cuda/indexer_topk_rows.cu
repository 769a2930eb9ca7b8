// Top-k over dense indexer scores, one CTA per query row (declared in indexer_topk_rows.hpp).
//
// Per row t with n = |range(t)| > k keys: a radix select on the 32-bit order keys finds u*, the
// order key of the k-th best, and `need`, how many keys with order key u* are taken (the smallest
// ones: ties go to the smaller key). Four passes of 8 bits, most significant first; each pass
// streams the row's range (coalesced, block-uniform trip count), counts the keys that match the
// digits found so far into 256 shared bins (one atomic per distinct bin per warp: the leading
// digits of real scores are few, so plain atomics would serialize on one or two bins), and one
// warp finds the bin holding the need-th best from the top. Then two passes compact in key order:
// each warp counts its contiguous segment's keys above u* and equal to u*, a block scan over the
// warps gives each segment its output offsets, and the second pass writes key s at
//   (keys above u* before s) + min(ties before s, need)
// (a tie only while its rank < need). Rows with n <= k take every key of the range in order.
// Rows of at most kTopkRowsMaxStagedBytes / 4 keys are staged in shared memory as order keys
// first (one read of the scores); longer ones read the scores six times (L1 / L2).
#include "cuda/indexer_topk_rows.hpp"

#include <cstdint>

#include "common/cuda_check.hpp"
#include "cuda/indexer_order_key.cuh"
#include "cuda/indexer_topk_select.cuh"

namespace sa::portable::indexer {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kStageUnroll = 8;  // loads in flight per thread while staging a row

// kStaged: the row's order keys are first copied into shared memory (dynamic, |range| words, with
// kStageUnroll independent loads per thread in flight), and every pass reads them there: one
// memory latency per row instead of one per pass and step. Otherwise every pass reads the scores
// (L1 / L2) again.
template <bool kStaged>
__global__ void __launch_bounds__(kThreads) topk_rows_kernel(const TopkRowsArgs a) {
  extern __shared__ uint32_t s_keys[];  // kStaged: order keys of range(t), key begin + j at j
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_digit[2];      // the pass's digit and the count in the bins above it
  __shared__ int32_t s_warp[kWarps][2];  // per warp: keys above u*, keys equal to u*
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const uint32_t lt = (1u << lane) - 1u;
  const int64_t t = a.row0 + blockIdx.x;
  const int64_t begin = a.meta.range_begin(t, a.dims);
  const int64_t end = a.meta.range_end(t, a.dims);
  const int64_t n = end > begin ? end - begin : 0;
  const int k = a.k;
  const int take = n < k ? static_cast<int>(n) : k;
  int32_t* out = a.idx + t * a.idx_ss;
  if (tid == 0 && a.len != nullptr) a.len[t * a.len_s] = take;
  for (int i = take + tid; i < k; i += kThreads) out[i] = -1;
  if (n <= k) {
    for (int64_t i = tid; i < n; i += kThreads) out[i] = static_cast<int32_t>(begin + i);
    return;
  }
  const float* row = a.scores + static_cast<int64_t>(blockIdx.x) * a.ld + begin;
  if constexpr (kStaged) {
    for (int64_t base = 0; base < n; base += int64_t{kThreads} * kStageUnroll) {
      float v[kStageUnroll];
#pragma unroll
      for (int u = 0; u < kStageUnroll; ++u) {
        const int64_t j = base + u * kThreads + tid;
        v[u] = j < n ? row[j] : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kStageUnroll; ++u) {
        const int64_t j = base + u * kThreads + tid;
        if (j < n) s_keys[j] = order_key(v[u]);
      }
    }
  }
  // The order key of key begin + j, 0 <= j < n.
  auto key_at = [&](int64_t j) -> uint32_t {
    if constexpr (kStaged) {
      return s_keys[j];
    } else {
      return order_key(row[j]);
    }
  };

  // ---- radix select: u* and the ties to take ----
  uint32_t prefix = 0;
  int need = k;  // keys still to take among those whose leading digits are `prefix`
#pragma unroll 1
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int b = tid; b < 256; b += kThreads) hist[b] = 0u;
    __syncthreads();  // also: the staged keys are visible to every thread
    for (int64_t base = 0; base < n; base += kThreads) {
      const int64_t j = base + tid;
      uint32_t bin = 256u;  // none
      if (j < n) {
        const uint32_t u = key_at(j);
        if (pass == 0 || (u >> (shift + 8)) == prefix) bin = (u >> shift) & 255u;
      }
      const uint32_t peers = __match_any_sync(0xffffffffu, bin);
      if (bin < 256u && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
    }
    __syncthreads();
    if (warp == 0) {
      uint32_t greater = 0;
      const uint32_t digit = radix_digit(hist, static_cast<uint32_t>(need), &greater);
      if (lane == 0) {
        s_digit[0] = digit;
        s_digit[1] = greater;
      }
    }
    __syncthreads();
    need -= static_cast<int>(s_digit[1]);
    prefix = (prefix << 8) | s_digit[0];
    // The next pass clears hist and rewrites s_digit only after its first barrier, which every
    // thread reaches after these reads.
  }
  const uint32_t ustar = prefix;

  // ---- compaction in key order: warp w takes the segment [w0, w1) of the range ----
  const int64_t per = (n + kWarps - 1) / kWarps;
  const int64_t w0 = warp * per < n ? warp * per : n;
  const int64_t w1 = w0 + per < n ? w0 + per : n;
  int32_t above = 0, equal = 0;
  for (int64_t base = w0; base < w1; base += 32) {
    const int64_t j = base + lane;
    const uint32_t u = j < w1 ? key_at(j) : 0u;
    above += __popc(__ballot_sync(0xffffffffu, j < w1 && u > ustar));
    equal += __popc(__ballot_sync(0xffffffffu, j < w1 && u == ustar));
  }
  if (lane == 0) {
    s_warp[warp][0] = above;
    s_warp[warp][1] = equal;
  }
  __syncthreads();
  int32_t g = 0, e = 0;  // keys above u* / equal to u* in the segments before this warp's
  for (int w = 0; w < warp; ++w) {
    g += s_warp[w][0];
    e += s_warp[w][1];
  }
  for (int64_t base = w0; base < w1; base += 32) {
    const int64_t j = base + lane;
    const uint32_t u = j < w1 ? key_at(j) : 0u;
    const bool gt = j < w1 && u > ustar;
    const bool eq = j < w1 && u == ustar;
    const uint32_t gt_mask = __ballot_sync(0xffffffffu, gt);
    const uint32_t eq_mask = __ballot_sync(0xffffffffu, eq);
    const int32_t g_before = g + __popc(gt_mask & lt);
    const int32_t e_before = e + __popc(eq_mask & lt);
    const int32_t key = static_cast<int32_t>(begin + j);
    if (gt) out[g_before + (e_before < need ? e_before : need)] = key;
    if (eq && e_before < need) out[g_before + e_before] = key;
    g += __popc(gt_mask);
    e += __popc(eq_mask);
  }
}

}  // namespace

size_t topk_rows_staged_bytes(int64_t skv) { return static_cast<size_t>(skv) * 4; }

void topk_rows(const TopkRowsArgs& a, bool staged, cudaStream_t stream) {
  if (a.rows <= 0) return;
  if (staged) {
    const size_t smem = topk_rows_staged_bytes(a.dims.Skv);
    SA_CHECK(smem <= kTopkRowsMaxStagedBytes, SA_ERROR_INTERNAL,
             "topk_rows: S_kv = " << a.dims.Skv << " does not fit the staged kernel");
    auto* kernel = &topk_rows_kernel<true>;
    // The same value on every call (a process-wide attribute: no race between host threads).
    SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kTopkRowsMaxStagedBytes)));
    kernel<<<static_cast<unsigned>(a.rows), kThreads, smem, stream>>>(a);
  } else {
    topk_rows_kernel<false><<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(a);
  }
  SA_CUDA_CHECK_LAUNCH();
}

}  // namespace sa::portable::indexer
