// Microbenchmark: can the two CTAs of an H 128 token exchange half of their dKV tiles through
// distributed shared memory (DSMEM) fast enough, next to the L2 traffic, for the DSA backward
// (src/sm90/dsa_backward_kernel.cuh) to reduce each tile half once instead of twice?
//
// At H 128 two CTAs (64 heads each) handle a token and both reduce a 64 x 576 fp32 tile into the
// same rows per 64-key chunk (147,456 B of red.global each). The idea measured here: the pair is
// a cluster of 2; CTA r keeps columns [288 r, 288 r + 288), sends the other half (73,728 B, fp32)
// into its partner's shared memory, adds the partner's half of its own columns and reduces only
// that (73,728 B). Per token-chunk the L2 sees 2 x (73.7 + 73.7) KB instead of
// 2 x (73.7 + 147) KB, but 2 x 73.7 KB cross the SM-to-SM network. The companion
// bench/micro/l2_ceiling.cu measured the L2 ceiling of today's traffic (mixed 4g+8r sync: 6.342 us
// per chunk and CTA on an H100).
//
// Self-contained (no library header, not part of the CMake build); description, run and result
// template: bench/micro/dsmem_exchange_chunk.md.
//   nvcc -O3 -arch=sm_90a -std=c++17 -o dsmem_exchange_chunk dsmem_exchange_chunk.cu
//   ./dsmem_exchange_chunk [target_ms_per_rep=60] [dsa_ref_ms=14.96] [ref_us_per_chunk=6.342]
//                          [dsa_ref_tflops=395]
//
// Launch: clusters of 2 (cudaLaunchKernelEx), grid 2 x (SMs / 2), 213 KB of dynamic shared memory
// so that one CTA runs per SM. Cluster k is a token: its CTAs 2k (rank 0) and 2k + 1 (rank 1).
//
// The exchange: a chunk's half tile is 9 slices of 8 KB (slice s: the 128-byte column segment
// 9 (1 - r) + s of all 64 rows, row-major, 128 B per row). The sender's 256 exchanging threads hold
// 2 float4 of a slice each (thread x: float4 x and x + 256, i.e. rows x / 8 and 32 + x / 8, floats
// 4 (x % 8)..), the receiver's thread x reads the same two float4 of the slice it gets. Slices go
// through a ring of kDepth 8-KB receive slots in each CTA with two mbarriers per slot:
//   full[slot] (in the receiver): the slice has landed (waited with try_wait.acquire.cluster);
//   empty[slot] (in the sender): the partner has read its copy of the slot (8 arrivals: one per
//     receiving warp, lane 0 after __syncwarp, mbarrier.arrive.release.cta.shared::cluster on the
//     remote barrier, made dependent on the loaded values: CUTLASS's ClusterBarrier::arrive(cta)
//     form, a bare SYNCS.ARRIVE in SASS; waited with try_wait.acquire.cta).
// Slice i uses slot i % kDepth for the (i / kDepth)-th time. Each thread's loop runs, for
// i = 0 .. n + lag - 1: receive slice i - lag (if i >= lag), then send slice i (if i < n), lag =
// kDepth / 2: up to kDepth / 2 slices in flight each way; every wait is on an earlier iteration of
// the partner, so the pair cannot deadlock. Variants (how a slice is sent, how full[slot]
// completes):
//   st.cluster  st.shared::cluster.v4.f32 from registers to the mapa'd remote address (ST.E.128 in
//               SASS), then __syncwarp and one mbarrier.arrive.release.cluster.shared::cluster per
//               warp on the partner's full[slot] (count 8). The cluster-scope release is what makes
//               plain remote stores visible; ptxas emits it as MEMBAR.ALL.CTA + MEMBAR.ALL.GPU +
//               ERRBAR + CGAERRBAR, so each warp waits for all its outstanding memory operations,
//               including, in the mixed test, its own red.global of the previous slice;
//   st.async    st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 (complete_tx on the
//               partner's full[slot]; the receiver arms each phase with arrive.expect_tx 8192);
//   bulk        st.shared.v4 into a local staging slot (the same slot index as the receive slot),
//               fence.proxy.async.shared::cta, named barrier of the 256 threads, one thread issues
//               cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes (8192 B) to
//               the partner's slot. This copy completes only on the partner's mbarrier (no
//               bulk-group), so the staging slot is rewritten only after empty[slot] says the
//               partner has read that slot's previous slice: its copy had read the staging slot.
//
// Tests:
//   dsmem <variant> D<depth>   256 threads per CTA, the exchange alone (no global traffic); the
//                              receiver adds each received float4 into registers.
//   mixed l2 full (no xchg)    today's traffic (l2_ceiling's mixed 4g+8r sync with this file's
//                              row layout): warps 0-3 gather the chunk's 64 rows (cp.async 16 B,
//                              double-buffered), warps 4-11 reduce the full 64 x 576 tile (red.v4,
//                              4 rows x 128 B per warp instruction), one named barrier per chunk.
//                              Unlike l2_ceiling (a set per CTA), the two CTAs of a cluster reduce
//                              into the same 64 rows at about the same time, as at H 128.
//   mixed l2 half (no xchg)    the same with only the CTA's half tile reduced (73,728 B): the L2
//                              floor of the idea, the exchange left out.
//   mixed <variant> D<depth>   the idea: warps 0-3 gather, warps 4-11 exchange (as above) and
//                              reduce own + received half (red.v4, 73,728 B), one named barrier
//                              per chunk for all 12 warps.
// Both CTAs of a cluster take the same index set per chunk (a token's top-k rows): chunk c of
// cluster k uses set (c * clusters + k) % 4096 of 4096 precomputed sets of 64 distinct random rows
// (1 MB), loaded lane-parallel one chunk ahead and broadcast with __shfl_sync. The accumulator
// [4096 x 576] fp32 (9.4 MB), the kv rows (4.7 MB) and the sets stay in the 50 MB L2. The tile
// value of CTA b in chunk c at (slot, col) is val(7 b + c + 3 slot + col + 5 (col / 32)): a
// multiple of 1/16 in [1/16, 1], so every check below is exact.
//
// Checks (before timing; PASS/FAIL lines, exit code 1 on a failure):
//   dsmem tests: 5 chunks (45 slices, every ring slot reused) per CTA; the timed kernel's register
//     sums against the host's, and a verify build of the same kernel that compares every received
//     float4 with the value the partner must have sent for that slice (a stale or early read of a
//     slot shows as a mismatch);
//   mixed tests: 3 chunks per CTA on a zeroed accumulator against the host's sums (full tile of
//     both CTAs for the exchange tests and "l2 full", each CTA's own half for "l2 half").
// Timing: per test a warm-up launch, a two-step calibration to ~target_ms per launch, one untimed
// launch, then 5 launches timed with CUDA events; the median is reported.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "dsa_traffic.cuh"

