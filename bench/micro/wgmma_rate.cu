// Microbenchmark: the wgmma rate per SM for the shapes of the Hopper BSA backward, alone and with
// other shared-memory traffic beside it (bench/notes-archive, session 23). Not part of the library
// build:
//   nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -I<cutlass>/include \
//        -o wgmma_rate bench/micro/wgmma_rate.cu
//   ./wgmma_rate            (one table on stdout)
//
// One CTA per SM. Each of kWgs consumer warpgroups issues, in a loop, one GEMM of 64 x N x 64
// (four k-steps of 16) into its own accumulator, with two commit groups in flight, for `iters`
// iterations; A and B (bf16, K-major, 128-byte swizzle) sit in shared memory (SS) or A in
// registers (RS). The backward's [1], [2] and [7] are SS with N = 64, its [4] and [5] RS with
// N = 128 (D). An optional extra warpgroup stores 16-byte vectors to its own shared buffer
// without pause, standing in for the kernel's other shared-memory traffic (TMA writes of Q and
// dO, the dS exchange, the dQ staging and its bulk read). Reports dense FLOP per clock per SM
// (the H100/H200 peak is 4096 for bf16) and the stores' bytes per clock.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>

#include "check.cuh"
#include "wgmma_atom.cuh"

using Element = cute::bfloat16_t;
constexpr int kK = 64;  // the K extent of one GEMM (four k-steps)

// Shared memory: per consumer warpgroup A (64 x 64) and B (N x 64), then the storer's 16 KB.
template <int N>
constexpr int smem_bytes(int wgs) {
  return wgs * (64 + N) * kK * 2 + 16384 + 1024;
}

template <int N, bool RS, int kWgs, bool kStorer, bool kMN = false>
__global__ void __launch_bounds__(128 * (kWgs + 1), 1)
    wgmma_rate(int iters, unsigned long long* cycles, unsigned long long* stored, float* sink) {
  using namespace cute;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~uintptr_t(1023));
  // Warp-uniform in the compiler's view (a shuffle), so the wgmma paths are not "divergent".
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  __shared__ int done;  // consumer warpgroups finished (the storer stops then)
  if (threadIdx.x == 0) done = 0;
  // Zero everything once (the values do not matter; NaN-free inputs keep the sink finite), all
  // but the 1024 bytes of alignment slack.
  for (int i = threadIdx.x; i < (smem_bytes<N>(kWgs) - 1024) / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(0, 0, 0, 0);
  __syncthreads();
  const long long t0 = clock64();
  if (wg < kWgs) {
    Element* a_ptr = reinterpret_cast<Element*>(smem + wg * (64 + N) * kK * 2);
    Element* b_ptr = a_ptr + 64 * kK;
    using Atom = std::conditional_t<
        kMN,
        SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<SM90::GMMA::Major::MN, SM90::GMMA::Major::MN>,
        KMajorAtom<N, RS>>;
    using LayoutAtom = std::conditional_t<kMN, SM90::GMMA::Layout_MN_SW128_Atom<Element>,
                                          SM90::GMMA::Layout_K_SW128_Atom<Element>>;
    auto sA = make_tensor(make_smem_ptr(a_ptr),
                          tile_to_shape(LayoutAtom{}, cute::Shape<_64, Int<kK>>{}));
    auto sB = make_tensor(make_smem_ptr(b_ptr),
                          tile_to_shape(LayoutAtom{}, cute::Shape<Int<N>, Int<kK>>{}));
    auto mma = make_tiled_mma(Atom{});
    auto thr = mma.get_thread_slice(threadIdx.x % 128);
    auto tB = thr.partition_fragment_B(sB);
    auto acc = partition_fragment_C(mma, cute::Shape<_64, Int<N>>{});
    clear(acc);
    auto run = [&](auto& tA) {
      mma.accumulate_ = SM90::GMMA::ScaleOut::One;
      warpgroup_fence_operand(acc);
#pragma unroll 1
      for (int it = 0; it < iters; ++it) {  // two groups in flight, chained on one accumulator
        warpgroup_arrive();
        CUTE_UNROLL
        for (int kb = 0; kb < kK / 16; ++kb) gemm(mma, tA(_, _, kb), tB(_, _, kb), acc);
        warpgroup_commit_batch();
        warpgroup_wait<1>();
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc);
    };
    if constexpr (RS) {
      auto tA = make_tensor<Element>(partition_shape_A(mma, cute::Shape<_64, Int<kK>>{}));
      fill(tA, Element(0));
      warpgroup_fence_operand(tA);
      run(tA);
    } else {
      auto tA = thr.partition_fragment_A(sA);  // descriptors
      run(tA);
    }
    float s = 0;
    for (int i = 0; i < size(acc); ++i) s += acc(i);
    if (s != 0) sink[blockIdx.x] = s;  // never true; keeps the GEMMs
    if (threadIdx.x % 128 == 0) atomicAdd(&done, 1);
  } else if (kStorer) {
    // The storer: 16-byte stores over its 16 KB, conflict-free, until the consumers are done;
    // stored counts its bytes.
    uint4* buf = reinterpret_cast<uint4*>(smem + kWgs * (64 + N) * kK * 2);
    const int lane = threadIdx.x % 128;
    unsigned long long n = 0;
    uint4 v = make_uint4(lane, 1, 2, 3);
    while (*static_cast<volatile int*>(&done) < kWgs) {
#pragma unroll 8
      for (int r = 0; r < 8; ++r) {
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                         static_cast<uint32_t>(__cvta_generic_to_shared(buf + (r * 128 + lane)))),
                     "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                     : "memory");
      }
      n += 8 * 16;
    }
    if (lane == 0) atomicAdd(&stored[blockIdx.x], n * 128);
  }
  __syncthreads();
  if (threadIdx.x == 0) cycles[blockIdx.x] = clock64() - t0;
}

