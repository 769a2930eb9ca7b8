// The device-level BSA backward (SPEC 1, "Backward"): one driver owns the plan and every step of
// the backward; an arch supplies its main kernel as a KernelPolicy (src/sm80/bsa_backward.cu,
// src/sm90/bsa_backward.cu). The same split as the DSA backward's driver
// (docs/decisions/backward_driver.md): the driver says how much workspace a problem needs, the
// caller provides it, the driver runs the steps.
//
// Steps, all on the caller's stream, no host synchronisation and no host read of a metadata
// value (the whole call can be captured in a CUDA graph and replayed with new metadata values):
//   1. memset of the fp32 dK/dV accumulators (rows may be shared); preprocess: delta =
//      rowsum(dO * o), lse2 = lse * log2(e), the dQ accumulator and its dq_ready counters zeroed
//                                                                     (bsa_backward_aux.cu)
//   2. the reverse map (reverse_map_gpu.hpp), rows split into groups of `bucket` entries, on a
//      side stream beside step 1
//   3. the policy's main kernel: dK/dV of every work item, dQ into the fp32 accumulator (none in
//      deterministic mode); the policy may also launch dq's conversion beside it
//   4. dq: unless step 3 converted it, scale * dQ accumulator -> dtype of q (in the policy's
//      accumulator order, natural or fragment-tiled), or, without an accumulator (deterministic
//      mode), the policy's query-major dQ kernel (no atomics)
//   5. rows with several groups only: dk, dv from their fp32 accumulators. Rows with one group
//      (the "single owner" case, empty rows included) were written by the main kernel itself.
//
// Bucket (entries per group), chosen from SHAPES only (bsa_backward_plan.cpp):
//   options.bucket_size > 0: that size. 0 (automatic): one group per row (single owners, no dK/dV
//   workspace, no conversion pass) when the rows alone give at least 2 CTAs per CTA slot of the
//   GPU (the policy's cta_slots); otherwise rows are split so that there are about 4 work items
//   per slot, assuming every query block lists min(K_max, N_kv) blocks (at least 4 entries per
//   group).
// Deterministic mode (options.deterministic): one group per row whatever bucket_size says (dK/dV
// accumulated by one CTA in a fixed order), and dQ computed query-major without atomics instead
// of step 3's reductions. Gradients are then bitwise identical from run to run.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/problem.hpp"
#include "cuda/bsa_backward_plan.hpp"
#include "cuda/reverse_map_gpu.hpp"

namespace sa::portable::bsa_bwd {

// Main-kernel CTAs resident on the whole GPU at once for `p` (the automatic bucket aims at about
// 4 work items per slot). Called only when the bucket is automatic.
using CtaSlots = int64_t (*)(const BsaBwdProblem& p);

// How many of the last work items the reverse map orders longest first (its step 6).
using TailItems = int32_t (*)(const BsaBwdProblem& p);

// Step 3: dK/dV of every reverse-map work item, and dQ into buf.dq_accum when the plan has one.
// Returns true when it has also launched dq's conversion (beside its kernel), false to leave dq
// to step 4.
using MainKernelLaunch = bool (*)(const BsaBwdProblem& p, const BsaBwdPlan& plan,
                                  const BsaBwdBuffers& buf, const ReverseMapDevice& map,
                                  cudaStream_t stream);

// Step 4 without a dQ accumulator (deterministic mode): dq from a query-major kernel.
using DqKernelLaunch = void (*)(const BsaBwdProblem& p, const BsaBwdPlan& plan,
                                const BsaBwdBuffers& buf, cudaStream_t stream);

// What an arch supplies to the driver: its kernels and what the plan and the steps need to know
// of them.
struct KernelPolicy {
  const char* op = "";       // names the path in errors, e.g. "sm90 bsa_backward"
  bool dq_tiled = false;     // the main kernel reduces dQ in the fragment-tile order
                             // (common/dq_tile_layout.hpp), which step 4 reads back
  CtaSlots cta_slots = nullptr;
  TailItems tail_items = nullptr;  // null: no tail order (the kernel takes item = launch slot)
  MainKernelLaunch launch = nullptr;
  DqKernelLaunch launch_dq = nullptr;
};

// The plan of `p` under `kernel`: bucket, tail order, workspace carve-up. Shapes, options and
// (through the policy) the GPU's size only.
BsaBwdPlan plan(const BsaBwdProblem& p, const KernelPolicy& kernel);

// Device workspace bytes of run(p, ..., kernel).
size_t workspace_bytes(const BsaBwdProblem& p, const KernelPolicy& kernel);

// Every step of the backward (the top of this file) around kernel.launch, on a problem the
// caller has checked for the policy's kernels. Writes every element of p.dq, p.dk, p.dv;
// launches on `stream`, no host synchronisation. Throws sa::Error (SA_ERROR_WORKSPACE) when the
// workspace is short, naming kernel.op.
void run(const BsaBwdProblem& p, void* workspace, size_t workspace_bytes, cudaStream_t stream,
         const KernelPolicy& kernel);

// The query-major dQ kernel of deterministic mode is the portable one for every policy: a
// DqKernelLaunch and its limits ("" when it serves `p`, otherwise the reason). Defined with the
// portable kernels (src/sm80/bsa_backward.cu), whose tiles and parameters it shares.
void query_major_dq(const BsaBwdProblem& p, const BsaBwdPlan& plan, const BsaBwdBuffers& buf,
                    cudaStream_t stream);
std::string query_major_dq_unsupported(const BsaBwdProblem& p);

}  // namespace sa::portable::bsa_bwd