constexpr int kTileBytes = kChunkRows * kCols * 4;           // 147,456
constexpr int kHalfTileBytes = kTileBytes / 2;               // 73,728
constexpr int kSliceBytes = kChunkRows * 32 * 4;             // 8,192: one segment of 64 rows
constexpr int kSlices = kSegs / 2;                           // 9 slices per half tile
constexpr int kXThreads = 256;                               // exchanging threads per CTA
constexpr int kXWarps = kXThreads / 32;
constexpr int kGWarps = 4;                                   // gathering warps (mixed tests)
constexpr int kMixedThreads = 32 * kGWarps + kXThreads;      // 384
constexpr int kRing = 4;                                     // receive / staging slots allocated
static_assert(kSlices * kSliceBytes == kHalfTileBytes, "9 slices per half tile");
static_assert(2 * 16 * kXThreads == kSliceBytes, "2 float4 per exchanging thread and slice");

// Shared memory, the same for every test (one CTA per SM):
constexpr int kGatherOff = 0;                              // 2 x 73,728: the gather's buffers
constexpr int kRecvOff = 2 * kGatherChunkBytes;            // kRing x 8 KB: receive ring
constexpr int kStageOff = kRecvOff + kRing * kSliceBytes;  // kRing x 8 KB: bulk staging ring
constexpr int kBarOff = kStageOff + kRing * kSliceBytes;   // full[kRing], empty[kRing]
constexpr int kSmemBytes = kBarOff + 2 * kRing * 8;        // 213,056
static_assert(kSmemBytes <= 227 * 1024, "fits the sm_90 opt-in limit");
static_assert(kGatherOff == 0, "gather buffers first");

enum Xchg : int { kNone = 0, kStCluster = 1, kStAsync = 2, kBulk = 3 };

// ---- device helpers
// ------------------------------------------------------------------------------

// The tile of offset cb (7 b + c): float4 j (0..511) of segment seg, i.e. row slot j / 8, columns
// col = 32 seg + 4 (j % 8) .. + 3, values val(cb + 3 slot + col + 5 seg).
__device__ __forceinline__ float4 tile4(int cb, int seg, int j) {
  const int t = cb + 3 * (j >> 3) + 37 * seg + 4 * (j & 7);
  return make_float4(val(t), val(t + 1), val(t + 2), val(t + 3));
}
__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- cluster, DSMEM and mbarrier (PTX) ----
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// The shared::cluster address of this CTA's shared::cta address `a` in the CTA of rank `rank`.
__device__ __forceinline__ uint32_t mapa(uint32_t a, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(a), "r"(rank));
  return out;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// One local arrival and `bytes` more expected in the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
