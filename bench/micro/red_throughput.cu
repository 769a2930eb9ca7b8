// Microbenchmark: fp32 reduction throughput into L2-resident rows, per SM and over the GPU, for the
// DSA backward's dkv reductions (bench/notes-archive, session 18). Not part of the library build:
//   nvcc -O3 -std=c++17 -arch=sm_90a -o red_throughput bench/micro/red_throughput.cu
//   ./red_throughput            (one table on stdout)
//
// Each CTA (one per SM, 256 threads) reduces "chunks" like the DSA backward's: 64 random rows of a
// 4096 x 576 fp32 buffer (9.4 MB, L2-resident), all 576 columns (147 KB per chunk), in 9 pieces of
// 64 rows x 64 columns. Modes:
//   v2row   red.global.add.v2.f32, one row's 256 bytes per warp instruction
//   v2row2  red.v2, 2 rows x 128 bytes per warp instruction (the kernel's layout since session 18);
//           also with only 4 of the 8 warps reducing (the role split's warpgroup 1 alone)
//   v2frag  red.v2 in the wgmma fragment order: 8 rows x 32 bytes per warp instruction
//   v4row   red.global.add.v4.f32, 2 rows x 256 bytes per warp instruction
//   bulkN   cp.reduce.async.bulk.global.shared::cta.add.f32 from N staging tiles of 16 KB (one
//           piece each, rewritten with st.shared before each use; lanes 0-7 of each warp issue
//           one 256-byte row each), the tile reused after wait_group.read
// and each runs on all SMs and on half of them (is the limit per SM or in the L2?); v2row and
// v4row also with two CTAs per SM.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.cuh"

constexpr int kRows = 4096, kCols = 576, kPanels = 9, kThreads = 256;

enum Mode { kV2Row = 0, kV2Frag = 1, kV4Row = 2, kBulk = 3, kV2Row2 = 4 };

__device__ __forceinline__ void red_v2(float* a, float x, float y) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(a), "f"(x), "f"(y) : "memory");
}
__device__ __forceinline__ void red_v4(float* a, float x, float y, float z, float w) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(a), "f"(x), "f"(y), "f"(z),
               "f"(w)
               : "memory");
}
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <int kMode, int kTiles, int kActive = 8>
__global__ void __launch_bounds__(kThreads, 1)
    red_kernel(float* dst, const int32_t* idx, int chunks, unsigned long long* cycles) {
  extern __shared__ __align__(128) float tiles[];  // kTiles x 64 x 64 (bulk only)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned long long t0 = clock64();
  const float val = 1.0f / (1 + blockIdx.x);
  int piece = 0;
  for (int c = 0; c < chunks; ++c) {
    const int32_t* rows = idx + ((blockIdx.x * 7919 + c * 64) % (kRows * 16 - 64));
    for (int panel = 0; panel < kPanels; ++panel, ++piece) {
      if constexpr (kMode == kV2Row2) {
        // the active warps split the piece's 64 rows; per instruction rows 2 k, 2 k + 1 of the
        // warp's (lanes 0-15, 16-31), 128 bytes each
        constexpr int kWarpRows = 64 / kActive;
        if (warp < kActive) {
#pragma unroll
          for (int k = 0; k < kWarpRows / 2; ++k) {
            const int j = rows[kWarpRows * warp + 2 * k + lane / 16];
            red_v2(dst + int64_t{j} * kCols + 64 * panel + 2 * (lane % 16), val, val);
            red_v2(dst + int64_t{j} * kCols + 64 * panel + 32 + 2 * (lane % 16), val, val);
          }
        }
      } else if constexpr (kMode == kV2Row) {
        // warp w: rows 8 w .. 8 w + 7, one instruction per row
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const int j = rows[8 * warp + k];
          red_v2(dst + int64_t{j} * kCols + 64 * panel + 2 * lane, val, val);
        }
      } else if constexpr (kMode == kV2Frag) {
        // lane (g, q): rows 8 w + g; per instruction 8 rows x 8 bytes x 4 lanes
        const int j = rows[8 * warp + lane / 4];
#pragma unroll
        for (int b = 0; b < 8; ++b)
          red_v2(dst + int64_t{j} * kCols + 64 * panel + 8 * b + 2 * (lane % 4), val, val);
      } else if constexpr (kMode == kV4Row) {
        // per instruction: 2 rows x 64 columns (lanes 0-15 row a, 16-31 row b)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int j = rows[8 * warp + 2 * k + lane / 16];
          red_v4(dst + int64_t{j} * kCols + 64 * panel + 4 * (lane % 16), val, val, val, val);
        }
      } else {
        const int t = piece % kTiles;
        float* tile = tiles + t * 64 * 64;
        // The tile's previous bulk reductions have read it (each issuing lane waits for its own
        // groups), then everyone rewrites it.
        if (lane < 8)
          asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kTiles - 1) : "memory");
        __syncthreads();
