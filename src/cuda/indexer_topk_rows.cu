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
//
// The candidates kernel (TopkRowsKernel::kCandidates, the default) finds the same u* and `need`
// with two reads of the row instead of six:
//   A  histogram of the first 12 bits of every order key (4096 bins in shared memory, plain
//      atomics: 12 bits spread real scores over enough bins); the whole CTA scans it for the bin
//      D holding the k-th best, `greater` = the keys in the bins above D, cnt = keys in D.
//   B  the row again: keys of bins above D are taken (one ballot per warp = one 32-bit word of
//      the `taken` bitmap, no atomics); keys of bin D go to a shared candidate list
//      ((order key, offset) pairs, one atomic per warp).
//   C  rounds over the list only, 8 + 8 + 4 bits (the digits below the first 12), each one a
//      256-bin histogram and a warp's digit search; a round whose bin holds exactly the keys
//      still needed ends the search early (every key of that prefix is taken). Winners set
//      their bit in `taken` (atomicOr), keys equal to the final prefix their bit in `ties`.
//   D  emission in key order from the bitmaps: each thread owns consecutive words, a block scan
//      of their (taken, ties) popcounts gives offsets, and key j goes to
//      (taken before j) + min(ties before j, need) (a tie only while its rank < need).
// When bin D holds more keys than the list (kTopkListCap; constant or tied rows), the rounds
// and the marking read the row instead (one read per round). Rows launch last row first (the
// longest under causal ranges, so the last wave holds the shortest). Shared memory:
// topk_rows_candidates_bytes(S_kv).
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

// The row's range and the part of the output that needs no selection, shared by both kernels:
// len = min(k, n), slots past it -1, and a row of n <= k keys written whole (its key order).
// Returns false when the row is done (n <= k). Called by the whole CTA.
struct RowRange {
  int64_t begin = 0, n = 0;
  int32_t* out = nullptr;
};
__device__ __forceinline__ bool start_row(const TopkRowsArgs& a, int64_t t, RowRange* r) {
  const int tid = threadIdx.x;
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
    return false;
  }
  r->begin = begin;
  r->n = n;
  r->out = out;
  return true;
}

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
  RowRange rr;
  if (!start_row(a, a.row0 + blockIdx.x, &rr)) return;
  const int64_t begin = rr.begin, n = rr.n;
  const int k = a.k;
  int32_t* const out = rr.out;
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

// ---- the candidates kernel ----
constexpr int kFirstShift = 20;                 // the first digit: order-key bits [31:20]
constexpr int kFirstBins = 1 << (32 - kFirstShift);
constexpr int kBinsPerThread = kFirstBins / kThreads;
static_assert(kBinsPerThread * kThreads == kFirstBins, "every thread scans the same bin count");
// The region that holds the first histogram, then the candidate list (uint2 entries).
constexpr int kRegionWords = (kFirstBins > 2 * kTopkListCap) ? kFirstBins : 2 * kTopkListCap;

// The bin of hist[0, kFirstBins) that holds the need-th best key from the top: writes (bin,
// keys in the bins above it, keys in it) to sel. Called by the whole CTA; thread t reads bins
// kBinsPerThread t + i. Ends with a barrier.
__device__ __forceinline__ void block_first_digit(const uint32_t* hist, uint32_t need,
                                                  uint32_t* warp_sums, uint32_t* sel) {
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  uint32_t c[kBinsPerThread];
  uint32_t total = 0;
#pragma unroll
  for (int i = 0; i < kBinsPerThread; ++i) {
    c[i] = hist[kBinsPerThread * tid + i];
    total += c[i];
  }
  uint32_t incl = total;  // keys in this lane's bins and those of the lanes above
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const uint32_t v = __shfl_down_sync(0xffffffffu, incl, off);
    if (lane + off < 32) incl += v;
  }
  if (lane == 0) warp_sums[warp] = incl;
  __syncthreads();
  uint32_t acc = incl - total;  // keys in the bins above this thread's
  for (int w = warp + 1; w < kWarps; ++w) acc += warp_sums[w];
