// The device-level DSA backward (SPEC 2): one driver owns the workspace plan and every step of
// the backward; an arch supplies only its main kernel, as a KernelPolicy (src/sm80/dsa_backward.cu,
// src/sm90/dsa_backward.cu). The split follows CUTLASS's device/kernel layers: the driver says how
// much workspace a problem needs, the caller provides it, the driver runs the steps.
//
// Launches on the caller's stream (default, fp32 atomics):
//   1. memset   dkv_acc [S_kv, D_qk] fp32 = 0                                  (workspace)
//   2. main     the policy's kernel over S_q x ceil(H / M) work items (M = heads_per_cta): dq;
//               one fp32 reduction per (item, active slot, column) into dkv_acc, in the policy's
//               column order; the d_sink term -exp(sink - L) delta of each (t, h) -> [H, S_q]
//   3. convert  dkv = dkv_acc in kv's dtype, every element (rows no slot selects become 0)
//   4. d_sink   per head, the terms summed in a fixed order; zeros without a sink
//
// Token groups (cuda/dsa_token_groups.hpp; a policy with token_groups, H in {8, 16, 32}, not
// deterministic, token-major rows): step 2 becomes
//   2g. unions  build_token_groups: per group of G = 64 / H tokens, the sorted union of their
//               active keys with each token's multiplicity, and its length
//   2.  main    the policy's kernel over ceil(S_q / G) items of 64 rows (token, head), each
//               walking its group's union, its rows addressed as one token of 64 heads; dynamic
//               items (the counter), as the unions differ in length
// in slices of groups whose unions fit kGroupUnionBytesCap (one slice at S 4096).
//
// Deterministic mode (options.deterministic). fp32 reductions add in arrival order, so dkv would
// differ in its last bits from run to run. Instead, tokens are processed in slices of T tokens
// (T such that the slice's partial rows take at most kPartialBytesCap), each slice:
//   2a. slot keys  item e = (t - t0) * topk + i of every slot of the slice; key = its kv row when
//                  the slot is active, else S_kv (sorts last, never read)
//   2b. sort       cub radix sort of (key, item) by key; it is stable, so the items of a key stay
//                  in ascending order: the inverse index, deterministic by construction
//   2c. main       the same kernel with deterministic = 1: each work item stores its chunk's
//                  head-reduced dkv rows into its own partial row (t - t0, head group, slot)
//                  with plain stores instead of reducing
//   2d. reduce     a block per key j: dkv_acc[j] += its items' partial rows in sorted order
//                  (groups in order): a fixed order, the same sums on every run
// then 3 (natural column order) and 4 as above. d_sink is always reduced in a fixed order.
//
// Deterministic mode by fixed point (a policy with fixed_point: the Hopper kernel;
// cuda/dsa_fixed_point.cuh says what holds). Steps 1-3 become
//   1f. memset   dkv_fix [S_kv, D_qk] int64 (a spare row S_kv after it takes the inactive
//                slots, never zeroed nor read), row flags and slot counts [S_kv], FixCtl = 0
//   1g. scale    slot counts per key, the largest |q|, |dout|, |kv| and count (-> the scale s0)
//   2f. main     pass 0: each value rounded at 2^s0 and reduced with red.add.u64 into dkv_fix;
//                its largest |x| into FixCtl
//   2r. retry    when that |x| missed s0's window: dkv_fix zeroed and the main kernel again at
//                s1 (both launched always, returning at once otherwise: no host decision)
//   3f. convert  dkv = dkv_fix 2^-s in kv's dtype; NaN rows where a value was not finite
// The reductions stay in L2 like the fp32 ones, at twice their bytes; no slices, no sort.
//
// The binned plan (a policy with fixed_point and launch_binned; cuda/dsa_binned_fixed.cuh says
// what holds): the same steps with exponent-binned int32 sums, two columns to a 64-bit word, at
// the fp32 reductions' bytes. The accumulator is kBinCount planes [S_kv + 1, D_qk / 2] of packed
// words (4x the int64 one). Its form is picked on the device from the slot counts: the binned
// form where bin_serves(count, head groups) (every column sum of the busiest key fits int32 at
// kBinMinResolution bits or more), else the int64 form above, its rows at the planes' start.
//   1f. memset   the planes, row flags, slot counts, FixCtl = 0; 1g as above
//   2f. main     launch_binned: the binned kernel and the int64 one, each returning at once
//                unless the counts pick its form; the binned form's pass 0 at B = 2^e from the
//                estimate alone (bin_bound), its largest |x| into FixCtl
//   2r. retry    the picked form's planes or rows zeroed and its kernel again when its pass 0
//                missed (binned: max_x >= B, or below the last bin's lower edge)
//   3f. convert  per column, the kBinCount bin sums decoded in fp64, one rounding to kv's dtype
//                (or the int64 form's); NaN rows as above
//
// Cost of deterministic mode, estimated at the headline shape (S_q 4096, H 128 -> 2 head groups,
// D_qk 576, topk 2048, all slots active): the partial rows are 2,304 B per (token, group, slot),
// 38.6 GB written by 2c and read once by 2d instead of the same volume of L2-resident
// reductions: ~2 x 38.6 GB / ~3.5 TB/s = ~22 ms of DRAM traffic on top of the main kernel
// (which does the same MMAs), plus 8.4 M-item radix sorts (~1 ms) and 18 slices of launches;
// i.e. roughly 1.5-2x the default mode's time, and up to ~2 GiB more workspace.
//
// Design and the plan for the BSA backward's driver: docs/decisions/backward_driver.md.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/problem.hpp"
#include "cuda/dsa_backward_aux.hpp"
#include "cuda/dsa_backward_params.hpp"

