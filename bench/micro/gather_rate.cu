// Microbenchmark: the rate of the DSA kernels' kv row gather (bench/notes-archive, session 21): is
// it bound by the bytes in flight per SM (latency) or by a throughput cap? Not part of the
// library build:
//   nvcc -O3 -std=c++17 -arch=sm_90a -o gather_rate bench/micro/gather_rate.cu
//   ./gather_rate            (one table on stdout)
//
// One CTA per SM gathers "chunks" like the DSA kernels': 64 random rows of a 4096 x 576 bf16 kv
// buffer (4.7 MB, L2-resident), 1152 bytes each, with 16-byte cp.async (8 lanes per row, as
// gather_row), into a ring of kBufs chunk buffers in shared memory: chunk i into buffer i %
// kBufs, then cp.async.wait_group(kBufs - 1), so that kBufs chunks are in flight per thread.
// The issuing threads are kWarps warps. Reported: bytes per clock per SM and TB/s over the GPU.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "check.cuh"

constexpr int kRows = 4096, kRowBytes = 1152, kChunkRows = 64;
constexpr int kChunkBytes = kChunkRows * kRowBytes;  // 73,728

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

template <int kBufs, int kWarps>
__global__ void __launch_bounds__(32 * kWarps, 1)
    gather_kernel(const uint8_t* kv, const int32_t* idx, int chunks, unsigned long long* cycles) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int kRowsPerWarp = kChunkRows / kWarps;
  const unsigned long long t0 = clock64();
  for (int c = 0; c < chunks; ++c) {
    const uint32_t buf = smem_u32(smem + (c % kBufs) * kChunkBytes);
    const int32_t* rows = idx + ((blockIdx.x * 977 + c * 131) % 4096 / 64) * 64;
    for (int r4 = 0; r4 < kRowsPerWarp; r4 += 4) {
      const int row = warp * kRowsPerWarp + r4 + lane / 8;
      const uint8_t* src = kv + static_cast<int64_t>(rows[row]) * kRowBytes + (lane % 8) * 16;
      const uint32_t dst = buf + row * kRowBytes + (lane % 8) * 16;
#pragma unroll
      for (int k = 0; k < kRowBytes / 128; ++k) cp_async_16(dst + 128 * k, src + 128 * k);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group %0;" ::"n"(kBufs - 1) : "memory");
    __syncthreads();  // the ring's next buffer is free for every thread
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  const unsigned long long t1 = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int kBufs, int kWarps>
void run(int sms, const uint8_t* kv, const int32_t* idx, unsigned long long* cycles) {
  const int chunks = 4000;
  auto* kernel = &gather_kernel<kBufs, kWarps>;
  const int smem = kBufs * kChunkBytes;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<sms, 32 * kWarps, smem>>>(kv, idx, 20, cycles);
  CK(cudaDeviceSynchronize());
  const float ms = time_ms([&] { kernel<<<sms, 32 * kWarps, smem>>>(kv, idx, chunks, cycles); });
  const double mean = mean_cycles(cycles, sms);
  const double bytes = double(sms) * chunks * kChunkBytes;
  std::printf("buffers %d warps %d SMs %3d  %7.3f ms  %6.0f clk per chunk  %5.2f TB/s  %5.1f "
              "B/clk per SM\n",
              kBufs, kWarps, sms, ms, mean / chunks, bytes / ms / 1e9,
              double(chunks) * kChunkBytes / mean);
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  uint8_t* kv = nullptr;
  int32_t* idx = nullptr;
  unsigned long long* cycles = nullptr;
  CK(cudaMalloc(&kv, size_t{kRows} * kRowBytes));
  CK(cudaMemset(kv, 1, size_t{kRows} * kRowBytes));
  std::vector<int32_t> h(kRows);
  uint32_t x = 12345;
  for (int i = 0; i < kRows; ++i) h[i] = i;
  for (int i = kRows - 1; i > 0; --i) {  // a random permutation: each chunk 64 distinct rows
    x = x * 1664525u + 1013904223u;
    std::swap(h[i], h[x % (i + 1)]);
  }
  CK(cudaMalloc(&idx, kRows * sizeof(int32_t)));
  CK(cudaMemcpy(idx, h.data(), kRows * sizeof(int32_t), cudaMemcpyHostToDevice));
  CK(cudaMalloc(&cycles, sms * sizeof(unsigned long long)));
  for (int s : {sms, sms / 2}) {
    run<1, 4>(s, kv, idx, cycles);
    run<2, 4>(s, kv, idx, cycles);
    run<3, 4>(s, kv, idx, cycles);
    run<2, 8>(s, kv, idx, cycles);
    run<3, 8>(s, kv, idx, cycles);
  }
  return 0;
}
