#include "cuda/bsa_backward_plan.hpp"

#include <algorithm>

#include "common/cuda_check.hpp"
#include "cuda/bsa_packed_rows.hpp"
#include "cuda/reverse_map_gpu.hpp"

namespace sa::portable {
namespace {

constexpr size_t kAlign = kReverseMapAlignment;  // every sub-buffer, and the slack for the base

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One group per row when the rows alone give at least 2 CTAs per slot; otherwise about 4 work
// items per slot, assuming every query block lists min(K_max, N_kv) blocks, with at least 4
// entries per group.
// Packed batches (`packed`): most of the B * Hkv * Nkv reverse rows lie past their sequence's
// end (Nkv bounds every sequence's KV blocks), so the counts use what the shapes bound: at most
// ceil(T_kv / block) + B KV blocks and ceil(T_q / block) + B query blocks over all sequences.
int32_t auto_bucket(const BsaDims& d, int64_t slots, bool packed) {
  const int64_t kv_blocks = packed ? ceil_div(d.Skv, d.block) + d.B : d.B * d.Nkv;
  const int64_t q_blocks = packed ? ceil_div(d.Sq, d.block) + d.B : d.B * d.Nq;
  const int64_t rows = d.Hkv * kv_blocks;
  if (rows >= 2 * slots) return 0;
  const int64_t expected = ceil_div(d.Hq * q_blocks * std::min(d.Kmax, d.Nkv), rows);
  const int64_t groups = ceil_div(4 * slots, rows);
  constexpr int64_t kMinBucket = 4;
  const int64_t bucket = std::max(kMinBucket, ceil_div(expected, groups));
  return bucket >= d.group() * d.Nq ? 0 : static_cast<int32_t>(bucket);
}

}  // namespace

BsaBwdPlan make_bsa_backward_plan(const BsaBwdProblem& p, int64_t cta_slots, bool single_owner,
                                  bool dq_accumulator, int32_t tail_items) {
  const BsaDims& d = p.dims;
  BsaBwdPlan plan;
  if (single_owner) {
    plan.bucket = 0;
  } else if (p.options.bucket_size > 0) {
    plan.bucket = p.options.bucket_size >= d.group() * d.Nq ? 0 : p.options.bucket_size;
  } else {
    plan.bucket = auto_bucket(d, cta_slots, p.meta.varlen());
  }
  plan.several_owners = plan.bucket > 0;
  plan.dq_accumulator = dq_accumulator;
  // Packed batches (cuda/bsa_packed_rows.hpp): [H_q, packed rows] stats and dQ accumulator,
  // [H_kv, T_kv] dK/dV accumulators (B = 1 below).
  const bool packed = p.meta.varlen();
  const int64_t B = packed ? 1 : d.B;
  plan.Sq_pad = packed ? packed_stat_rows(d.Sq, d.B, d.block) : d.Nq * d.block;
  plan.Skv_pad = packed ? d.Skv : d.Nkv * d.block;

  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t start = at;
    at = align_up(at + std::max<size_t>(bytes, 1));
    return start;
  };
  const size_t stats = static_cast<size_t>(B * d.Hq * plan.Sq_pad) * sizeof(float);
  plan.lse2 = take(stats);
  plan.delta = take(stats);
  if (plan.dq_accumulator) {
    const size_t accum = static_cast<size_t>(B * d.Hq * plan.Sq_pad * d.D) * sizeof(float);
    plan.dq_bytes = accum + static_cast<size_t>(d.B * d.Hkv + 1) * sizeof(uint32_t);
    plan.dq_accum = take(plan.dq_bytes);
    plan.dq_ready = plan.dq_accum + accum;
    plan.dq_ready_count = d.B * d.Hkv + 1;
  }
  if (plan.several_owners) {
    plan.dkv_bytes = static_cast<size_t>(B * d.Hkv * plan.Skv_pad * d.D) * sizeof(float);
    plan.dk_accum = take(plan.dkv_bytes);
    plan.dv_accum = take(plan.dkv_bytes);
  }
  plan.tail_items = tail_items;
  plan.map_bytes = reverse_map_workspace_bytes(d, plan.bucket, plan.tail_items, packed);
  plan.map = take(plan.map_bytes);
  plan.total = at + kAlign;
  return plan;
}

BsaBwdBuffers carve_bsa_backward_workspace(const BsaBwdPlan& plan, void* workspace, size_t bytes,
                                           const char* op) {
  SA_CHECK(workspace != nullptr && bytes >= plan.total, SA_ERROR_WORKSPACE,
           op << ": workspace of " << bytes << " bytes, expected at least " << plan.total);
  uint8_t* base = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(workspace)));
  BsaBwdBuffers buf;
  buf.lse2 = reinterpret_cast<float*>(base + plan.lse2);
  buf.delta = reinterpret_cast<float*>(base + plan.delta);
  if (plan.dq_accumulator) {
    buf.dq_accum = reinterpret_cast<float*>(base + plan.dq_accum);
    buf.dq_ready = reinterpret_cast<uint32_t*>(base + plan.dq_ready);
  }
  if (plan.several_owners) {
    buf.dk_accum = reinterpret_cast<float*>(base + plan.dk_accum);
    buf.dv_accum = reinterpret_cast<float*>(base + plan.dv_accum);
  }
  buf.map = base + plan.map;
  return buf;
}

void zero_bsa_backward_accumulators(const BsaBwdPlan& plan, const BsaBwdBuffers& buf,
                                    cudaStream_t stream) {
  if (plan.several_owners) {
    SA_CUDA_CHECK(cudaMemsetAsync(buf.dk_accum, 0, plan.dkv_bytes, stream));
    SA_CUDA_CHECK(cudaMemsetAsync(buf.dv_accum, 0, plan.dkv_bytes, stream));
  }
}

}  // namespace sa::portable
