// The Hopper BSA backward's dQ conversion, run beside its main kernel instead of after it: dq =
// scale * dq_accum (fp32, fragment-tile order of common/dq_tile_layout.hpp) -> bf16, one 64-row
// tile of one query head at a time, as soon as every work item of that head's KV head is done.
//
// Why: the conversion is a DRAM-bound pass (~50 us at B1 H32 S8192 D128: 134 MB read, 67 MB
// written) that used to start only when the main kernel had ended, while the main kernel's last
// work items left more and more SMs idle. Launched with programmatic stream serialization, its
// CTAs take those SMs once every main-kernel CTA has started (the main kernel triggers its
// dependents at its start), and convert the KV heads that are already complete. Measured in
// session 26 (bench/notes-archive): the conversion ends 14-20 us after the main kernel instead of
// ~51 us; +3% at 12.5% density, +1.7% at 50% (B1 H32 S8192 D128, block 128).
//
// Protocol (device memory after the accumulator, BsaBwdPlan::dq_ready, zeroed by the preprocess):
//   ready[b * H_kv + hk]  each consumer warpgroup of a main-kernel work item of (b, hk) adds 1
//                         with release semantics after its last dQ bulk reduction has completed
//                         (cp.async.bulk.wait_group 0, fence.proxy.async.global); the head is
//                         complete at (its work items, from the reverse map's row_scan) x
//                         `signals_per_item`.
//   ready[B * H_kv]       the ticket: CTAs take tiles in (b, h, tile) order, which is the main
//                         kernel's order of work items (up to its last two waves, which run
//                         longest first: reverse map step 6), by atomicAdd.
// A CTA's thread 0 waits for the tile's head (relaxed polls, then one acquire; after 10 s of
// waiting it traps, so a miscounted target is a launch failure, not a hang), then the CTA
// converts it. Every CTA ends with griddepcontrol.wait, so the conversion completes after the
// main kernel, as a stream-ordered one would. No deadlock: a dependent CTA starts only when every
// main-kernel CTA has started or exited, and main-kernel CTAs never wait for it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/problem.hpp"

namespace sa::sm90 {

struct DqConvertBeside {
  const float* dq_accum = nullptr;
  uint32_t* ready = nullptr;                     // [B * H_kv + 1]
  const unsigned long long* row_scan = nullptr;  // ReverseMapDevice::row_scan
  int64_t Sq_pad = 0;
  int64_t max_items = 0;         // ReverseMapDevice::max_items (the main kernel's grid)
  int32_t signals_per_item = 1;  // the main kernel's consumer warpgroups
  int32_t sm_count = 0;          // > 0: the grid is sm_count x 4 CTAs
};

// Launches the conversion of p.dq on `stream` right after the main kernel (bf16, D 64 or 128).
void launch_dq_convert_beside(const BsaBwdProblem& p, const DqConvertBeside& c,
                              cudaStream_t stream);

}  // namespace sa::sm90
