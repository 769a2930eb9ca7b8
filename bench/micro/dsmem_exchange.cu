// Microbenchmark: the cost of exchanging dKV piece halves between the two CTAs of a cluster, for
// the DSA backward's head-group sum at H 128 (bench/NOTES.md, session 18). Not part of the
// library build:
//   nvcc -O3 -std=c++17 -arch=sm_90a -o dsmem_exchange bench/micro/dsmem_exchange.cu
//   ./dsmem_exchange            (one table on stdout)
//
// Clusters of 2 CTAs, one per SM, each with W warpgroups (1 or 2). Per iteration, warpgroup w of
// each CTA sends 8 KB (its 128 threads' 16 fp32 each: half of a 64 x 64 fp32 piece) into its
// partner's receive buffer with st.async (complete_tx on the partner's full barrier), waits for
// the partner's 8 KB in its own buffer, adds it into registers, and frees the buffer (one remote
// arrive per warp on the partner's empty barrier). Optionally `work` FMAs per thread between
// iterations stand in for the piece's other work. Reported: cycles per exchange (one piece).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.cuh"

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t mapa(uint32_t addr, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait_cluster(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], "
      "%1;\n @!p bra W;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive_remote(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote_bar)
               : "memory");
}
__device__ __forceinline__ void st_async_v4(uint32_t remote_addr, float4 v, uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, "
      "[%5];" ::"r"(remote_addr),
      "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(remote_bar)
      : "memory");
}

struct Smem {
  float4 recv[2][4][128];  // per warpgroup: 4 float4 per thread, [i][thread] (8 KB)
  uint64_t full[2];        // this CTA's buffer w holds the partner's half (1 arrival + 8192 bytes)
  uint64_t empty[2];       // the partner's buffer w is free (4 remote arrivals, one per warp)
};

template <int kWgs>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(128 * kWgs, 1)
    exchange_kernel(int iters, int work, float* sink, unsigned long long* cycles) {
  __shared__ Smem s;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128, lane = threadIdx.x % 32;
  const uint32_t partner = cluster_rank() ^ 1;
  if (threadIdx.x == 0) {
    for (int w = 0; w < 2; ++w) {
      mbar_init(smem_u32(&s.full[w]), 1);
      mbar_init(smem_u32(&s.empty[w]), 4);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync();
  const uint32_t remote_recv = mapa(smem_u32(&s.recv[wg][0][t]), partner);
  const uint32_t remote_full = mapa(smem_u32(&s.full[wg]), partner);
  const uint32_t remote_empty = mapa(smem_u32(&s.empty[wg]), partner);
  float acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = threadIdx.x * 0.001f + i;
  const unsigned long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    const uint32_t parity = it & 1;
    if (t == 0) mbar_expect_tx(smem_u32(&s.full[wg]), 8192);
    // The partner's buffer is free: its previous contents were read (the first one is free).
    if (it > 0) mbar_wait_cluster(smem_u32(&s.empty[wg]), parity ^ 1);
    for (int i = 0; i < 4; ++i)
      st_async_v4(remote_recv + i * 128 * 16,
                  make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]),
                  remote_full);
    mbar_wait_cluster(smem_u32(&s.full[wg]), parity);
    for (int i = 0; i < 4; ++i) {
      const float4 v = s.recv[wg][i][t];
      acc[4 * i] += v.x, acc[4 * i + 1] += v.y, acc[4 * i + 2] += v.z, acc[4 * i + 3] += v.w;
    }
    __syncwarp();
    if (lane == 0) mbar_arrive_remote(remote_empty);
    for (int k = 0; k < work; ++k)
      for (int i = 0; i < 16; ++i) acc[i] = fmaf(acc[i], 0.999f, 0.001f);
  }
  const unsigned long long t1 = clock64();
  float sum = 0;
  for (int i = 0; i < 16; ++i) sum += acc[i];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = sum;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  // The partner's last remote arrive on this CTA's barrier must land before this CTA exits.
  cluster_sync();
}

template <int kWgs>
void run(int sms, int iters, int work, float* sink, unsigned long long* cycles) {
  const int grid = sms / 2 * 2;
  exchange_kernel<kWgs><<<grid, 128 * kWgs>>>(10, work, sink, cycles);
  CK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a));
  exchange_kernel<kWgs><<<grid, 128 * kWgs>>>(iters, work, sink, cycles);
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  CK(cudaGetLastError());
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  std::vector<unsigned long long> cyc(grid);
  CK(cudaMemcpy(cyc.data(), cycles, grid * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  double mean = 0;
  for (auto x : cyc) mean += double(x) / grid;
  // Bytes sent per CTA per iteration: 8 KB per warpgroup.
  const double bytes = double(grid) * iters * 8192.0 * kWgs;
  std::printf("wgs %d work %4d  %8.3f ms  %7.1f clk per exchange  %6.2f TB/s over the GPU  "
              "%5.1f B/clk per SM sent\n",
              kWgs, work, ms, mean / iters, bytes / ms / 1e9, 8192.0 * kWgs * iters / mean);
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* sink = nullptr;
  unsigned long long* cycles = nullptr;
  CK(cudaMalloc(&sink, sms * 256 * sizeof(float)));
  CK(cudaMalloc(&cycles, sms * sizeof(unsigned long long)));
  const int iters = 20000;
  for (int work : {0, 64, 256}) {
    run<1>(sms, iters, work, sink, cycles);
    run<2>(sms, iters, work, sink, cycles);
  }
  return 0;
}
