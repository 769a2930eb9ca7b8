// Hopper (sm_90a) building blocks as thin PTX wrappers: mbarriers, named barriers, TMA tile
// loads, proxy fences, register reconfiguration. Device code only; every function is one or two
// instructions, named after the PTX it emits, so the kernels read like the PTX they become. The
// arch-neutral ex2, quad reductions and fp32 pair reductions are in common/device_math.cuh.
#pragma once

#include <cstdint>

#include <cutlass/numeric_types.h>

#include "common/device_math.cuh"

namespace sa::sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The first 1024-aligned byte of the kernel's dynamic shared memory `raw` (the period of the
// 128-byte swizzle; each launch asks for 1024 bytes of slack), by pointer arithmetic on the shared
// array: a round trip through an integer loses the address space, and C++ accesses through the
// result then compile to generic LD / ST instead of LDS / STS.
__device__ __forceinline__ uint8_t* align_smem_1024(uint8_t* raw) {
  return raw + ((1024u - (smem_u32(raw) & 1023u)) & 1023u);
}

// The kernel's dynamic shared memory `raw` as its storage struct S, aligned up to 1024 bytes (the
// period of the 128-byte swizzle; each launch asks for 1024 bytes of slack).
template <class S>
__device__ __forceinline__ S& aligned_shared_storage(uint8_t* raw) {
  return *reinterpret_cast<S*>(align_smem_1024(raw));
}

// ---- mbarrier (shared::cta) -----------------------------------------------------------------
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrive_count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(arrive_count)
               : "memory");
}

// Makes mbarrier.init visible to the async proxy (TMA complete_tx) and the other threads; follow
// it with a CTA barrier.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival (release semantics) plus `bytes` more transaction bytes expected in this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// mbarrier_arrive by the threads with `pred` set, without a branch (a warp that calls it stays
// converged as far as the compiler can tell).
__device__ __forceinline__ void mbarrier_arrive_if(uint64_t* bar, bool pred) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %1, 0;\n"
      "@p mbarrier.arrive.shared::cta.b64 _, [%0];\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(static_cast<uint32_t>(pred))
      : "memory");
}

// Waits (acquire) until the phase of parity `parity` has completed. A fresh barrier is in phase 0,
// so waiting for parity 1 returns at once ("the previous phase has completed").
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_u32(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (done == 0);
}

// cp.async completions of the executing thread arrive on `bar` (its expected count not
// incremented: the barrier counts one arrival per producer thread).
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar))
               : "memory");
}

// ---- named barriers (bar.sync / bar.arrive; `threads` a multiple of 32) ------------------------
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- TMA ----------------------------------------------------------------------------------------
// tensor_map: generic address of a CUtensorMap in param/const/global memory (a __grid_constant__
// kernel parameter). Box elements land at smem_dst; completion is reported to `bar` as
// transaction bytes (the whole box, zero-filled where it leaves the tensor).
__device__ __forceinline__ void tma_load_4d(const void* tensor_map, void* smem_dst, uint64_t* bar,
                                            int32_t c0, int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(smem_u32(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3)
      : "memory");
}

// The box at (c0, c1, c2, c3) <- smem_dst's tile, as one bulk async copy of the executing
// thread's bulk group (commit, then cp.async.bulk.wait_group(.read) before shared memory is
// rewritten or released). Box elements outside the tensor are not written.
__device__ __forceinline__ void tma_store_4d(const void* tensor_map, const void* smem_src,
                                             int32_t c0, int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
      ::"l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(smem_u32(smem_src)), "r"(c0), "r"(c1),
      "r"(c2), "r"(c3)
      : "memory");
}

// shared[0, bytes) = global[0, bytes) as one bulk async copy (non-tensor TMA; both addresses
// 16-byte aligned, bytes a multiple of 16), completion reported to `bar` as transaction bytes.
__device__ __forceinline__ void bulk_copy_g2s(void* smem_dst, const void* src, uint32_t bytes,
                                              uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(smem_u32(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

// global[i] += shared[i] for `bytes` / 4 floats (16-byte multiples), as one bulk async copy of the
// executing thread's bulk group.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const float* src, uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
          reinterpret_cast<uint64_t>(dst)),
      "r"(smem_u32(src)), "r"(bytes)
      : "memory");
}
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// The executing thread's bulk groups have finished reading shared memory.
__device__ __forceinline__ void bulk_wait_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// All but the kPending most recent of the executing thread's bulk groups have finished reading
// shared memory (groups complete in commit order).
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// ... and finished their writes.
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void prefetch_tensor_map(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tensor_map))
               : "memory");
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy accesses
// (wgmma operand reads, TMA) that a barrier makes them visible to.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- grid dependency control and cross-CTA flags (programmatic dependent launch) -------------
// The next kernel of the stream, when launched with programmatic stream serialization, may start
// once every CTA of this grid has executed this or exited. No ordering or visibility implied.
__device__ __forceinline__ void griddepcontrol_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
// Waits until the grids this one depends on have completed and their writes are visible (returns
// at once when the kernel was launched without programmatic serialization).
__device__ __forceinline__ void griddepcontrol_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
// Orders this thread's completed async-proxy global writes (bulk reductions waited for with
// cp.async.bulk.wait_group) before its later generic-proxy operations, e.g. a release.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
__device__ __forceinline__ void red_release_gpu_add_u32(uint32_t* addr, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_relaxed_gpu_u32(const uint32_t* addr) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t ld_acquire_gpu_u32(const uint32_t* addr) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(addr) : "memory");
  return v;
}