// One arrival on a barrier of the partner CTA (shared::cluster address), release at cluster scope:
// this thread's earlier memory operations (and, through __syncwarp before it, its warp's) are
// visible to the partner's threads that observe the phase complete (acquire.cluster). ptxas
// emits MEMBAR.ALL.CTA + MEMBAR.ALL.GPU + ERRBAR + CGAERRBAR before the arrive: the warp waits
// until every earlier memory operation of its own (remote stores, but also red.global) is done.
__device__ __forceinline__ void mbar_arrive_remote_release_cluster(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote_bar)
               : "memory");
}
// One arrival on a barrier of the partner CTA with release at CTA scope (no fence in SASS: a bare
// SYNCS.ARRIVE), the form CUTLASS's ClusterBarrier::arrive(cta_id) uses to free a stage in other
// CTAs. Used to say "I have read this slot": the two floats it takes are values loaded from the
// slot, so the arrive cannot issue before those loads have returned their data.
__device__ __forceinline__ void mbar_arrive_remote_after(uint32_t remote_bar, float d0, float d1) {
  asm volatile("mbarrier.arrive.release.cta.shared::cluster.b64 _, [%0];" ::"r"(remote_bar),
               "f"(d0), "f"(d1)
               : "memory");
}
// try_wait on a local barrier. kCluster: acquire at cluster scope (pairs with the partner's
// cluster-scope release: remote arrive.release.cluster, st.async and bulk-copy complete_tx; ptxas
// adds CCTL.IVALL, an L1 invalidation, on success); else acquire at CTA scope (no extra SASS).
template <bool kCluster>
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  if constexpr (kCluster)
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
  else
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
  return ok != 0;
}
// Waits until the phase of parity `parity` of a local barrier completes.
template <bool kCluster>
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait<kCluster>(bar, parity)) {
  }
}
__device__ __forceinline__ void st_cluster_v4(uint32_t remote, float4 v) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(remote), "f"(v.x),
               "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}
__device__ __forceinline__ void st_async_v4(uint32_t remote, float4 v, uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, "
      "[%5];" ::"r"(remote),
      "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(remote_bar)
      : "memory");
}
__device__ __forceinline__ void st_shared_v4(uint32_t a, float4 v) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(a), "f"(v.x), "f"(v.y), "f"(v.z),
               "f"(v.w)
               : "memory");
}
__device__ __forceinline__ float4 ld_shared_v4(uint32_t a) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(a)
               : "memory");
  return v;
}
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// `bytes` from this CTA's shared memory `src` to the partner's `remote_dst`, completing (bytes) on
// the partner's barrier `remote_bar`.
__device__ __forceinline__ void bulk_copy_to_cluster(uint32_t remote_dst, uint32_t src,
                                                     uint32_t bytes, uint32_t remote_bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, "
      "[%3];" ::"r"(remote_dst),
      "r"(src), "r"(bytes), "r"(remote_bar)
      : "memory");
}

// The exchange between the two CTAs of a cluster, for the 256 exchanging threads (x = 0..255 of
// them; lane = x % 32): slice i goes through ring slot i % kDepth (use u = i / kDepth).
template <int kX, int kDepth>
struct Exchange {
  static_assert(kX == kStCluster || kX == kStAsync || kX == kBulk, "an exchange variant");
  static_assert(kDepth >= 2 && kDepth <= kRing, "ring depth");
  static constexpr int kLag = kDepth / 2;  // receive slice i - kLag before sending slice i
  static constexpr bool kTx = kX != kStCluster;
  uint32_t recv, stage, full, empty;  // this CTA's (shared::cta)
  uint32_t p_recv, p_full, p_empty;   // the partner's (shared::cluster)
  int x, lane;

  // One thread of the CTA, before the cluster barrier that publishes them.
  __device__ static void init_barriers(uint32_t base) {
    for (int s = 0; s < kDepth; ++s) {
      mbar_init(base + kBarOff + 8 * s, kTx ? 1 : kXWarps);  // full: 1 arming arrival + tx, or
                                                             // one remote arrival per sender warp
      mbar_init(base + kBarOff + 8 * (kRing + s), kXWarps);  // empty: one per receiving warp
    }
    fence_mbarrier_init();
    if constexpr (kTx)  // arm phase 0 of every slot: one arrival and 8192 bytes expected
      for (int s = 0; s < kDepth; ++s) mbar_arrive_expect_tx(base + kBarOff + 8 * s, kSliceBytes);
  }

  __device__ void setup(uint32_t base, int x_, uint32_t partner) {
    x = x_;
    lane = x_ & 31;
    recv = base + kRecvOff;
    stage = base + kStageOff;
    full = base + kBarOff;
    empty = base + kBarOff + 8 * kRing;
    p_recv = mapa(recv, partner);
    p_full = mapa(full, partner);
    p_empty = mapa(empty, partner);
  }

