// The sm80 instructions the portable kernels are built from, one thin wrapper each:
//   cp.async (16 bytes, zero fill when predicated off), ldmatrix (x4, plain and transposed),
//   mma.sync m16n8k16 with fp32 accumulators (CuTe's SM80 atoms) and two register-pressure
//   helpers. Shared memory is addressed with 32-bit shared-window byte addresses. The
//   arch-neutral ex2, quad reductions, small cp.async copies and pair packing are in
//   common/device_math.cuh.
//
// Fragment layouts of mma.sync m16n8k16 (g = lane / 4, t = lane % 4), which the kernels index by:
//   A (16 x 16, row-major) a[0] = (g, 2t..2t+1)   a[1] = (g+8, 2t..)   a[2] = (g, 2t+8..)
//                          a[3] = (g+8, 2t+8..)
//   B (16 x 8, k x n)      b[0] = (k = 2t..2t+1, n = g)               b[1] = (k = 2t+8.., n = g)
//   C (16 x 8, fp32)       c[0], c[1] = (g, 2t), (g, 2t+1)            c[2], c[3] = row g+8
// ldmatrix.x4: lane i gives the address of row i % 8 of 8x8 matrix i / 8; register j receives
// matrix j with lane l holding row l / 4, columns 2(l % 4)..+1 (transposed: that of the transpose).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/device_math.cuh"

#include <cute/arch/mma_sm80.hpp>

namespace sa::portable::sm80 {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously. pred false: the 16 bytes are zero-filled and
// nothing is read (src must still be a valid address expression; callers pass the tensor base).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  const int src_bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
// cp_async_4, cp_async_commit, cp_async_wait<N>: common/device_math.cuh.
using sa::cp_async_4;
using sa::cp_async_commit;
using sa::cp_async_wait;

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// blockIdx read through volatile asm, so that the compiler re-reads it where it is used rather
// than keeping it live (in a register) across a kernel's main loop.
__device__ __forceinline__ uint3 cta_index() {
  uint3 c;
  asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(c.x));
  asm volatile("mov.u32 %0, %%ctaid.y;\n" : "=r"(c.y));
  asm volatile("mov.u32 %0, %%ctaid.z;\n" : "=r"(c.z));
  return c;
}

// x, but opaque to the compiler: values derived from it are not merged with (and kept live from)
// identical values derived from x earlier.
__device__ __forceinline__ int opaque(int x) {
  asm volatile("" : "+r"(x));
  return x;
}

// Element-type traits: the MMA atom of bf16 / fp16 (pair packing: pack2 in common/device_math).
template <class Element>
struct ElementOps;

template <>
struct ElementOps<__nv_bfloat16> {
  using MmaAtom = cute::SM80_16x8x16_F32BF16BF16F32_TN;
};

template <>
struct ElementOps<__half> {
  using MmaAtom = cute::SM80_16x8x16_F32F16F16F32_TN;
};

// d += a * b for one m16n8k16 tile.
template <class Element>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  ElementOps<Element>::MmaAtom::fma(d[0], d[1], d[2], d[3], a[0], a[1], a[2], a[3], b0, b1, d[0],
                                    d[1], d[2], d[3]);
}

}  // namespace sa::portable::sm80
