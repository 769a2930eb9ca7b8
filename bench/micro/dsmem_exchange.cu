// Microbenchmark: the cost of exchanging dKV piece halves between the two CTAs of a cluster, for
// the DSA backward's head-group sum at H 128 (bench/notes-archive, session 18). Not part of the
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
// Depth 1 is session 18's synchronous exchange; depths 2 and 4 let the sends run ahead of the
// receives (session 21).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

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

// kDepth receive buffers per warpgroup: the sender runs up to kDepth - 1 pieces ahead of its
// own receives (kDepth 1: the synchronous exchange of session 18; deeper: the pipelined exchange
// a head-group sum would need, piece p + 1 sent while piece p is added).
template <int kDepth>
struct Smem {
  float4 recv[kDepth][2][4][128];  // [slot][warpgroup]: 4 float4 per thread, [i][thread] (8 KB)
  float4 stage[kDepth][2][4][128];  // kBulk: the local copy each bulk send reads
  uint64_t full[kDepth][2];        // this CTA's buffer holds the partner's half (1 + 8192 bytes)
  uint64_t empty[kDepth][2];       // the partner's buffer is free (4 remote arrivals, one per warp)
};

// kBulk: instead of per-thread st.async, the warpgroup writes its half into a local staging
// buffer (st.shared), and one thread sends the 8 KB with one cp.async.bulk (shared::cta to
// shared::cluster, complete_tx on the partner's barrier); the staging slot is rewritten only
// after that copy has read it (wait_group.read).
template <int kWgs, int kDepth, bool kBulk>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(128 * kWgs, 1)
    exchange_kernel(int iters, int work, float* sink, unsigned long long* cycles) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem<kDepth>& s = *reinterpret_cast<Smem<kDepth>*>(smem_raw);
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128, lane = threadIdx.x % 32;
  const uint32_t partner = cluster_rank() ^ 1;
  if (threadIdx.x == 0) {
    for (int d = 0; d < kDepth; ++d)
      for (int w = 0; w < 2; ++w) {
        mbar_init(smem_u32(&s.full[d][w]), 1);
        mbar_init(smem_u32(&s.empty[d][w]), 4);
      }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync();
  float acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = threadIdx.x * 0.001f + i;
  // Receive (and add) piece r: wait for its buffer, add, free the partner's copy of the slot.
  auto receive = [&](int r) {
    const int slot = r % kDepth;
    mbar_wait_cluster(smem_u32(&s.full[slot][wg]), (r / kDepth) & 1);
    for (int i = 0; i < 4; ++i) {
      const float4 v = s.recv[slot][wg][i][t];
      acc[4 * i] += v.x, acc[4 * i + 1] += v.y, acc[4 * i + 2] += v.z, acc[4 * i + 3] += v.w;
    }
    __syncwarp();
    if (lane == 0) mbar_arrive_remote(mapa(smem_u32(&s.empty[slot][wg]), partner));
  };
  const unsigned long long t0 = clock64();
  if (work < 0) {  // the FMA work alone
    for (int it = 0; it < iters; ++it)
      for (int k = 0; k < -work; ++k)
        for (int i = 0; i < 16; ++i) acc[i] = fmaf(acc[i], 0.999f, 0.001f);
    iters = 0;
  }
  for (int it = 0; it < iters; ++it) {
    // Depth >= 2: receive piece it - (depth - 1) before sending piece it, so that the remote
    // arrive's release (cluster scope) does not wait for this iteration's own sends.
    if (kDepth > 1 && it >= kDepth - 1) receive(it - (kDepth - 1));
    const int slot = it % kDepth;
    const uint32_t parity = (it / kDepth) & 1;
    if (t == 0) mbar_expect_tx(smem_u32(&s.full[slot][wg]), 8192);
    // The partner's buffer is free: its previous contents were read (the first round is free).
    if (it >= kDepth) mbar_wait_cluster(smem_u32(&s.empty[slot][wg]), parity ^ 1);
    const uint32_t remote_full = mapa(smem_u32(&s.full[slot][wg]), partner);
    if constexpr (kBulk) {
      // The bulk copy of round it - kDepth from this slot has read it.
      if (t == 0) asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kDepth - 1) : "memory");
      asm volatile("bar.sync %0, 128;" ::"r"(wg + 1) : "memory");
      for (int i = 0; i < 4; ++i)
        s.stage[slot][wg][i][t] =
            make_float4(acc[4 * i] * 0.5f, acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      asm volatile("bar.sync %0, 128;" ::"r"(wg + 1) : "memory");
      if (t == 0) {
        asm volatile(
            "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], "
            "8192, [%2];" ::"r"(mapa(smem_u32(&s.recv[slot][wg][0][0]), partner)),
            "r"(smem_u32(&s.stage[slot][wg][0][0])), "r"(remote_full)
            : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      }
    } else {
      const uint32_t remote_recv = mapa(smem_u32(&s.recv[slot][wg][0][t]), partner);
      for (int i = 0; i < 4; ++i)
        st_async_v4(remote_recv + i * 128 * 16,
                    make_float4(acc[4 * i] * 0.5f, acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]),
                    remote_full);
    }
    if (kDepth == 1) receive(it);
    for (int k = 0; k < work; ++k)
      for (int i = 0; i < 16; ++i) acc[i] = fmaf(acc[i], 0.999f, 0.001f);
  }
  for (int r = iters - (kDepth - 1); r > 0 && r < iters; ++r) receive(r);
  if constexpr (kBulk) {
    if (t == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
  const unsigned long long t1 = clock64();
  float sum = 0;
  for (int i = 0; i < 16; ++i) sum += acc[i];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = sum;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  // The partner's last remote arrive on this CTA's barrier must land before this CTA exits.
  cluster_sync();
}

template <int kWgs, int kDepth, bool kBulk = false>
void run(int sms, int iters, int work, float* sink, unsigned long long* cycles) {
  const int grid = sms / 2 * 2;
  auto* kernel = &exchange_kernel<kWgs, kDepth, kBulk>;
  const int smem = static_cast<int>(sizeof(Smem<kDepth>));
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<grid, 128 * kWgs, smem>>>(10, work, sink, cycles);
  CK(cudaDeviceSynchronize());
  const float ms =
      time_ms([&] { kernel<<<grid, 128 * kWgs, smem>>>(iters, work, sink, cycles); });
  const double mean = mean_cycles(cycles, grid);
  // Bytes sent per CTA per iteration: 8 KB per warpgroup.
  const double bytes = double(grid) * iters * 8192.0 * kWgs;
  std::printf("%s wgs %d depth %d work %4d  %8.3f ms  %7.1f clk per exchange  %6.2f TB/s over the "
              "GPU  %5.1f B/clk per SM sent\n",
              kBulk ? "bulk  " : "stasync", kWgs, kDepth, work, ms, mean / iters, bytes / ms / 1e9,
              8192.0 * kWgs * iters / mean);
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* sink = nullptr;
  unsigned long long* cycles = nullptr;
  CK(cudaMalloc(&sink, sms * 256 * sizeof(float)));
  CK(cudaMalloc(&cycles, sms * sizeof(unsigned long long)));
  const int iters = 20000;
  // work = -1: the FMA work alone (no exchange), the baseline of the overlap.
  for (int work : {0, 64, 256}) {
    run<1, 1>(sms, iters, work, sink, cycles);
    run<2, 1>(sms, iters, work, sink, cycles);
    run<1, 4>(sms, iters, work, sink, cycles);
    run<2, 4>(sms, iters, work, sink, cycles);
    run<1, 2, true>(sms, iters, work, sink, cycles);
    run<2, 2, true>(sms, iters, work, sink, cycles);
    run<1, 4, true>(sms, iters, work, sink, cycles);
    run<2, 4, true>(sms, iters, work, sink, cycles);
    if (work > 0) run<2, 1, false>(sms, iters, -work, sink, cycles);
  }
  return 0;
}
