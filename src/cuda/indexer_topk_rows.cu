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
// Six reads of the row in all, from L1 / L2 (a row of S_kv fp32 scores just written by the score
// kernel).
#include "cuda/indexer_topk_rows.hpp"

#include <cstdint>

#include "common/cuda_check.hpp"
#include "cuda/indexer_order_key.cuh"

namespace sa::portable::indexer {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

__global__ void __launch_bounds__(kThreads) topk_rows_kernel(const TopkRowsArgs a) {
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
  const float* row = a.scores + static_cast<int64_t>(blockIdx.x) * a.ld;

  // ---- radix select: u* and the ties to take ----
  uint32_t prefix = 0;
  int need = k;  // keys still to take among those whose leading digits are `prefix`
#pragma unroll 1
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int b = tid; b < 256; b += kThreads) hist[b] = 0u;
    __syncthreads();
    for (int64_t base = begin; base < end; base += kThreads) {
      const int64_t i = base + tid;
      uint32_t bin = 256u;  // none
      if (i < end) {
        const uint32_t u = order_key(row[i]);
        if (pass == 0 || (u >> (shift + 8)) == prefix) bin = (u >> shift) & 255u;
      }
      const uint32_t peers = __match_any_sync(0xffffffffu, bin);
      if (bin < 256u && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
    }
    __syncthreads();
    if (warp == 0) {
      // Lane L holds bins 8L .. 8L + 7; `above` = keys in the bins of the lanes above it.
      uint32_t c[8];
      uint32_t total = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        c[j] = hist[8 * lane + j];
        total += c[j];
      }
      uint32_t incl = total;  // keys in bins >= 8L
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const uint32_t v = __shfl_down_sync(0xffffffffu, incl, off);
        if (lane + off < 32) incl += v;
      }
      uint32_t acc = incl - total;
#pragma unroll
      for (int j = 7; j >= 0; --j) {
        if (acc < static_cast<uint32_t>(need) && acc + c[j] >= static_cast<uint32_t>(need)) {
          s_digit[0] = static_cast<uint32_t>(8 * lane + j);  // exactly one (lane, j) holds it
          s_digit[1] = acc;
        }
        acc += c[j];
      }
    }
    __syncthreads();
    need -= static_cast<int>(s_digit[1]);
    prefix = (prefix << 8) | s_digit[0];
    // The next pass clears hist and rewrites s_digit only after its first barrier, which every
    // thread reaches after these reads.
  }
  const uint32_t ustar = prefix;

  // ---- compaction in key order: warp w takes the segment [w0, w1) ----
  const int64_t per = (n + kWarps - 1) / kWarps;
  const int64_t w0 = begin + warp * per < end ? begin + warp * per : end;
  const int64_t w1 = w0 + per < end ? w0 + per : end;
  int32_t above = 0, equal = 0;
  for (int64_t base = w0; base < w1; base += 32) {
    const int64_t i = base + lane;
    const uint32_t u = i < w1 ? order_key(row[i]) : 0u;
    above += __popc(__ballot_sync(0xffffffffu, i < w1 && u > ustar));
    equal += __popc(__ballot_sync(0xffffffffu, i < w1 && u == ustar));
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
    const int64_t i = base + lane;
    const uint32_t u = i < w1 ? order_key(row[i]) : 0u;
    const bool gt = i < w1 && u > ustar;
    const bool eq = i < w1 && u == ustar;
    const uint32_t gt_mask = __ballot_sync(0xffffffffu, gt);
    const uint32_t eq_mask = __ballot_sync(0xffffffffu, eq);
    const int32_t g_before = g + __popc(gt_mask & lt);
    const int32_t e_before = e + __popc(eq_mask & lt);
    if (gt) out[g_before + (e_before < need ? e_before : need)] = static_cast<int32_t>(i);
    if (eq && e_before < need) out[g_before + e_before] = static_cast<int32_t>(i);
    g += __popc(gt_mask);
    e += __popc(eq_mask);
  }
}

}  // namespace

void topk_rows(const TopkRowsArgs& a, cudaStream_t stream) {
  if (a.rows <= 0) return;
  topk_rows_kernel<<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(a);
  SA_CUDA_CHECK_LAUNCH();
}

}  // namespace sa::portable::indexer
