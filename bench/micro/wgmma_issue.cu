// Microbenchmark: how long a warpgroup is held at the issue of one SS GEMM of 64 x 64 x 128 (eight
// k-steps of 16: the Hopper BSA backward's [1], [2] and [7]), against how long the GEMM takes,
// with the tensor pipe idle, busy with the same warpgroup's previous GEMM, or shared with a
// second warpgroup; then the queue's depth (n k-steps of N 64 / 80 / 128 / 256, SS and RS) on an
// idle pipe (bench/notes-archive, session 24). Not part of the library build:
//   nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -I<cutlass>/include \
//        -I bench/micro -o wgmma_issue bench/micro/wgmma_issue.cu
//   ./wgmma_issue            (one table on stdout)
//
// One CTA per SM. Per iteration, thread 0 of each warpgroup reads clock64 before the GEMM's
// wgmma.fence, after its commit (the issue) and after wait_group 0 (the completion). If the
// issue takes about as long as the GEMM, the warpgroup cannot do other work while its GEMM runs.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

// N not a power of two (64 x 80): CuTe's extended wgmma shapes, in its selectors too.
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>

#include "check.cuh"
#include "wgmma_atom.cuh"

using Element = cute::bfloat16_t;
constexpr int kK = 128;
constexpr int kSmemPerWg = (64 + 256) * kK * 2;  // A (64 x 128) and B (up to 256 x 128)

// kSteps k-steps of 64 x N x 16 per GEMM (the k-steps cycle over the 8 of the tiles), A from
// shared memory or (kRS) registers. kBehind: a first GEMM of eight k-steps is issued (and
// committed) right before the timed one, so the timed issue finds the queue full.
template <int kWgs, bool kBehind, int N = 64, int kSteps = 8, bool kRS = false>
__global__ void __launch_bounds__(128 * kWgs, 1)
    wgmma_issue(int iters, unsigned long long* out, float* sink) {
  using namespace cute;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~uintptr_t(1023));
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  for (int i = threadIdx.x; i < kWgs * kSmemPerWg / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(0, 0, 0, 0);
  __syncthreads();
  Element* a_ptr = reinterpret_cast<Element*>(smem + wg * kSmemPerWg);
  auto layout = tile_to_shape(SM90::GMMA::Layout_K_SW128_Atom<Element>{}, Shape<_64, Int<kK>>{});
  auto sA = make_tensor(make_smem_ptr(a_ptr), layout);
  auto sB = make_tensor(
      make_smem_ptr(a_ptr + 64 * kK),
      tile_to_shape(SM90::GMMA::Layout_K_SW128_Atom<Element>{}, Shape<Int<N>, Int<kK>>{}));
  auto mma = make_tiled_mma(KMajorAtom<N, kRS>{});
  auto thr = mma.get_thread_slice(threadIdx.x % 128);
  auto tA = [&] {
    if constexpr (kRS) {
      auto r = make_tensor<Element>(partition_shape_A(mma, Shape<_64, Int<kK>>{}));
      fill(r, Element(0));
      warpgroup_fence_operand(r);
      return r;
    } else {
      return thr.partition_fragment_A(sA);
    }
  }();
  auto tB = thr.partition_fragment_B(sB);
  auto acc0 = partition_fragment_C(mma, Shape<_64, Int<N>>{});
  auto acc1 = partition_fragment_C(mma, Shape<_64, Int<N>>{});
  if constexpr (kBehind) clear(acc0);
  clear(acc1);
  unsigned long long issue = 0, total = 0;
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    if constexpr (kBehind) {
      warpgroup_fence_operand(acc0);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int kb = 0; kb < kK / 16; ++kb) gemm(mma, tA(_, _, kb), tB(_, _, kb), acc0);
      warpgroup_commit_batch();
    }
    const long long t0 = clock64();
    warpgroup_fence_operand(acc1);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int kb = 0; kb < kSteps; ++kb) gemm(mma, tA(_, _, kb % 8), tB(_, _, kb % 8), acc1);
    warpgroup_commit_batch();
    const long long t1 = clock64();
    warpgroup_wait<0>();
    if constexpr (kBehind) warpgroup_fence_operand(acc0);
    warpgroup_fence_operand(acc1);
    const long long t2 = clock64();
    issue += t1 - t0;
    total += t2 - t0;
  }
  float s = 0;
  for (int i = 0; i < size(acc1); ++i) s += (kBehind ? acc0(i) : 0.f) + acc1(i);
  if (s != 0) sink[blockIdx.x] = s;  // never true; keeps the GEMMs
  if (threadIdx.x % 128 == 0) {
    atomicAdd(&out[2 * wg], issue);
    atomicAdd(&out[2 * wg + 1], total);
  }
}