  // Send slice i: value(k) is this thread's float4 x + 256 k of it.
  template <class F>
  __device__ __forceinline__ void send(int i, F&& value) {
    const int slot = i % kDepth, u = i / kDepth;
    const uint32_t off = slot * kSliceBytes + 16 * x;
    // The partner has read this slot's previous slice (so it may be overwritten; for bulk, the
    // copy of that slice has also read this CTA's staging slot).
    if (u > 0) mbar_wait<false>(empty + 8 * slot, (u - 1) & 1);
    if constexpr (kX == kStCluster) {
      st_cluster_v4(p_recv + off, value(0));
      st_cluster_v4(p_recv + off + kSliceBytes / 2, value(1));
      __syncwarp();
      if (lane == 0) mbar_arrive_remote_release_cluster(p_full + 8 * slot);
    } else if constexpr (kX == kStAsync) {
      st_async_v4(p_recv + off, value(0), p_full + 8 * slot);
      st_async_v4(p_recv + off + kSliceBytes / 2, value(1), p_full + 8 * slot);
    } else {
      st_shared_v4(stage + off, value(0));
      st_shared_v4(stage + off + kSliceBytes / 2, value(1));
      fence_proxy_async_smem();  // the generic-proxy writes, before the bulk copy reads them
      named_barrier(2, kXThreads);
      if (x == 0)
        bulk_copy_to_cluster(p_recv + slot * kSliceBytes, stage + slot * kSliceBytes, kSliceBytes,
                             p_full + 8 * slot);
    }
  }

  // Receive slice i into v[0], v[1] (this thread's float4 x and x + 256), then free the slot.
  __device__ __forceinline__ void receive(int i, float4 (&v)[2]) {
    const int slot = i % kDepth, u = i / kDepth;
    mbar_wait<true>(full + 8 * slot, u & 1);
    const uint32_t a = recv + slot * kSliceBytes + 16 * x;
    v[0] = ld_shared_v4(a);
    v[1] = ld_shared_v4(a + kSliceBytes / 2);
    // Arm the slot's next phase (its phase u has completed: this thread waited for it; the next
    // slice cannot arrive before the empty arrivals below).
    if constexpr (kTx)
      if (x == 0) mbar_arrive_expect_tx(full + 8 * slot, kSliceBytes);
    __syncwarp();
    if (lane == 0) mbar_arrive_remote_after(p_empty + 8 * slot, v[0].x, v[1].x);
  }
};

// ---- kernels
// -------------------------------------------------------------------------------------

// The exchange alone: 256 threads, `chunks` x 9 slices sent and received per CTA. The receiver adds
// into registers (sink: 8 floats per thread). kVerify: every received float4 is compared with the
// value the partner sent for that slice (errors: the count of mismatching float4).
template <int kX, int kDepth, bool kVerify>
__global__ void __launch_bounds__(kXThreads, 1)
    dsmem_kernel(int chunks, float* __restrict__ sink, unsigned* errors,
                 unsigned long long* cycles) {
  extern __shared__ __align__(128) uint8_t smem[];
  using X = Exchange<kX, kDepth>;
  constexpr int kLag = X::kLag;
  const uint32_t base = smem_u32(smem);
  const uint32_t rank = cluster_ctarank(), partner = rank ^ 1;
  const int x = threadIdx.x;
  if (x == 0) X::init_barriers(base);
  X ex;
  ex.setup(base, x, partner);
  cluster_sync();
  const int cb_own = 7 * blockIdx.x, cb_par = 7 * (blockIdx.x ^ 1);
  const int seg_send = kSlices * partner, seg_recv = kSlices * rank;
  float4 a[2] = {make_float4(0, 0, 0, 0), make_float4(0, 0, 0, 0)};
  unsigned bad = 0;
  if (kVerify && rank != (blockIdx.x & 1)) bad += 1000000;  // clusters are not pairs 2k, 2k + 1
  const long long t0 = clock64();
  auto take = [&](int i, int c, int s) {
    float4 v[2];
    ex.receive(i, v);
    a[0] = add4(a[0], v[0]);
    a[1] = add4(a[1], v[1]);
    if constexpr (kVerify) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const float4 e = tile4(cb_par + c, seg_recv + s, x + 256 * k);
        bad += (v[k].x != e.x) | (v[k].y != e.y) | (v[k].z != e.z) | (v[k].w != e.w);
      }
    }
  };
  for (int c = 0; c < chunks; ++c) {
#pragma unroll 1
    for (int s = 0; s < kSlices; ++s) {
      const int i = c * kSlices + s;
      if (i >= kLag) {
        if (s >= kLag)
          take(i - kLag, c, s - kLag);
        else
          take(i - kLag, c - 1, s - kLag + kSlices);
      }
      ex.send(i, [&](int k) { return tile4(cb_own + c, seg_send + s, x + 256 * k); });
    }
  }
  for (int s = kSlices - kLag; s < kSlices; ++s) take((chunks - 1) * kSlices + s, chunks - 1, s);
  store_cycles(cycles, t0);
  float* out = sink + (static_cast<size_t>(blockIdx.x) * kXThreads + x) * 8;
  out[0] = a[0].x, out[1] = a[0].y, out[2] = a[0].z, out[3] = a[0].w;
  out[4] = a[1].x, out[5] = a[1].y, out[6] = a[1].z, out[7] = a[1].w;
  if (kVerify && bad) atomicAdd(errors, bad);
  // The partner's last remote arrivals on this CTA's barriers land before either CTA exits.
  cluster_sync();
}