// ---- register reconfiguration (whole warpgroup, sm_90a) -----------------------------------------
// setmaxnreg moves registers inside the CTA's launch allocation: kThreads x the launch bound's
// per-thread count (65536 / ctas_per_sm / threads, down to a multiple of 8; 168 at 384 threads
// and one CTA per SM), not the whole register file share. A split above it makes the last
// setmaxnreg.inc wait forever (session 14: 128 x 32 + 256 x 240 = 65536 > 384 x 168 hung).
constexpr int setmaxnreg_pool(int threads, int ctas_per_sm) {
  return threads * (65536 / ctas_per_sm / threads / 8 * 8);
}
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---- math ---------------------------------------------------------------------------------------
// Packed bf16x2 -> two floats (exact); the low half first.
__device__ __forceinline__ float2 unpack_bf16x2(uint32_t bits) {
  return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
}

// The line holding global address p into L2 (no registers, no wait).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// ---- shared memory by address -------------------------------------------------------------------
// A 32-bit shared store by the threads with `pred` set, without a branch.
__device__ __forceinline__ void st_shared_u32_if(uint32_t addr, uint32_t v, bool pred) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %2, 0;\n"
      "@p st.shared.u32 [%0], %1;\n"
      "}\n" ::"r"(addr),
      "r"(v), "r"(static_cast<uint32_t>(pred))
      : "memory");
}

// Explicit st/ld.shared (a generic pointer into shared memory can compile to generic accesses).
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_f32(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ float2 ld_shared_f32x2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
  return __uint_as_float(ld_shared_u32(addr));
}
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void st_shared_f32x2(uint32_t addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
// Four 8 x 8 16-bit matrices from a warp's registers to shared memory: lane l holds row l / 4,
// columns 2 (l % 4) .. + 1 of matrix m in r[m] (the mma accumulator layout of an 8 x 8 block),
// and gives the address of row l % 8 of matrix l / 8 (16 bytes).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// ---- addresses of rows in global memory ----------------------------------------------------------
// base + row * kPitchBytes as one wide multiply (mad.wide.s32): written in C++, the compiler
// re-associates it into an index product, a 64-bit shift and an add of the base.
template <int kPitchBytes>
__device__ __forceinline__ float* offset_rows(float* base, int32_t row) {
  uint64_t out;
  asm("mad.wide.s32 %0, %1, %2, %3;\n" : "=l"(out) : "r"(row), "n"(kPitchBytes), "l"(base));
  return reinterpret_cast<float*>(out);
}

// ---- 16-bit pair packing (cutlass element types) -----------------------------------------------
// Two floats -> packed bf16x2 (round to nearest even); `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Two floats -> packed fp16x2 (round to nearest even); `lo` in the low half.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Two floats -> a packed pair of the 16-bit type Element (bf16 or fp16).
template <class Element>
__device__ __forceinline__ uint32_t pack_x2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack_x2<cutlass::bfloat16_t>(float lo, float hi) {
  return pack_bf16x2(lo, hi);
}
template <>
__device__ __forceinline__ uint32_t pack_x2<cutlass::half_t>(float lo, float hi) {
  return pack_f16x2(lo, hi);
}

// p through an opaque move: operand descriptors built from it are rebuilt at each use (after the
// barrier wait that precedes it) instead of being hoisted out of a loop and kept live.
template <class E>
__device__ __forceinline__ E* fresh_ptr(E* p) {
  uint64_t v;
  asm volatile("mov.b64 %0, %1;\n" : "=l"(v) : "l"(reinterpret_cast<uint64_t>(p)));
  return reinterpret_cast<E*>(v);
}

}  // namespace sa::sm90