template <int N, bool RS, int kWgs, bool kStorer, bool kMN = false>
void measure(const char* name, int sms, unsigned long long* cycles, unsigned long long* stored,
             float* sink) {
  const int iters = 4096;
  auto kernel = wgmma_rate<N, RS, kWgs, kStorer, kMN>;
  const int smem = smem_bytes<N>(kWgs);
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int threads = 128 * (kWgs + 1);
  kernel<<<sms, threads, smem>>>(iters, cycles, stored, sink);  // warm-up
  CK(cudaMemset(stored, 0, sms * sizeof(unsigned long long)));
  const float ms = time_ms([&] { kernel<<<sms, threads, smem>>>(iters, cycles, stored, sink); });
  const double cyc = mean_cycles(cycles, sms);
  const double flop = double(kWgs) * iters * 2.0 * 64 * N * kK;
  const double st = mean_cycles(stored, sms);
  std::printf("%-34s %8.1f FLOP/clk/SM (%5.1f%% of 4096) %7.1f TFLOPS  stores %5.1f B/clk\n",
              name, flop / cyc, 100.0 * flop / cyc / 4096, flop * sms / (ms * 1e-3) / 1e12,
              st / cyc);
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  unsigned long long *cycles, *stored;
  float* sink;
  CK(cudaMalloc(&cycles, sms * sizeof(unsigned long long)));
  CK(cudaMalloc(&stored, sms * sizeof(unsigned long long)));
  CK(cudaMalloc(&sink, sms * sizeof(float)));
  CK(cudaMemset(stored, 0, sms * sizeof(unsigned long long)));
  measure<64, false, 2, false>("SS 64x64x64, 2 WGs", sms, cycles, stored, sink);
  measure<64, false, 1, false>("SS 64x64x64, 1 WG", sms, cycles, stored, sink);
  measure<128, false, 2, false>("SS 64x128x64, 2 WGs", sms, cycles, stored, sink);
  measure<256, false, 2, false>("SS 64x256x64, 2 WGs", sms, cycles, stored, sink);
  measure<128, true, 2, false>("RS 64x128x64, 2 WGs", sms, cycles, stored, sink);
  measure<64, true, 2, false>("RS 64x64x64, 2 WGs", sms, cycles, stored, sink);
  measure<64, false, 2, false, true>("SS 64x64x64 MN-major, 2 WGs", sms, cycles, stored, sink);
  measure<64, false, 2, true>("SS 64x64x64, 2 WGs + storer", sms, cycles, stored, sink);
  measure<128, true, 2, true>("RS 64x128x64, 2 WGs + storer", sms, cycles, stored, sink);
  measure<256, false, 2, true>("SS 64x256x64, 2 WGs + storer", sms, cycles, stored, sink);
  return 0;
}
