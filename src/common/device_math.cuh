// Arch-neutral device helpers that the portable (sm80+) and Hopper kernels share: the CTA order
// for kernels whose later items are heavier, the MUFU exponential, quad reductions over mma
// accumulator rows, small cp.async copies, fp32 pair reductions and a predicated counter increment
// in global memory, fp32 -> 16-bit pair packing. Device code only; each function is one to three
// instructions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace sa {

// The CTA's index counted from the grid's end. The hardware starts a grid's CTAs in about blockIdx
// order, so a kernel whose later items carry more work (causal ranges: token t sees min(t + 1, n)
// keys) maps this index to its items: the heaviest start first and the lightest fill the tail
// (longest-processing-time-first), instead of the heaviest starting last on a partly idle GPU.
__device__ __forceinline__ unsigned heavy_first_cta() { return gridDim.x - 1u - blockIdx.x; }

// 2^x with one MUFU instruction (relative error ~2^-22); 2^-inf = +0, results below 2^-126 flush
// to +0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// log2 x with one MUFU instruction (absolute error ~2^-22 for x in [0.5, 2], relative ~2^-22
// elsewhere); +0 and inputs below 2^-126 give -inf, +inf gives +inf.
__device__ __forceinline__ float log2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// A softmax probability 2^x, x = s log2(e) scale - L: at most 1 (x capped at 0). In the backward
// L is the fp32 LSE, with a relative error of ~6e-8, so at huge |scale| (|L| ~ 1e30)
// s log2(e) scale can exceed L by far more than 1; uncapped, 2^x overflows to inf and the
// backward's products turn it into NaN (SPEC 3: the forward stays finite, so must its
// gradients).
__device__ __forceinline__ float exp2_prob(float x) { return exp2_approx(fminf(x, 0.f)); }

// Max / min / sum over the 4 lanes of a quad (the lanes that share an mma accumulator row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_min(float x) {
  x = fminf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fminf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// A quad's 4 x 4 words, transposed: on entry lane q of the quad holds w[k] = element (q, k), on
// return element (k, q). Two butterfly stages with partner q ^ m (m = 2, then 1): the elements
// whose index differs from q in bit m swap with the partner's (a lane with bit m clear sends w[k
// | m] and gets the partner's w[k]). Two shuffles per stage; every lane of the warp calls it.
__device__ __forceinline__ void quad_transpose_4x4(uint32_t (&w)[4], int q) {
#pragma unroll
  for (int m = 2; m >= 1; m /= 2) {
    const bool hi = (q & m) != 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (k & m) continue;  // one exchange per pair (k, k | m)
      const uint32_t got = __shfl_xor_sync(0xffffffffu, hi ? w[k] : w[k | m], m);
      if (hi) {
        w[k] = got;
      } else {
        w[k | m] = got;
      }
    }
  }
}

// cp.async (sm80 and newer): 4 bytes global -> shared (through L1: .ca is the only mode for 4
// bytes), asynchronously; commit the thread's copies as a group; wait until at most N committed
// groups of this thread are in flight (other threads see the data after a following barrier).
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// addr[0] += a, addr[1] += b in global memory (fp32, no return value; addr 8-byte aligned). One
// vector reduction on sm90 and newer, two scalar ones before. Like every fp32 atomic, the result
// depends on the order in which concurrent additions arrive.
__device__ __forceinline__ void red_add_f32x2(float* addr, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(addr, a);
  atomicAdd(addr + 1, b);
#endif
}

// addr[0..3] += v in global memory (fp32, no return value; addr 16-byte aligned): one vector
// reduction on sm90 and newer, four scalar ones before. No "memory" clobber: the target is an
// accumulator the calling kernel never reads, and the compiler may move shared or global loads
// across the reduction.
__device__ __forceinline__ void red_add_f32x4(float* addr, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(addr), "f"(v.x), "f"(v.y),
               "f"(v.z), "f"(v.w));
#else
  atomicAdd(addr, v.x);
  atomicAdd(addr + 1, v.y);
  atomicAdd(addr + 2, v.z);
  atomicAdd(addr + 3, v.w);
#endif
}

// *addr += v in global memory (64-bit two's complement, no return value; addr 8-byte aligned).
// Integer additions commute exactly: the sum is the same in every arrival order. No "memory"
// clobber, as red_add_f32x4.
__device__ __forceinline__ void red_add_s64(int64_t* addr, int64_t v) {
  asm volatile("red.global.add.u64 [%0], %1;\n" ::"l"(addr), "l"(v));
}
// The same for an unsigned word (mod 2^64: the packed int32 pairs of cuda/dsa_binned_fixed.cuh).
__device__ __forceinline__ void red_add_u64(uint64_t* addr, uint64_t v) {
  asm volatile("red.global.add.u64 [%0], %1;\n" ::"l"(addr), "l"(v));
}

// atomicAdd(ptr, 1) on global memory by the threads with `pred` set, without a branch; returns
// the old value there (0 elsewhere).
__device__ __forceinline__ uint32_t atomic_inc_if(uint32_t* ptr, bool pred) {
  uint32_t old = 0;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %2, 0;\n"
      "@p atom.global.add.u32 %0, [%1], 1;\n"
      "}\n"
      : "+r"(old)
      : "l"(ptr), "r"(static_cast<uint32_t>(pred))
      : "memory");
  return old;
}

// Two floats -> a packed pair of Element (__nv_bfloat16 or __half), round to nearest even; `lo`
// in the low 16 bits (the lower column of a fragment pair).
template <class Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// A packed pair of Element -> two floats (`lo` from the low 16 bits), exact.
template <class Element>
__device__ __forceinline__ float2 unpack2(uint32_t v);
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t v) {
  __half2 h = *reinterpret_cast<__half2*>(&v);
  return __half22float2(h);
}

// The same pointer, opaque to the compiler: offsets added to it afterwards stay immediates of
// the memory instructions that use it (instead of being hoisted into registers and re-added in
// 64 bits per access).
template <class T>
__device__ __forceinline__ const T* opaque_ptr(const T* p) {
  uint64_t v;
  asm("mov.b64 %0, %1;\n" : "=l"(v) : "l"(reinterpret_cast<uint64_t>(p)));
  return reinterpret_cast<const T*>(v);
}

}  // namespace sa