// 12 warps: warps 0-3 gather the chunk (double-buffered), warps 4-11 (x = 0..255) reduce with
// red.v4: thread x covers rows of slots 4 w + lane / 8 and 32 + 4 w + lane / 8 (w = x / 32), 16
// bytes at column 4 (lane % 8) of every segment it reduces (4 rows x 128 B per warp instruction).
// kX == kNone: no exchange; the own tile (kFull) or the own half. Otherwise the exchange of the
// half tiles (Exchange<kX, kDepth>) and the reduction of own + received half. One named barrier
// per chunk for all 12 warps.
template <int kX, int kDepth, bool kFull>
__global__ void __launch_bounds__(kMixedThreads, 1)
    mixed_kernel(const uint8_t* __restrict__ kv, float* __restrict__ acc,
                 const int* __restrict__ idx, int chunks, unsigned long long* cycles) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr bool kEx = kX != kNone;
  using X = Exchange<kEx ? kX : kStCluster, kDepth>;
  const uint32_t base = smem_u32(smem);
  const uint32_t rank = cluster_ctarank(), partner = rank ^ 1;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int cluster = blockIdx.x >> 1, clusters = gridDim.x >> 1;
  if constexpr (kEx)
    if (threadIdx.x == 0) X::init_barriers(base);
  cluster_sync();
  const long long t0 = clock64();
  Idx next = load_idx(idx, chunk_set(cluster, 0, clusters), lane);
  if (warp < kGWarps) {
    for (int c = 0; c < chunks; ++c) {
      const Idx ix = next;
      if (c + 1 < chunks) next = load_idx(idx, chunk_set(cluster, c + 1, clusters), lane);
      gather_chunk(base + kGatherOff + (c & 1) * kGatherChunkBytes, kv, ix, warp, kGWarps, lane);
      cp_async_commit();
      cp_async_wait<1>();
      named_barrier(1, kMixedThreads);
    }
    cp_async_wait<0>();
  } else {
    const int x = threadIdx.x - 32 * kGWarps, xw = x >> 5;
    struct Rows {
      float* p0;
      float* p1;
    };
    auto rows = [&](const Idx& ix) {
      const int slot = 4 * xw + (lane >> 3);
      return Rows{acc + static_cast<size_t>(row_of(ix, false, slot)) * kCols + 4 * (lane & 7),
                  acc + static_cast<size_t>(row_of(ix, true, 32 + slot)) * kCols + 4 * (lane & 7)};
    };
    if constexpr (!kEx) {
      for (int c = 0; c < chunks; ++c) {
        const Idx ix = next;
        if (c + 1 < chunks) next = load_idx(idx, chunk_set(cluster, c + 1, clusters), lane);
        const Rows r = rows(ix);
        const int cb = 7 * blockIdx.x + c;
        constexpr int kN = kFull ? kSegs : kSlices;
#pragma unroll 3
        for (int s = 0; s < kN; ++s) {
          const int seg = kFull ? s : kSlices * rank + s;
          red_f32x4(r.p0 + 32 * seg, tile4(cb, seg, x));
          red_f32x4(r.p1 + 32 * seg, tile4(cb, seg, x + 256));
        }
        named_barrier(1, kMixedThreads);
      }
    } else {
      constexpr int kLag = X::kLag;
      X ex;
      ex.setup(base, x, partner);
      const int seg_send = kSlices * partner, seg_own = kSlices * rank;
      // Reduce own + received for slice i = (chunk c, slice s) at the rows of chunk c.
      auto take = [&](int i, int c, int s, const Rows& r) {
        float4 v[2];
        ex.receive(i, v);
        const int seg = seg_own + s, cb = 7 * blockIdx.x + c;
        red_f32x4(r.p0 + 32 * seg, add4(tile4(cb, seg, x), v[0]));
        red_f32x4(r.p1 + 32 * seg, add4(tile4(cb, seg, x + 256), v[1]));
      };
      Rows cur{nullptr, nullptr}, prev{nullptr, nullptr};
      for (int c = 0; c < chunks; ++c) {
        const Idx ix = next;
        if (c + 1 < chunks) next = load_idx(idx, chunk_set(cluster, c + 1, clusters), lane);
        prev = cur;
        cur = rows(ix);
        const int cb = 7 * blockIdx.x + c;
#pragma unroll 1
        for (int s = 0; s < kSlices; ++s) {
          const int i = c * kSlices + s;
          if (i >= kLag) {
            if (s >= kLag)
              take(i - kLag, c, s - kLag, cur);
            else
              take(i - kLag, c - 1, s - kLag + kSlices, prev);
          }
          ex.send(i, [&](int k) { return tile4(cb, seg_send + s, x + 256 * k); });
        }
        named_barrier(1, kMixedThreads);
      }
      for (int s = kSlices - kLag; s < kSlices; ++s)
        take((chunks - 1) * kSlices + s, chunks - 1, s, cur);
    }
  }
  store_cycles(cycles, t0);
  cluster_sync();
}

// ---- host
// ----------------------------------------------------------------------------------------

// A launch of `grid` CTAs in clusters of 2 with kSmemBytes of dynamic shared memory; `attr` holds
// the cluster attribute that cfg points to.
static cudaLaunchConfig_t cluster_config(int grid, int threads, cudaLaunchAttribute (&attr)[1]) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cfg.stream = nullptr;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

