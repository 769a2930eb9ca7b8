// Device helpers of the Hopper DSA kernels (dsa_forward_kernel.cuh, dsa_backward_kernel.cuh):
// the 128-byte swizzle of a 64-column panel, the 16-byte cp.async gather, a wgmma batch over a K
// extent.
#pragma once

#include <cstdint>

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

namespace sa::sm90 {

// Byte offset of 16-byte chunk `ch` (0..7) of row `r` inside a 128B-swizzled panel.
__device__ __forceinline__ uint32_t swz(int r, int ch) {
  return static_cast<uint32_t>(r * 128 + ((ch ^ (r & 7)) << 4));
}

// 16-byte cp.async, zero-filling the bytes past src_bytes (0: nothing is read).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Appends C (+)= A B over the K extent of a and b to the current wgmma batch (no arrive/commit).
template <class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void gemm_ss(TiledMma& mma, const TA& a, const TB& b, TC& c,
                                        bool zero_init) {
  using namespace cute;
  mma.accumulate_ = zero_init ? SM90::GMMA::ScaleOut::Zero : SM90::GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int kb = 0; kb < size<2>(a); ++kb) {
    cute::gemm(mma, a(_, _, kb), b(_, _, kb), c);
    mma.accumulate_ = SM90::GMMA::ScaleOut::One;
  }
}


}  // namespace sa::sm90
