// The work items of a persistent CTA (the Hopper DSA forward's seesaw kernels, the DSA backward,
// and the BSA forward's masked and packed kernels): item 0 of CTA b is b; item k after it is
// either b + k gridDim.x (static: items of equal length) or taken from a counter in global memory
// (dynamic: items of different lengths), gridDim.x + atomicAdd(counter, 1), so that a CTA that
// finishes early takes more. The host zeroes the counter before each launch, in stream order.
//
// The dynamic hand-off: warp 0 of the producer warpgroup claims the CTA's item k + 1 right after
// it has issued item k (a CTA near the end takes no item that a CTA finishing sooner could run),
// and every thread that walks the items reads it at the end of its item k. Two slots: next[k % 2]
// is written during item k (full[k % 2]: one arrival, lane 0 after its store), read at its end
// (empty[k % 2]: every walking thread arrives after its read; item_handoff_init's count, the
// whole CTA where every thread walks, fewer where some warps exit or follow another hand-off).
//
// Code generation (bench/notes-archive, session 16): the claim is a warp-uniform branch (warp 0)
// with lane 0's atomic, store and arrive predicated, not a branch on the lane: a lane branch made
// the compiler treat the producer's whole path as possibly divergent (a BRA.DIV before every
// shuffle of the gather; -7% on every shape). The item read back is made warp-uniform by a warp
// reduction (an index the compiler cannot prove uniform made the consumers' wgmma look divergent:
// ptxas serialized them, C7520). Only the producer's copy of the loop contains the claim (kClaims).
//
// The pieces (wait_item_slot, counter_item, publish_item, handed_item) serve kernels whose loops
// keep their own shape: the BSA forward's masked and packed kernels hand every tile after the first
// through the slots, from the counter or in the static order (bsa_forward_kernel.cuh, next_tile).
#pragma once

#include <cstdint>

#include "common/device_math.cuh"  // atomic_inc_if
#include "sm90/hopper_primitives.cuh"

namespace sa::sm90 {

struct ItemHandoff {
  uint32_t next[2];
  uint64_t full[2];
  uint64_t empty[2];
};

// By one thread, before the CTA's __syncthreads (with the other barriers' initialisation).
// walkers: the threads that read the hand-off (each arrives on empty once per item k > 0).
__device__ __forceinline__ void item_handoff_init(ItemHandoff& h, uint32_t walkers) {
  for (int k = 0; k < 2; ++k) {
    mbarrier_init(&h.full[k], 1);
    mbarrier_init(&h.empty[k], walkers);
  }
}

// The grid size, read where it is used: ptxas otherwise keeps gridDim.x in a register across a
// loop, and the BSA forward's producer (setmaxnreg 40) spilled it.
__device__ __forceinline__ uint32_t grid_ctas() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(n));
  return n;
}

// During the CTA's item k, before publishing item k + 1 into slot k % 2: waits until every walker
// has read the slot's previous value (item k - 1, at the start of that item). Warp-uniform.
__device__ __forceinline__ void wait_item_slot(ItemHandoff& h, uint32_t k) {
  if (k >= 2) mbarrier_wait(&h.empty[k & 1], ((k >> 1) - 1) & 1);
}

// The next dynamic item, grid + atomicAdd(counter, 1) (lane 0's atomic, shuffled to the warp),
// clamped to `items` (the end): at most items + grid - 1 < 2^32. Every lane of the warp calls it.
__device__ __forceinline__ uint32_t counter_item(uint32_t* counter, uint32_t items, uint32_t grid,
                                                 bool lane0) {
  return min(grid + __shfl_sync(0xffffffffu, atomic_inc_if(counter, lane0), 0), items);
}

// Publishes the CTA's item k + 1 into slot k % 2 (after wait_item_slot): lane 0 stores and arrives
// on full (the arrival releases its store). Every lane of the warp calls it.
__device__ __forceinline__ void publish_item(ItemHandoff& h, uint32_t k, uint32_t next,
                                             bool lane0) {
  st_shared_u32_if(smem_u32(&h.next[k & 1]), next, lane0);
  mbarrier_arrive_if(&h.full[k & 1], lane0);
}

// The CTA's item k > 0, published during item k - 1; this thread then arrives on the slot's empty
// barrier. Warp-uniform (a warp reduction); every lane of the warp calls it.
__device__ __forceinline__ uint32_t handed_item(ItemHandoff& h, uint32_t k) {
  const int slot = (k - 1) & 1;  // written during item k - 1
  mbarrier_wait(&h.full[slot], ((k - 1) >> 1) & 1);
  const uint32_t i = __reduce_max_sync(0xffffffffu, h.next[slot]);
  mbarrier_arrive(&h.empty[slot]);  // after this thread's read
  return i;
}

// Runs f(i) for each item i (< items, which fit in 31 bits) of this CTA, in order; `counter` null:
// static items. Every walking thread runs the loop (each reads the dynamic hand-off); kClaims:
// the producer warpgroup's copy, whose warp 0 claims the items.
template <bool kClaims, class F>
__device__ __forceinline__ void for_each_cta_item(ItemHandoff& h, uint32_t* counter,
                                                  uint32_t items, F f) {
#pragma unroll 1
  for (uint32_t k = 0;; ++k) {
    uint32_t i = blockIdx.x;  // the CTA's item k
    if (k > 0) {
      if (counter != nullptr)
        i = handed_item(h, k);
      else
        i += k * gridDim.x;  // < items + gridDim.x <= 2^32 - 1 (both below 2^31)
    }
    if (i >= items) break;
    f(i);
    if constexpr (kClaims) {
      // Warp 0 claims the CTA's item k + 1.
      if (counter != nullptr && __shfl_sync(0xffffffffu, threadIdx.x / 32, 0) == 0) {
        const bool lane0 = threadIdx.x == 0;
        wait_item_slot(h, k);
        publish_item(h, k, counter_item(counter, items, gridDim.x, lane0), lane0);
      }
    }
  }
}

}  // namespace sa::sm90