#pragma unroll
  for (int i = kBinsPerThread - 1; i >= 0; --i) {
    if (acc < need && acc + c[i] >= need) {
      sel[0] = static_cast<uint32_t>(kBinsPerThread * tid + i);
      sel[1] = acc;
      sel[2] = c[i];
    }
    acc += c[i];
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) topk_rows_candidates_kernel(const TopkRowsArgs a) {
  extern __shared__ __align__(16) uint32_t smem[];
  uint32_t* const hist = smem;                         // A: kFirstBins bins
  uint2* const list = reinterpret_cast<uint2*>(smem);  // B, C: the candidates of bin D
  const int64_t words_cap = (a.dims.Skv + 31) / 32;
  uint32_t* const taken = smem + kRegionWords;  // bit j: key begin + j is taken
  uint32_t* const ties = taken + words_cap;     // bit j: key begin + j has the order key u*
  __shared__ uint32_t rhist[256];
  __shared__ uint32_t sel[3];  // the search's bin, keys above it, keys in it
  __shared__ uint32_t list_count;
  __shared__ uint32_t warp_sums[kWarps][2];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const uint32_t lt = (1u << lane) - 1u;
  const int64_t r = a.rows - 1 - static_cast<int64_t>(blockIdx.x);  // last row first
  RowRange rr;
  if (!start_row(a, a.row0 + r, &rr)) return;
  const int64_t begin = rr.begin, n = rr.n;
  const int k = a.k;
  int32_t* const out = rr.out;
  const float* row = a.scores + r * a.ld + begin;
  const int words = static_cast<int>((n + 31) / 32);

  // ---- A: the first digit ----
  for (int b = tid; b < kFirstBins; b += kThreads) hist[b] = 0u;
  for (int w = tid; w < words; w += kThreads) ties[w] = 0u;
  if (tid == 0) list_count = 0u;
  __syncthreads();
  for (int64_t j = tid; j < n; j += kThreads)
    atomicAdd(&hist[order_key(row[j]) >> kFirstShift], 1u);
  __syncthreads();
  block_first_digit(hist, static_cast<uint32_t>(k), &warp_sums[0][0], sel);
  uint32_t prefix = sel[0];  // the leading digits of u* found so far
  int shift = kFirstShift;   // ... are order-key bits [31:shift]
  int need = k - static_cast<int>(sel[1]);  // keys still to take among those matching prefix
  bool exact = static_cast<int>(sel[2]) == need;  // every key matching prefix is taken
  const int cnt = static_cast<int>(sel[2]);
  const bool use_list = !exact && cnt <= a.list_cap;
  // sel and hist are read: the list may overwrite hist after the next barrier, sel after two.

  // ---- B: keys above bin D into `taken`, bin D's into the list ----
  for (int64_t base = 0; base < n; base += kThreads) {
    const int64_t j = base + tid;
    const uint32_t u = j < n ? order_key(row[j]) : 0u;
    const uint32_t d = u >> kFirstShift;
    const bool gt = j < n && (exact ? d >= prefix : d > prefix);
    const uint32_t word = __ballot_sync(0xffffffffu, gt);
    if (lane == 0 && base + 32 * warp < n) taken[(base >> 5) + warp] = word;
    if (use_list) {
      const bool eq = j < n && d == prefix;
      const uint32_t m = __ballot_sync(0xffffffffu, eq);
      if (m != 0u) {
        uint32_t pos = 0;
        if (lane == __ffs(m) - 1) pos = atomicAdd(&list_count, static_cast<uint32_t>(__popc(m)));
        pos = __shfl_sync(0xffffffffu, pos, __ffs(m) - 1);
        if (eq) list[pos + __popc(m & lt)] = make_uint2(u, static_cast<uint32_t>(j));
      }
    }
  }
  __syncthreads();

  // ---- C: the remaining digits over the list (or the row) ----
  if (!exact) {
#pragma unroll 1
    for (int round = 0; round < 3; ++round) {
      const int bits = round < 2 ? 8 : 4;
      const int sh = shift - bits;
      const uint32_t mask = (1u << bits) - 1u;
      if (tid < 256) rhist[tid] = 0u;
      __syncthreads();
      if (use_list) {
        for (int i = tid; i < cnt; i += kThreads) {
          const uint32_t u = list[i].x;
          if ((u >> shift) == prefix) atomicAdd(&rhist[(u >> sh) & mask], 1u);
        }
      } else {
        for (int64_t base = 0; base < n; base += kThreads) {
          const int64_t j = base + tid;
          uint32_t bin = 256u;  // none
          if (j < n) {
            const uint32_t u = order_key(row[j]);
            if ((u >> shift) == prefix) bin = (u >> sh) & mask;
          }
          const uint32_t peers = __match_any_sync(0xffffffffu, bin);
          if (bin < 256u && lane == __ffs(peers) - 1) atomicAdd(&rhist[bin], __popc(peers));
        }
      }
      __syncthreads();
      if (warp == 0) {
        uint32_t greater = 0;
        const uint32_t digit = radix_digit(rhist, static_cast<uint32_t>(need), &greater);
        if (lane == 0) {
          sel[0] = digit;
          sel[1] = greater;
          sel[2] = rhist[digit];
        }
      }
      __syncthreads();
      need -= static_cast<int>(sel[1]);
      prefix = (prefix << bits) | sel[0];
      shift = sh;
      exact = static_cast<int>(sel[2]) == need;
      if (exact) break;  // block-uniform
      // The next round rewrites rhist after its first barrier and sel after its second, which
      // every thread reaches after these reads.
    }
    // Keys whose order key's bits [31:shift] exceed prefix are taken; those equal to it are the
    // ties, of which the `need` smallest keys are taken.
    if (use_list) {
      for (int i = tid; i < cnt; i += kThreads) {
        const uint2 e = list[i];
        const uint32_t v = e.x >> shift;
        const uint32_t bit = 1u << (e.y & 31u);
        if (v > prefix) atomicOr(&taken[e.y >> 5], bit);
        else if (v == prefix) atomicOr(&ties[e.y >> 5], bit);
      }
    } else {
      for (int64_t base = 0; base < n; base += kThreads) {
        const int64_t j = base + tid;
        const uint32_t v = j < n ? order_key(row[j]) >> shift : 0u;
        const uint32_t gt = __ballot_sync(0xffffffffu, j < n && v > prefix);
        const uint32_t eq = __ballot_sync(0xffffffffu, j < n && v == prefix);
        if (lane == 0 && base + 32 * warp < n) {
          taken[(base >> 5) + warp] |= gt;  // this warp's word alone
          ties[(base >> 5) + warp] = eq;
        }
      }
    }
    __syncthreads();
  }

  // ---- D: emission in key order ----
  const int per = (words + kThreads - 1) / kThreads;
  const int w0 = tid * per < words ? tid * per : words;
  const int w1 = w0 + per < words ? w0 + per : words;
  uint32_t ct = 0, ce = 0;
  for (int w = w0; w < w1; ++w) {
    ct += __popc(taken[w]);
    ce += __popc(ties[w]);
  }
  uint32_t it = ct, ie = ce;  // inclusive prefix sums over the warp's lanes
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const uint32_t vt = __shfl_up_sync(0xffffffffu, it, off);
    const uint32_t ve = __shfl_up_sync(0xffffffffu, ie, off);
    if (lane >= off) {
      it += vt;
      ie += ve;
    }
  }
  if (lane == 31) {
    warp_sums[warp][0] = it;
    warp_sums[warp][1] = ie;
  }
  __syncthreads();
  int32_t g = static_cast<int32_t>(it - ct), e = static_cast<int32_t>(ie - ce);
  for (int w = 0; w < warp; ++w) {
    g += static_cast<int32_t>(warp_sums[w][0]);
    e += static_cast<int32_t>(warp_sums[w][1]);
  }
  for (int w = w0; w < w1; ++w) {
    const uint32_t tw = taken[w];
    const uint32_t ew = ties[w];
    uint32_t m = tw | ew;
    while (m != 0u) {
      const int b = __ffs(m) - 1;
      m &= m - 1u;
      const int32_t key = static_cast<int32_t>(begin + 32 * static_cast<int64_t>(w) + b);
      if ((tw >> b) & 1u) {
        out[g + (e < need ? e : need)] = key;
        ++g;
      } else {
        if (e < need) out[g + e] = key;
        ++e;
      }
    }
  }
}

}  // namespace

