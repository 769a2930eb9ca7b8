// The sm80 instructions of the portable DSA kernels, one thin wrapper each: cp.async with zero
// fill, ldmatrix (x4 and x2, plain and transposed), mma.sync m16n8k16 (bf16 or fp16 in, fp32
// accumulate) and named barriers (sync and arrive); ex2, pair packing and fp32 pair reductions
// are the arch-neutral ones of common/device_math.cuh. Shared memory is addressed with 32-bit
// shared-window byte addresses.
//
// Fragment layouts of mma.sync m16n8k16 (g = lane / 4, t = lane % 4), which the kernels index by:
//   A (16 x 16, row-major)  a[0] = (row g, k 2t..2t+1)   a[1] = (g+8, 2t..)   a[2] = (g, 2t+8..)
//                           a[3] = (g+8, 2t+8..)
//   B (16 x 8, k x n)       b[0] = (k 2t..2t+1, n g)     b[1] = (k 2t+8..2t+9, n g)
//   C (16 x 8, fp32)        c[0], c[1] = (g, 2t), (g, 2t+1)   c[2], c[3] = the same in row g+8
// ldmatrix.x4 (.x2): lane i gives the address of row i % 8 of the 8x8 matrix i / 8; register j
// receives matrix j, lane l holding row l / 4, columns 2(l % 4)..+1 (.trans: the same of the
// transpose).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/device_math.cuh"

namespace sa::portable::dsa {

// The CTA's dynamic shared memory.
__device__ __forceinline__ uint8_t* dynamic_smem() {
  extern __shared__ __align__(128) uint8_t dsa_dynamic_smem[];
  return dsa_dynamic_smem;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1. src_bytes 0: the 16 bytes are zero-filled and nothing
// is read (src is then any valid address; callers pass the tensor base).
__device__ __forceinline__ void cp_async_16_zfill(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
using sa::cp_async_commit;  // common/device_math.cuh
// Every cp.async group of this thread has landed. Other threads see the data after a barrier.
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Two 8x8 matrices: lanes 0..15 give the row addresses (the other lanes' are ignored).
__device__ __forceinline__ void ldmatrix_x2(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Two transposed 8x8 matrices: lanes 0..15 give the row addresses (the other lanes' are ignored).
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr));
}

// Barrier over `threads` threads (a multiple of 32) on hardware barrier `id` (0 is
// __syncthreads'). Orders shared-memory accesses like __syncthreads among those threads.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Producer side of a named barrier: counts this warp's arrival without waiting. The consumers'
// named_barrier_sync on the same id (with the same total count) returns once every producer has
// arrived, and then sees the producers' shared-memory writes made before the arrival.
// compute-sanitizer racecheck reported hazards (across later __syncthreads) in the one kernel that
// used this (the DSA backward's S -> dP hand-off, now bar.sync on both sides); prefer
// named_barrier_sync where the producer has nothing else to do before its next barrier.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Element traits: the m16n8k16 MMA of bf16 / fp16 (pair packing: pack2 in common/device_math).
template <class Element>
struct Mma16;

template <>
struct Mma16<__nv_bfloat16> {
  // d += a * b
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct Mma16<__half> {
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

}  // namespace sa::portable::dsa
