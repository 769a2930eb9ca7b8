// The DSA backward's L2 traffic pattern, shared by l2_ceiling.cu and dsmem_exchange_chunk.cu: the
// problem's sizes, the 64-row chunks of precomputed random row sets (loaded lane-parallel one chunk
// ahead, broadcast by shuffle), the row gather (16-byte cp.async.cg, 8 lanes per 1,152-byte row,
// 4 rows x 128 B per warp instruction, as gather_row in src/sm90/dsa_common.cuh), the exact test
// values, the host's calibrated timing of a test (check.cuh's time_ms) and a test run's cycles,
// the device query, and the traffic's buffers.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "check.cuh"

constexpr int kRows = 4096;                                  // S_kv
constexpr int kCols = 576;                                   // D_qk
constexpr int kChunkRows = 64;                               // keys per chunk
constexpr int kSegs = kCols / 32;                            // 128-byte fp32 segments per row: 18
constexpr int kKvRowBytes = kCols * 2;                       // 1,152
constexpr int kGatherChunkBytes = kChunkRows * kKvRowBytes;  // 73,728
constexpr int kSets = 4096;                                  // precomputed index sets

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ((t & 15) + 1) / 16 exactly, with one LOP3 and one FFMA (no I2F): 2^23 + m scaled by 1/16 is
// 2^19 + m / 16, and 2^19 - 1/16 is representable. The value added at (slot, col) of a chunk is
// val(h(cb, slot, col)), h = cb + 3 slot + col + 5 (col >> 5), cb a per-(CTA, chunk) offset.
__device__ __forceinline__ float val(int t) {
  return fmaf(__int_as_float(0x4B000000 | (t & 15)), 0.0625f, -524287.9375f);
}
// The host's val.
inline double hval(long long t) { return double((t & 15) + 1) / 16.0; }

// Reduction, no return value (no "memory" clobber, like src/common/device_math.cuh).
__device__ __forceinline__ void red_f32x4(float* a, float4 v) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(a), "f"(v.x), "f"(v.y),
               "f"(v.z), "f"(v.w));
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// ---- a chunk's rows
struct Idx {
  int lo, hi;  // lane i: the rows of slots i and 32 + i
};
// The set of chunk c of unit u (a CTA, or a cluster) of n units.
__device__ __forceinline__ int chunk_set(int u, int c, int n) { return (c * n + u) % kSets; }
__device__ __forceinline__ Idx load_idx(const int* __restrict__ idx, int set, int lane) {
  const int* p = idx + set * kChunkRows;
  return {__ldg(p + lane), __ldg(p + 32 + lane)};
}
// The row of `slot`; `hi` (warp-uniform) says whether the instruction's slots are in 32..63.
__device__ __forceinline__ int row_of(const Idx& x, bool hi, int slot) {
  return __shfl_sync(0xffffffffu, hi ? x.hi : x.lo, slot & 31);
}

// Warp w of nw gathering warps copies row quads w, w + nw, .. (16 quads of 4 rows) of the chunk:
// per quad 9 cp.async of 16 B per lane, 8 lanes per row, 128 contiguous bytes per row and
// instruction. Shared layout: slot-major rows of 1,152 B.
__device__ __forceinline__ void gather_chunk(uint32_t sbuf, const uint8_t* __restrict__ kv,
                                             const Idx& ix, int w, int nw, int lane) {
  const int sub = lane & 7, rsub = lane >> 3;
  for (int q = w; q < kChunkRows / 4; q += nw) {
    const int slot = 4 * q + rsub;
    const int row = row_of(ix, q >= 8, slot);
    const uint8_t* const src = kv + static_cast<size_t>(row) * kKvRowBytes + 16 * sub;
    const uint32_t dst = sbuf + slot * kKvRowBytes + 16 * sub;
#pragma unroll
    for (int j = 0; j < kKvRowBytes / 128; ++j) cp_async_16(dst + 128 * j, src + 128 * j);
  }
}

__device__ __forceinline__ void store_cycles(unsigned long long* cycles, long long t0) {
  __syncthreads();
  if (threadIdx.x == 0) cycles[blockIdx.x] = static_cast<unsigned long long>(clock64() - t0);
}

// ---- host
// kSets sets of 64 distinct random rows (partial Fisher-Yates), the same for every benchmark.
inline std::vector<int> make_index_sets() {
  std::vector<int> sets(size_t{kSets} * kChunkRows);
  std::mt19937 rng(12345);
  std::vector<int> perm(kRows);
  for (int i = 0; i < kRows; ++i) perm[i] = i;
  for (int s = 0; s < kSets; ++s)
    for (int k = 0; k < kChunkRows; ++k) {
      const int j = k + int(rng() % unsigned(kRows - k));
      std::swap(perm[k], perm[j]);
      sets[size_t(s) * kChunkRows + k] = perm[k];
    }
  return sets;
}

