// Microbenchmark: the per-SM rate of the conversions and exponentials of the Hopper BSA
// backward's [3] and dS steps (bench/notes-archive, session 24): ex2.approx.ftz.f32 (MUFU.EX2),
// cvt.rn.bf16x2.f32 (F2FP.BF16.F32.PACK_AB), and the two mixed as in [3] (two exps per
// conversion). Not part of the library build:
//   nvcc -O3 -std=c++17 -arch=sm_90a -I bench/micro -o xu_rate bench/micro/xu_rate.cu
//   ./xu_rate
// One CTA of 256 threads (two warpgroups, as the backward's consumers) per SM; 16 independent
// chains per thread.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "check.cuh"

constexpr int kChains = 16;

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t cvt(float a, float b) {
  uint32_t r;
  asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(a), "f"(b));
  return r;
}

// kMode 0: exps only; 1: conversions only; 2: two exps per conversion.
template <int kMode>
__global__ void __launch_bounds__(256, 1) xu_rate(int iters, unsigned long long* cycles,
                                                   float* sink) {
  float v[kChains];
  for (int i = 0; i < kChains; ++i) v[i] = 0.001f * (threadIdx.x + i);
  uint32_t acc = 0;
  __syncthreads();
  const long long t0 = clock64();
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < kChains; ++i) {
      if (kMode == 0) v[i] = ex2(v[i]) * -0.5f;
      if (kMode == 1) acc ^= cvt(v[i], v[(i + 1) % kChains]);
      if (kMode == 2 && i % 2 == 0) {
        v[i] = ex2(v[i]) * -0.5f;
        v[i + 1] = ex2(v[i + 1]) * -0.5f;
        acc ^= cvt(v[i], v[i + 1]);
      }
    }
    if (kMode == 1) v[it % kChains] += __uint_as_float(acc & 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) cycles[blockIdx.x] = clock64() - t0;
  float s = __uint_as_float(acc);
  for (int i = 0; i < kChains; ++i) s += v[i];
  if (s == 12345.f) sink[blockIdx.x] = s;
}

template <int kMode>
void measure(const char* name, double ops_per_iter_thread, int sms, unsigned long long* cycles,
             float* sink) {
  const int iters = 8192;
  xu_rate<kMode><<<sms, 256>>>(iters, cycles, sink);
  xu_rate<kMode><<<sms, 256>>>(iters, cycles, sink);
  CK(cudaDeviceSynchronize());
  const double cyc = mean_cycles(cycles, sms);
  std::printf("%-40s %6.2f per clk per SM\n", name, 256.0 * iters * ops_per_iter_thread / cyc);
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  unsigned long long* cycles;
  float* sink;
  CK(cudaMalloc(&cycles, sms * sizeof(unsigned long long)));
  CK(cudaMalloc(&sink, sms * sizeof(float)));
  measure<0>("ex2.approx.ftz.f32 (+ FMUL)", kChains, sms, cycles, sink);
  measure<1>("cvt.rn.bf16x2.f32 (pairs)", kChains, sms, cycles, sink);
  measure<2>("2 ex2 + 1 cvt.bf16x2 (exps counted)", kChains, sms, cycles, sink);
  return 0;
}