#pragma unroll
        for (int e = 0; e < 16; ++e) tile[e * kThreads + threadIdx.x] = val;
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        if (lane < 8) {
          const int r = 8 * warp + lane;
          const int j = rows[r];
          asm volatile(
              "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], 256;" ::"l"(
                  dst + int64_t{j} * kCols + 64 * panel),
              "r"(smem_u32(tile + r * 64))
              : "memory");
          asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        }
      }
    }
  }
  if constexpr (kMode == kBulk) {
    if (lane < 8) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) cycles[blockIdx.x] = clock64() - t0;
}

template <int kMode, int kTiles = 1, int kActive = 8>
void run(const char* name, float* dst, const int32_t* idx, int grid, int chunks,
         unsigned long long* cycles, int sms) {
  const size_t smem = kMode == kBulk ? size_t{kTiles} * 64 * 64 * 4 : 0;
  auto* k = &red_kernel<kMode, kTiles, kActive>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  k<<<grid, kThreads, smem>>>(dst, idx, 4, cycles);  // warm-up
  CK(cudaDeviceSynchronize());
  float best = 1e30f;
  for (int rep = 0; rep < 3; ++rep)
    best = std::min(best, time_ms([&] { k<<<grid, kThreads, smem>>>(dst, idx, chunks, cycles); }));
  const double mean = mean_cycles(cycles, grid);
  const double bytes = double(grid) * chunks * 64.0 * kCols * 4.0;
  const double per_sm_clk = double(chunks) * 64 * kCols * 4 / mean;
  std::printf("%-8s grid %3d/%d  %8.3f ms  %6.2f TB/s  %5.1f B/clk/CTA  %7.0f clk/chunk\n", name,
              grid, sms, best, bytes / best / 1e9, per_sm_clk, mean / chunks);
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* dst = nullptr;
  int32_t* idx = nullptr;
  unsigned long long* cycles = nullptr;
  CK(cudaMalloc(&dst, size_t{kRows} * kCols * 4));
  CK(cudaMemset(dst, 0, size_t{kRows} * kCols * 4));
  const int n_idx = kRows * 16;
  std::vector<int32_t> h(n_idx);
  uint64_t s = 88172645463325252ull;
  for (auto& x : h) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    x = static_cast<int32_t>(s % kRows);
  }
  CK(cudaMalloc(&idx, n_idx * 4));
  CK(cudaMemcpy(idx, h.data(), n_idx * 4, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&cycles, 2 * sms * sizeof(unsigned long long)));  // up to two CTAs per SM
  const int chunks = 600;
  for (int grid : {sms, sms / 2}) {
    run<kV2Row2>("v2row2", dst, idx, grid, chunks, cycles, sms);
    run<kV2Row2, 1, 4>("v2row2w4", dst, idx, grid, chunks, cycles, sms);
    run<kV2Row>("v2row", dst, idx, grid, chunks, cycles, sms);
    run<kV2Frag>("v2frag", dst, idx, grid, chunks, cycles, sms);
    run<kV4Row>("v4row", dst, idx, grid, chunks, cycles, sms);
    run<kBulk, 2>("bulk2", dst, idx, grid, chunks, cycles, sms);
    run<kBulk, 4>("bulk4", dst, idx, grid, chunks, cycles, sms);
    run<kBulk, 8>("bulk8", dst, idx, grid, chunks, cycles, sms);
    run<kBulk, 13>("bulk13", dst, idx, grid, chunks, cycles, sms);
  }
  // Two CTAs per SM (16 warps issuing): is one CTA's rate bound by its own latency?
  run<kV2Row>("v2row", dst, idx, 2 * sms, chunks, cycles, sms);
  run<kV4Row>("v4row", dst, idx, 2 * sms, chunks, cycles, sms);
  return 0;
}