template <int kWgs, bool kBehind, int N = 64, int kSteps = 8, bool kRS = false>
void measure(const char* name, int sms, unsigned long long* out, float* sink) {
  const int iters = 2048;
  auto kernel = wgmma_issue<kWgs, kBehind, N, kSteps, kRS>;
  const int smem = kWgs * kSmemPerWg + 1024;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<sms, 128 * kWgs, smem>>>(iters, out, sink);  // warm-up
  CK(cudaMemset(out, 0, 4 * sizeof(unsigned long long)));
  kernel<<<sms, 128 * kWgs, smem>>>(iters, out, sink);
  CK(cudaDeviceSynchronize());
  unsigned long long h[4];
  CK(cudaMemcpy(h, out, sizeof(h), cudaMemcpyDeviceToHost));
  const double n = double(iters) * sms;
  std::printf("%-44s issue %7.1f clk, issue to completion %7.1f clk (per WG, mean of %d WGs)\n",
              name, (h[0] + (kWgs > 1 ? h[2] : 0)) / n / kWgs,
              (h[1] + (kWgs > 1 ? h[3] : 0)) / n / kWgs, kWgs);
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  unsigned long long* out;
  float* sink;
  CK(cudaMalloc(&out, 4 * sizeof(unsigned long long)));
  CK(cudaMalloc(&sink, sms * sizeof(float)));
  std::printf("SS 64x64x128 (8 k-steps; 256 clk of pipe at the dense peak)\n");
  measure<1, false>("1 WG, pipe idle", sms, out, sink);
  measure<1, true>("1 WG, behind its own 64x64x128", sms, out, sink);
  measure<2, false>("2 WGs at once, pipe otherwise idle", sms, out, sink);
  measure<2, true>("2 WGs at once, each behind its own", sms, out, sink);
  // The queue's depth: one warpgroup, pipe idle, n k-steps in one group (32 / 64 / 128 clk each
  // at N = 64 / 128 / 256). The issue stays short while the k-steps fit the queue.
  std::printf("queue depth: one WG, pipe idle, n k-steps of 64 x N x 16\n");
  measure<1, false, 64, 4>("N 64, 4 steps", sms, out, sink);
  measure<1, false, 64, 12>("N 64, 12 steps", sms, out, sink);
  measure<1, false, 64, 16>("N 64, 16 steps", sms, out, sink);
  measure<1, false, 64, 24>("N 64, 24 steps", sms, out, sink);
  measure<1, false, 64, 32>("N 64, 32 steps", sms, out, sink);
  measure<1, false, 80, 8>("N 80, 8 steps", sms, out, sink);
  measure<1, false, 80, 16>("N 80, 16 steps", sms, out, sink);
  measure<2, false, 80, 8>("N 80, 8 steps, 2 WGs at once", sms, out, sink);
  measure<1, false, 128, 4>("N 128, 4 steps", sms, out, sink);
  measure<1, false, 128, 8>("N 128, 8 steps", sms, out, sink);
  measure<1, false, 128, 16>("N 128, 16 steps", sms, out, sink);
  measure<1, false, 256, 4>("N 256, 4 steps", sms, out, sink);
  measure<1, false, 256, 8>("N 256, 8 steps", sms, out, sink);
  measure<1, false, 256, 16>("N 256, 16 steps", sms, out, sink);
  std::printf("A from registers (RS): the backward's [4] and [5] are RS 64 x 128\n");
  measure<1, false, 128, 4, true>("RS N 128, 4 steps", sms, out, sink);
  measure<1, false, 128, 8, true>("RS N 128, 8 steps", sms, out, sink);
  measure<1, false, 128, 16, true>("RS N 128, 16 steps", sms, out, sink);
  measure<1, true, 128, 8, true>("RS N 128, 8 steps behind its own", sms, out, sink);
  measure<2, false, 128, 8, true>("RS N 128, 8 steps, 2 WGs at once", sms, out, sink);
  measure<1, false, 64, 16, true>("RS N 64, 16 steps", sms, out, sink);
  return 0;
}