namespace sa::portable {

// "" when the strides and alignment of p's tensors suit the driver's passes and the main kernels
// of every policy (contiguous last dimensions, 16-byte rows of q, kv, out and dout, dq pairs, dkv
// quads), otherwise the reason.
std::string dsa_backward_layout_unsupported(const DsaBwdProblem& p);

}  // namespace sa::portable

namespace sa::portable::dsa_bwd {

// Launch of a main kernel: `grid` work items over `prm` (tok_begin and the workspace pointers
// set) on `stream`, device `device` current. Item b is token prm.tok_begin + b / head_groups and
// heads [M (b % head_groups), +M), M = the policy's heads_per_cta; the kernel writes dq, the
// d_sink terms (when prm.sink_terms) and each active slot's head-reduced dkv row, reduced into
// prm.dkv_acc, or in deterministic mode stored to its partial row
// ((t - tok_begin) * head_groups + group) * topk + slot of prm.dkv_part. How items map to CTAs
// is the launch's own (one CTA per item, or persistent CTAs over the items).
using MainKernelLaunch = void (*)(const DsaBwdParams& prm, int64_t grid, int device,
                                  cudaStream_t stream);

// What an arch supplies to the driver: its main kernel and what the driver's plan and passes
// need to know of it.
struct KernelPolicy {
  const char* op = "";          // names the path in errors, e.g. "sm90 dsa_backward"
  int heads_per_cta = 0;        // M: heads per work item; sets head_groups and the partial rows
  AccColumns reduce_columns = AccColumns::kNatural;  // column order of its reductions into
                                                     // dkv_acc (outside deterministic mode)
  MainKernelLaunch launch = nullptr;
  // The kernel takes token groups (prm.group_len non-null; heads_per_cta must be 64): run uses
  // them where token_groups_eligible(p), and the plan makes room for them.
  bool token_groups = false;
  // Deterministic mode by fixed-point reductions (prm.dkv_fix; cuda/dsa_fixed_point.cuh) instead
  // of partial rows.
  bool fixed_point = false;
  // With fixed_point: the binned plan's launch (prm.dkv_bins; both of its forms, each kernel
  // returning at once unless the slot counts pick it), or null for the int64 plan.
  MainKernelLaunch launch_binned = nullptr;
  // The binned plan's prm.fix_bin_min: the least resolution its binned form serves. 0:
  // kBinMinResolution; tests pass more than kBinMaxResolution to run its int64 form.
  int bin_min_resolution = 0;
};

// Byte offsets of the workspace parts from a 256-byte aligned base, and the sizes they derive
// from; every size comes from the shapes, the policy's heads per CTA and (the sort's scratch)
// the current device, never from metadata values.
struct WorkspacePlan {
  int heads_per_cta = 0;
  int64_t groups = 0;          // ceil(H / heads_per_cta)
  bool deterministic = false;
  int64_t slice = 0;           // tokens per deterministic slice
  int end_bit = 0;             // key bits of the sort
  size_t cub_bytes = 0;        // the sort's scratch
  size_t acc = 0;              // fp32 dkv accumulator [S_kv, D_qk]
  size_t terms = 0;            // d_sink terms [H, S_q] (with p.d_sink)
  bool counter = false;        // a uint32 work-item counter (with topk_length or token groups:
  size_t counter_at = 0;       // a persistent kernel takes items of different lengths from it)
  int group_tokens = 0;        // token groups: G (0: none), the entries per group, groups per
  int64_t group_cap = 0;       // slice and one slice's unions (cuda/dsa_token_groups.hpp)
  int64_t group_slice = 0;
  size_t group_keys = 0, group_mult = 0, group_len = 0, group_present = 0;
  bool fixed = false;          // deterministic by fixed point (the policy's fixed_point):
  bool binned = false;         //   binned plan (the policy's launch_binned): fix holds the
                               //   kBinCount planes [S_kv + 1, D_qk / 2] uint64 instead,
  size_t fix = 0;              //   int64 dkv accumulator [S_kv + 1, D_qk] (instead of acc),
  size_t bad = 0, counts = 0;  //   row flags and slot counts [S_kv] uint32,
  size_t ctl = 0;              //   FixCtl
  size_t part = 0;             // deterministic: partial rows [slice, groups, topk, D_qk] fp32
  size_t keys_in = 0, keys_out = 0, vals_in = 0, vals_out = 0;  // deterministic: the sort's
  size_t cub = 0;                                               // items and scratch
  size_t total = 0;            // bytes, including the slack to align the caller's pointer
};

// The plan for `p` and a main kernel of `heads_per_cta` heads per work item; `slice_tokens` > 0
// pins deterministic mode's token slice (tests), 0 takes as many tokens as keep a slice's partial
// rows within 2 GiB. Deterministic mode asks CUB for its sort's scratch on the current device.
// With token groups slice_tokens > 0 pins their slice to max(1, slice_tokens / G) groups, 0 takes
// as many groups as keep a slice's unions within kGroupUnionBytesCap.
WorkspacePlan plan_workspace(const DsaBwdProblem& p, int heads_per_cta, int64_t slice_tokens = 0);
// The same for `kernel`'s policy: with kernel.token_groups and token_groups_eligible(p), room
// for the unions and the item counter after the parts above.
WorkspacePlan plan_workspace(const DsaBwdProblem& p, const KernelPolicy& kernel,
                             int64_t slice_tokens = 0);

// Device workspace bytes of run(p, ..., kernel, slice_tokens).
size_t workspace_bytes(const DsaBwdProblem& p, const KernelPolicy& kernel,
                       int64_t slice_tokens = 0);

// Every step of the backward (the top of this file) around kernel.launch, on a problem the
// caller has checked for both the policy's kernel and dsa_backward_layout_unsupported. Writes
// every element of p.dq, p.dkv and p.d_sink (when given); launches on `stream` (device
// p.device_index current), no host synchronisation. Throws sa::Error (SA_ERROR_WORKSPACE) when
// the workspace is short, naming kernel.op.
void run(const DsaBwdProblem& p, void* workspace, size_t workspace_bytes, cudaStream_t stream,
         const KernelPolicy& kernel, int64_t slice_tokens = 0);

}  // namespace sa::portable::dsa_bwd