template <class... Params, class... Args>
static void launch_cluster(void (*kernel)(Params...), int grid, int threads, Args... args) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = cluster_config(grid, threads, attr);
  CK(cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...));
}

template <class... Params>
static int max_active_clusters(void (*kernel)(Params...), int grid, int threads) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = cluster_config(grid, threads, attr);
  int n = 0;
  CK(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
  return n;
}

struct Test {
  std::string name;
  int threads;
  double xbytes, gbytes, rbytes;   // per chunk and CTA: sent over DSMEM, gathered, reduced
  int check;                       // 1: dsmem sums (+ verify build), 2: acc full, 3: acc half
  std::function<void(int)> launch;  // chunks per CTA
  std::function<void(int)> verify;  // dsmem tests: the kVerify build
};

// The accumulator after `chunks` chunks per CTA from zero: every CTA's whole tile (half: each
// CTA's own column half only).
static std::vector<double> expected_acc(const std::vector<int>& idx, int grid, int chunks,
                                        bool half) {
  std::vector<double> e(size_t{kRows} * kCols, 0.0);
  const int clusters = grid / 2;
  for (int b = 0; b < grid; ++b)
    for (int c = 0; c < chunks; ++c) {
      const int set = (c * clusters + b / 2) % kSets;
      const int cb = 7 * b + c;
      const int c0 = half ? (kCols / 2) * (b & 1) : 0, c1 = half ? c0 + kCols / 2 : kCols;
      for (int slot = 0; slot < kChunkRows; ++slot) {
        double* row = e.data() + size_t(idx[set * kChunkRows + slot]) * kCols;
        for (int col = c0; col < c1; ++col) row[col] += hval(cb + 3 * slot + col + 5 * (col >> 5));
      }
    }
  return e;
}

// The dsmem tests' register sums: thread x of CTA b adds the partner's float4 x and x + 256 of
// every slice of its own column half.
static std::vector<double> expected_sink(int grid, int chunks) {
  std::vector<double> e(size_t(grid) * kXThreads * 8, 0.0);
  for (int b = 0; b < grid; ++b)
    for (int x = 0; x < kXThreads; ++x)
      for (int k = 0; k < 2; ++k) {
        const int j = x + 256 * k;
        for (int c = 0; c < chunks; ++c)
          for (int s = 0; s < kSlices; ++s) {
            const int seg = kSlices * (b & 1) + s;
            const long long t = 7LL * (b ^ 1) + c + 3 * (j >> 3) + 37 * seg + 4 * (j & 7);
            for (int q = 0; q < 4; ++q)
              e[(size_t(b) * kXThreads + x) * 8 + 4 * k + q] += hval(t + q);
          }
      }
  return e;
}

static size_t count_off(const std::vector<float>& got, const std::vector<double>& e,
                        double* max_err) {
  size_t bad = 0;
  *max_err = 0;
  for (size_t k = 0; k < got.size(); ++k) {
    const double err = std::fabs(double(got[k]) - e[k]);
    *max_err = std::max(*max_err, err);
    if (err > 1e-6 * std::max(1.0, std::fabs(e[k]))) ++bad;
  }
  return bad;
}

static const char* variant_name(int x) {
  return x == kStCluster ? "st.cluster" : x == kStAsync ? "st.async" : x == kBulk ? "bulk" : "none";
}