struct Timed {
  int chunks = 0;      // per CTA, per launch
  double med_ms = 0;   // the median of the timed launches
};
// A test's launch(chunks) sized to ~target_ms (a warm-up launch, a two-step calibration from 32
// chunks, one untimed launch), then timed `reps` times by events: the median.
inline Timed time_calibrated(const std::function<void(int)>& launch, double target_ms,
                             int reps = 5) {
  launch(4);  // warm up (L2 residency, clocks)
  auto ms_of = [&](int n) { return time_ms([&] { launch(n); }); };
  auto size_for = [&](int n, float ms, double want) {
    return int(std::clamp(std::llround(n * want / std::max(ms, 1e-3f)), 32LL, 400000LL));
  };
  const int n1 = size_for(32, ms_of(32), target_ms / 8);
  const int chunks = size_for(n1, ms_of(n1), target_ms);
  launch(chunks);
  std::vector<float> ms(reps);
  for (int r = 0; r < reps; ++r) ms[r] = ms_of(chunks);
  std::sort(ms.begin(), ms.end());
  return {chunks, ms[reps / 2]};
}

// One test from a zeroed accumulator: time_calibrated, then the mean per-CTA cycles of its last
// timed launch (cycles[grid], written by each CTA).
struct ChunkRun {
  int chunks = 0;         // per CTA, per launch
  double med_ms = 0;      // the median launch time
  double mean_cyc = 0;    // per CTA, the last timed launch
  double total = 0;       // CTA-chunks per launch
  double clk_chunk = 0;   // mean cycles per chunk
};
inline ChunkRun run_chunks(const std::function<void(int)>& launch, double target_ms, float* acc,
                           size_t acc_bytes, const unsigned long long* cycles, int grid) {
  CK(cudaMemset(acc, 0, acc_bytes));
  const Timed tm = time_calibrated(launch, target_ms);
  ChunkRun r;
  r.chunks = tm.chunks;
  r.med_ms = tm.med_ms;
  r.mean_cyc = mean_cycles(cycles, grid);
  r.total = double(tm.chunks) * grid;
  r.clk_chunk = r.mean_cyc / tm.chunks;
  return r;
}

// The current device: its SM count, compute capability, L2 size and name.
struct Gpu {
  int dev = 0, sms = 0, major = 0, minor = 0, l2 = 0;
  cudaDeviceProp prop{};
};
inline Gpu query_gpu() {
  Gpu g;
  CK(cudaGetDevice(&g.dev));
  CK(cudaDeviceGetAttribute(&g.sms, cudaDevAttrMultiProcessorCount, g.dev));
  CK(cudaDeviceGetAttribute(&g.major, cudaDevAttrComputeCapabilityMajor, g.dev));
  CK(cudaDeviceGetAttribute(&g.minor, cudaDevAttrComputeCapabilityMinor, g.dev));
  CK(cudaDeviceGetAttribute(&g.l2, cudaDevAttrL2CacheSize, g.dev));
  CK(cudaGetDeviceProperties(&g.prop, g.dev));
  return g;
}

// The traffic's device buffers: the fp32 accumulator (acc_bytes), the bf16 kv rows (filled with
// 0x3c bytes), the kSets index sets (make_index_sets; h_idx keeps the host copy for the checks)
// and one cycle count per CTA.
struct TrafficBuffers {
  float* acc = nullptr;
  uint8_t* kv = nullptr;
  int* idx = nullptr;
  unsigned long long* cycles = nullptr;
  size_t acc_bytes = 0;
  std::vector<int> h_idx;
};
inline TrafficBuffers alloc_traffic(size_t acc_bytes, int grid) {
  TrafficBuffers b;
  b.acc_bytes = acc_bytes;
  const size_t kv_bytes = size_t{kRows} * kKvRowBytes;
  CK(cudaMalloc(&b.acc, acc_bytes));
  CK(cudaMalloc(&b.kv, kv_bytes));
  CK(cudaMalloc(&b.idx, size_t{kSets} * kChunkRows * sizeof(int)));
  CK(cudaMalloc(&b.cycles, size_t(grid) * sizeof(unsigned long long)));
  CK(cudaMemset(b.kv, 0x3c, kv_bytes));
  b.h_idx = make_index_sets();
  CK(cudaMemcpy(b.idx, b.h_idx.data(), b.h_idx.size() * sizeof(int), cudaMemcpyHostToDevice));
  return b;
}
inline void free_traffic(const TrafficBuffers& b) {
  CK(cudaFree(b.acc));
  CK(cudaFree(b.kv));
  CK(cudaFree(b.idx));
  CK(cudaFree(b.cycles));
}

