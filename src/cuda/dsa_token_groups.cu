// Token groups of the DSA backward: the union builder (dsa_token_groups.hpp).
//
// One CTA per group of G tokens. S_kv is walked in windows of W = 16384 / G keys; per window:
//   1. zero the counters cnt[g][k] (G x W uint32, 64 KB of shared memory)
//   2. every active slot of the group's tokens whose key falls in the window adds 1 to its
//      token's counter (shared atomics; the rows are read again for each window)
//   3. the window's keys in order, 512 per step: a key takes max_g ceil(cnt[g][k] / M) entries
//      (0 for a key no token holds); a block scan gives each its place after the entries already
//      written, so the entries come out in key order
// At S_kv 4096 a group reads its tokens' rows once (G 2, 4) or twice (G 8).
#include <cub/block/block_scan.cuh>

#include "common/cuda_check.hpp"
#include "common/dsa_device.cuh"
#include "cuda/dsa_token_groups.hpp"

namespace sa::portable::dsa_bwd {
namespace {

constexpr int kThreads = 512;
constexpr int kCounterWords = 16384;  // per CTA: G x W

__global__ void __launch_bounds__(kThreads) token_groups_kernel(const TokenGroupArgs a) {
  extern __shared__ uint32_t cnt[];  // [G][W]
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  const int G = a.G;
  const int W = kCounterWords / G;
  constexpr int B = kGroupFieldBits;
  constexpr uint32_t M = kGroupFieldMax;
  __shared__ uint32_t present;
  if (threadIdx.x == 0) present = 0u;  // ordered before its atomics by the first __syncthreads
  const int64_t b = blockIdx.x;  // the group's row in the slice's arrays
  const int64_t t0 = (a.first + b) * G;
  const int tokens = static_cast<int>(min(int64_t{G}, a.sq - t0));
  int32_t* const keys = a.keys + b * a.cap;
  uint32_t* const mult = a.mult + b * a.cap;
  const int tid = threadIdx.x;
  int emitted = 0;  // the same in every thread
  uint32_t seen = 0u;  // the OR of this thread's words
#pragma unroll 1
  for (int64_t w0 = 0; w0 < a.rows.skv; w0 += W) {
    const int wn = static_cast<int>(min(int64_t{W}, a.rows.skv - w0));
    // [1]
    for (int i = tid; i < G * W; i += kThreads) cnt[i] = 0u;
    __syncthreads();
    // [2]
#pragma unroll 1
    for (int g = 0; g < tokens; ++g) {
      const int64_t t = t0 + g;
      const int n = dsa_active_slots(a.rows.len, a.rows.len_s, a.rows.topk, t);
      const int32_t* row = a.rows.idx + t * a.rows.idx_ss;
#pragma unroll 1
      for (int i = tid; i < n; i += kThreads) {
        const int64_t k = int64_t{row[i * a.rows.idx_si]} - w0;  // inactive: outside every window
        if (k >= 0 && k < wn) atomicAdd(&cnt[g * W + static_cast<int>(k)], 1u);
      }
    }
    __syncthreads();
    // [3]
#pragma unroll 1
    for (int base = 0; base < wn; base += kThreads) {
      const int k = base + tid;
      uint32_t c[8];
      int n_entries = 0;
#pragma unroll
      for (int g = 0; g < 8; ++g) {
        c[g] = (g < G && k < wn) ? cnt[g * W + k] : 0u;
        n_entries = max(n_entries, static_cast<int>((c[g] + (M - 1)) / M));
      }
      int at = 0, total = 0;
      Scan(scan).ExclusiveSum(n_entries, at, total);
#pragma unroll 1
      for (int e = 0; e < n_entries; ++e) {
        const uint32_t done = static_cast<uint32_t>(e) * M;
        uint32_t word = 0u;
#pragma unroll
        for (int g = 0; g < 8; ++g)
          if (g < G && c[g] > done) word |= min(M, c[g] - done) << (B * g);
        keys[emitted + at + e] = static_cast<int32_t>(w0 + k);
        mult[emitted + at + e] = word;
        seen |= word;
      }
      emitted += total;
      __syncthreads();  // the scan's storage is reused; [1] of the next window rewrites cnt
    }
  }
  if (seen != 0u) atomicOr(&present, seen);
  __syncthreads();
  if (tid == 0) {
    a.entries[b] = emitted;
    a.present[b] = present;
  }
}

}  // namespace

size_t token_group_smem_bytes() { return kCounterWords * sizeof(uint32_t); }

void build_token_groups(const TokenGroupArgs& a, cudaStream_t stream) {
  const int64_t groups = a.groups;
  if (groups == 0) return;
  const int smem = static_cast<int>(token_group_smem_bytes());
  SA_CUDA_CHECK(cudaFuncSetAttribute(token_groups_kernel,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  token_groups_kernel<<<static_cast<unsigned>(groups), kThreads, smem, stream>>>(a);
  SA_CUDA_CHECK_LAUNCH();
}

}  // namespace sa::portable::dsa_bwd