size_t topk_rows_candidates_bytes(int64_t skv) {
  return (static_cast<size_t>(kRegionWords) + 2 * static_cast<size_t>((skv + 31) / 32)) * 4;
}

size_t topk_rows_staged_bytes(int64_t skv) { return static_cast<size_t>(skv) * 4; }

void topk_rows(const TopkRowsArgs& a, TopkRowsKernel kernel, cudaStream_t stream) {
  if (a.rows <= 0) return;
  if (kernel == TopkRowsKernel::kCandidates &&
      topk_rows_candidates_bytes(a.dims.Skv) <= kTopkRowsMaxCandidatesBytes) {
    SA_CHECK(a.list_cap >= 0 && a.list_cap <= kTopkListCap, SA_ERROR_INTERNAL,
             "topk_rows: list_cap = " << a.list_cap);
    const size_t smem = topk_rows_candidates_bytes(a.dims.Skv);
    auto* kfn = &topk_rows_candidates_kernel;
    SA_CUDA_CHECK(cudaFuncSetAttribute(kfn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kTopkRowsMaxCandidatesBytes)));
    kfn<<<static_cast<unsigned>(a.rows), kThreads, smem, stream>>>(a);
    SA_CUDA_CHECK_LAUNCH();
    return;
  }
  // kCandidates past its shared memory (S_kv > 2^18) runs the unstaged radix kernel.
  if (kernel == TopkRowsKernel::kRadixStaged &&
      topk_rows_staged_bytes(a.dims.Skv) <= kTopkRowsMaxStagedBytes) {
    const size_t smem = topk_rows_staged_bytes(a.dims.Skv);
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