int main(int argc, char** argv) {
  const double target_ms = argc > 1 ? std::atof(argv[1]) : 60.0;
  const double dsa_ms = argc > 2 ? std::atof(argv[2]) : 14.96;
  const double ref_us = argc > 3 ? std::atof(argv[3]) : 6.342;
  const double dsa_tflops = argc > 4 ? std::atof(argv[4]) : 395.0;
  constexpr int kCheckDsmemChunks = 5, kCheckMixedChunks = 3;

  const Gpu gpu = query_gpu();
  int cluster_ok = 0;
  CK(cudaDeviceGetAttribute(&cluster_ok, cudaDevAttrClusterLaunch, gpu.dev));
  const int grid = gpu.sms / 2 * 2, clusters = grid / 2;
  std::printf(
      "device %s, sm_%d%d, %d SMs, L2 %.1f MB; grid %d CTAs = %d clusters of 2, %d B dynamic "
      "shared memory per CTA\n",
      gpu.prop.name, gpu.major, gpu.minor, gpu.sms, gpu.l2 / 1e6, grid, clusters, kSmemBytes);
  if (gpu.major != 9) std::printf("warning: built for sm_90a; this is not a Hopper GPU\n");
  if (!cluster_ok) {
    std::printf("error: this device cannot launch clusters\n");
    return 1;
  }

  const TrafficBuffers buf = alloc_traffic(size_t{kRows} * kCols * 4, grid);
  float* const acc = buf.acc;
  uint8_t* const kv = buf.kv;
  int* const idx = buf.idx;
  unsigned long long* const cycles = buf.cycles;
  const size_t acc_bytes = buf.acc_bytes;
  const std::vector<int>& h_idx = buf.h_idx;
  float* sink = nullptr;
  unsigned* errors = nullptr;
  const size_t sink_floats = size_t(grid) * kXThreads * 8;
  CK(cudaMalloc(&sink, sink_floats * sizeof(float)));
  CK(cudaMalloc(&errors, sizeof(unsigned)));

  // ---- the tests ----
  std::vector<Test> tests;
  int min_clusters = 1 << 30;
  auto add_dsmem = [&](auto kernel, auto verify_kernel, int variant, int depth) {
    for (auto k : {kernel, verify_kernel})
      CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    min_clusters = std::min(min_clusters, max_active_clusters(kernel, grid, kXThreads));
    tests.push_back({std::string("dsmem ") + variant_name(variant) + " D" + std::to_string(depth),
                     kXThreads, double(kHalfTileBytes), 0.0, 0.0, 1,
                     [=](int chunks) {
                       launch_cluster(kernel, grid, kXThreads, chunks, sink, errors, cycles);
                     },
                     [=](int chunks) {
                       launch_cluster(verify_kernel, grid, kXThreads, chunks, sink, errors, cycles);
                     }});
  };
  add_dsmem(dsmem_kernel<kStCluster, 2, false>, dsmem_kernel<kStCluster, 2, true>, kStCluster, 2);
  add_dsmem(dsmem_kernel<kStCluster, 4, false>, dsmem_kernel<kStCluster, 4, true>, kStCluster, 4);
  add_dsmem(dsmem_kernel<kBulk, 2, false>, dsmem_kernel<kBulk, 2, true>, kBulk, 2);
  add_dsmem(dsmem_kernel<kBulk, 4, false>, dsmem_kernel<kBulk, 4, true>, kBulk, 4);
  add_dsmem(dsmem_kernel<kStAsync, 4, false>, dsmem_kernel<kStAsync, 4, true>, kStAsync, 4);
  auto add_mixed = [&](const std::string& name, auto kernel, bool ex, bool full) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    min_clusters = std::min(min_clusters, max_active_clusters(kernel, grid, kMixedThreads));
    tests.push_back({name, kMixedThreads, ex ? double(kHalfTileBytes) : 0.0,
                     double(kGatherChunkBytes),
                     full && !ex ? double(kTileBytes) : double(kHalfTileBytes),  // reduced
                     full ? 2 : 3,
                     [=](int chunks) {
                       launch_cluster(kernel, grid, kMixedThreads, kv, acc, idx, chunks, cycles);
                     },
                     nullptr});
  };
  add_mixed("mixed l2 full (no xchg)", mixed_kernel<kNone, 2, true>, false, true);
  add_mixed("mixed l2 half (no xchg)", mixed_kernel<kNone, 2, false>, false, false);
  add_mixed("mixed st.cluster D2", mixed_kernel<kStCluster, 2, true>, true, true);
  add_mixed("mixed st.cluster D4", mixed_kernel<kStCluster, 4, true>, true, true);
  add_mixed("mixed bulk D2", mixed_kernel<kBulk, 2, true>, true, true);
  add_mixed("mixed bulk D4", mixed_kernel<kBulk, 4, true>, true, true);
  add_mixed("mixed st.async D4", mixed_kernel<kStAsync, 4, true>, true, true);
  std::printf("max active clusters (cudaOccupancyMaxActiveClusters, fewest over the kernels): "
              "%d%s\n",
              min_clusters,
              min_clusters < clusters ? "  WARNING: fewer than the grid's clusters; the launch "
                                        "runs in waves and the timings are not per-SM rates"
                                      : "");

  // ---- correctness ----
  bool all = true;
  {
    const std::vector<double> e_sink = expected_sink(grid, kCheckDsmemChunks);
    const std::vector<double> e_full = expected_acc(h_idx, grid, kCheckMixedChunks, false);
    const std::vector<double> e_half = expected_acc(h_idx, grid, kCheckMixedChunks, true);
    std::vector<float> got_sink(sink_floats), got_acc(size_t{kRows} * kCols);
    for (const Test& t : tests) {
      double max_err = 0;
      if (t.check == 1) {
        CK(cudaMemset(sink, 0xff, sink_floats * sizeof(float)));
        t.launch(kCheckDsmemChunks);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(got_sink.data(), sink, sink_floats * sizeof(float), cudaMemcpyDeviceToHost));
        const size_t bad = count_off(got_sink, e_sink, &max_err);
        CK(cudaMemset(sink, 0xff, sink_floats * sizeof(float)));
        CK(cudaMemset(errors, 0, sizeof(unsigned)));
        t.verify(kCheckDsmemChunks);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        unsigned mism = 0;
        CK(cudaMemcpy(&mism, errors, sizeof(unsigned), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(got_sink.data(), sink, sink_floats * sizeof(float), cudaMemcpyDeviceToHost));
        double max_err_v = 0;
        const size_t bad_v = count_off(got_sink, e_sink, &max_err_v);
        const bool ok = bad == 0 && bad_v == 0 && mism == 0;
        all = all && ok;
        std::printf(
            "check %-26s: %s (%d chunks; sums %zu of %zu off, max |err| %.3g; verify build: %u "
            "float4 mismatched, sums %zu off)\n",
            t.name.c_str(), ok ? "PASS" : "FAIL", kCheckDsmemChunks, bad, got_sink.size(),
            max_err, mism, bad_v);
      } else {
        CK(cudaMemset(acc, 0, acc_bytes));
        t.launch(kCheckMixedChunks);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(got_acc.data(), acc, acc_bytes, cudaMemcpyDeviceToHost));
        const std::vector<double>& e = t.check == 2 ? e_full : e_half;
        const size_t bad = count_off(got_acc, e, &max_err);
        double sum = 0;
        for (double v : e) sum += v;
        all = all && bad == 0;
        std::printf(
            "check %-26s: %s (%d chunks; %zu of %zu elements off, max |err| %.3g, sum %.6g)\n",
            t.name.c_str(), bad == 0 ? "PASS" : "FAIL", kCheckMixedChunks, bad, got_acc.size(),
            max_err, sum);
      }
    }
    std::printf("check: %s\n\n", all ? "PASS" : "FAIL");
  }

  // ---- timing ----
  std::printf("%-26s %4s %10s %8s %9s %9s %10s %8s %8s %9s %9s %6s\n", "test", "thr",
              "chunks/CTA", "ms(med)", "us/chunk", "clk/chunk", "DSMEM GB/s", "GB/s/SM", "B/clk/SM",
              "L2 GB/s", "L2 B/clk", "MHz");
  std::vector<double> us(tests.size(), 0.0);
  for (size_t ti = 0; ti < tests.size(); ++ti) {
    const Test& t = tests[ti];
    const ChunkRun run = run_chunks(t.launch, target_ms, acc, acc_bytes, cycles, grid);
    const int chunks = run.chunks;
    const double med = run.med_ms, mean_cyc = run.mean_cyc, total = run.total;
    const double clk_chunk = run.clk_chunk;
    const double xgbps = total * t.xbytes / med / 1e6;
    const double l2b = t.gbytes + t.rbytes;
    us[ti] = med * 1e3 / chunks;
    std::printf("%-26s %4d %10d %8.3f %9.3f %9.0f %10.1f %8.2f %8.2f %9.1f %9.2f %6.0f\n",
                t.name.c_str(), t.threads, chunks, med, us[ti], clk_chunk, xgbps, xgbps / grid,
                t.xbytes / clk_chunk, total * l2b / med / 1e6, l2b / clk_chunk,
                mean_cyc / (med * 1e3));
  }

  // ---- against the DSA backward at H 128 ----
  {
    const double cta_chunks = 8192.0 * 32;  // H128 D576 S4096 topk2048: 8192 CTA-items x 32
    const double per_sm = cta_chunks / grid;
    const double ref_floor_ms = per_sm * ref_us / 1e3;
    const double dist = dsa_ms / ref_floor_ms;  // the kernel's distance from today's L2 floor
    std::printf(
        "\nDSA backward H128 D576 S4096 topk2048: %.2f ms (%.0f TFLOPS) for %.0f CTA-chunks = %.1f "
        "per SM: %.3f us per chunk and CTA\n",
        dsa_ms, dsa_tflops, cta_chunks, per_sm, dsa_ms * 1e3 / per_sm);
    std::printf(
        "  reference: l2_ceiling mixed 4g+8r sync %.3f us per chunk -> floor %.3f ms; the kernel "
        "runs %.3fx that floor\n",
        ref_us, ref_floor_ms, dist);
    size_t base = tests.size(), half = tests.size();
    for (size_t i = 0; i < tests.size(); ++i) {
      if (tests[i].name == "mixed l2 full (no xchg)") base = i;
      if (tests[i].name == "mixed l2 half (no xchg)") half = i;
    }
    std::printf("  %-26s %9s %9s %9s %9s %10s %12s %10s\n", "test", "us/chunk", "/ref", "/l2 full",
                "/l2 half", "floor ms", "at dist. ms", "~TFLOPS");
    for (size_t i = 0; i < tests.size(); ++i) {
      if (tests[i].name.rfind("mixed", 0) != 0) continue;
      const double floor_ms = per_sm * us[i] / 1e3;
      std::printf("  %-26s %9.3f %9.3f %9.3f %9.3f %10.3f %12.3f %10.0f\n", tests[i].name.c_str(),
                  us[i], us[i] / ref_us, base < tests.size() ? us[i] / us[base] : 0.0,
                  half < tests.size() ? us[i] / us[half] : 0.0, floor_ms, floor_ms * dist,
                  dsa_tflops * dsa_ms / (floor_ms * dist));
    }
  }
  free_traffic(buf);
  CK(cudaFree(sink));
  CK(cudaFree(errors));
  if (!all) std::printf("check FAILED: the timings above are of wrong kernels\n");
  return all ? 0 : 1;
}
