// The DSA backward driver: the workspace plan and the steps around a policy's main kernel (see
// dsa_backward_driver.hpp). Host code; the kernels it launches are in dsa_backward_aux.cu and the
// arch folders.
#include "cuda/dsa_backward_driver.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/cuda_check.hpp"
#include "common/error.hpp"
#include "cuda/dsa_binned_fixed.cuh"
#include "cuda/dsa_fixed_point.cuh"
#include "cuda/dsa_token_groups.hpp"
#include "cuda/launch_checks.hpp"

namespace sa::portable {

std::string dsa_backward_layout_unsupported(const DsaBwdProblem& p) {
  const DsaDims& d = p.dims;
  // 16-byte cp.async of q, kv and dout rows, 16-byte loads of out rows, 4-byte stores of dq
  // pairs, 8-byte stores of dkv quads (16-byte loads of the fp32 accumulator: dqk % 16 == 0).
  // Validation guarantees these for CUDA tensors; they are checked again because the kernels
  // rely on them.
  auto rows16 = [](const Shd& t, int64_t s, int64_t h) {
    return t.sd == 1 && is_aligned(t.data, 16) && (t.sh % 8 == 0 || h == 1) &&
           (t.ss % 8 == 0 || s == 1);
  };
  const bool layout_ok = rows16(p.q, d.Sq, d.H) && rows16(p.out, d.Sq, d.H) &&
                         rows16(p.dout, d.Sq, d.H) && rows16(p.kv, d.Skv, 1) && p.dq.sd == 1 &&
                         is_aligned(p.dq.data, 4) && (p.dq.sh % 2 == 0 || d.H == 1) &&
                         (p.dq.ss % 2 == 0 || d.Sq == 1) && p.dkv.sd == 1 &&
                         is_aligned(p.dkv.data, 8) && (p.dkv.ss % 4 == 0 || d.Skv == 1);
  if (!layout_ok) {
    return "q, kv, out, dout, dq, dkv: the last dimension must be contiguous and rows 16-byte "
           "aligned";
  }
  return "";
}

}  // namespace sa::portable

namespace sa::portable::dsa_bwd {
namespace {

// Partial dkv rows of one deterministic slice: at most this many bytes (at least one token).
constexpr int64_t kPartialBytesCap = int64_t{2} << 30;
constexpr size_t kAlign = 256;

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Steps 1f (row flags, slot counts, FixCtl) and 1g of both fixed-point plans: the counts and
// maxima into FixCtl, and prm's fixed-point fields but the accumulator's; returns the scale's
// arguments.
FixScaleArgs fixed_setup(const DsaBwdProblem& p, const WorkspacePlan& plan, uint8_t* base,
                         const SlotKeyArgs& rows, DsaBwdParams& prm, cudaStream_t stream) {
  const DsaDims& d = p.dims;
  auto* bad = reinterpret_cast<uint32_t*>(base + plan.bad);
  auto* counts = reinterpret_cast<uint32_t*>(base + plan.counts);
  auto* ctl = reinterpret_cast<FixCtl*>(base + plan.ctl);
  SA_CUDA_CHECK(cudaMemsetAsync(bad, 0, static_cast<size_t>(d.Skv) * 4, stream));
  SA_CUDA_CHECK(cudaMemsetAsync(counts, 0, static_cast<size_t>(d.Skv) * 4, stream));
  SA_CUDA_CHECK(cudaMemsetAsync(ctl, 0, sizeof(FixCtl), stream));
  fix_count_keys(rows, d.Sq, counts, stream);
  const FixRows q{p.q.data, p.q.ss, p.q.sh, d.Sq, d.H, static_cast<int>(d.Dqk)};
  const FixRows dout{p.dout.data, p.dout.ss, p.dout.sh, d.Sq, d.H, static_cast<int>(d.Dv)};
  const FixRows kv{p.kv.data, p.kv.ss, 0, d.Skv, 1, static_cast<int>(d.Dqk)};
  fix_input_maxima(q, dout, kv, counts, d.Skv, p.dtype, ctl, stream);
  prm.dkv_bad = bad;
  prm.fix_ctl = ctl;
  prm.tok_begin = 0;
  prm.fix_rows = static_cast<int32_t>(std::min<int64_t>(d.H, plan.heads_per_cta));
  return FixScaleArgs{ctl, prm.scale, prm.fix_rows, static_cast<int>(plan.groups)};
}

// Steps 1f-3f (dsa_backward_driver.hpp): deterministic mode by fixed point. prm holds the
// workspace pointers of the other steps (d_sink terms, item counter).
void run_fixed(const DsaBwdProblem& p, const WorkspacePlan& plan, uint8_t* base,
               const SlotKeyArgs& rows, DsaBwdParams prm, const KernelPolicy& kernel,
               cudaStream_t stream) {
  const DsaDims& d = p.dims;
  auto* fix = reinterpret_cast<int64_t*>(base + plan.fix);
  const int64_t n = d.Skv * d.Dqk;  // (the spare row after them is never read)
  SA_CUDA_CHECK(cudaMemsetAsync(fix, 0, static_cast<size_t>(n) * 8, stream));
  const FixScaleArgs scale = fixed_setup(p, plan, base, rows, prm, stream);
  prm.dkv_fix = fix;
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) fix_zero_if_retry(fix, n, scale, stream);
    prm.fix_pass = pass;
    kernel.launch(prm, d.Sq * plan.groups, p.device_index, stream);
  }
  convert_dkv_fixed(fix, prm.dkv_bad, scale, p.dkv.data, p.dtype, d.Skv, static_cast<int>(d.Dqk),
                    p.dkv.ss, stream);
}

// The binned plan's steps (dsa_backward_driver.hpp): both forms' kernels on each pass, the form
// picked on the device (cuda/dsa_binned_fixed.cuh).
void run_binned(const DsaBwdProblem& p, const WorkspacePlan& plan, uint8_t* base,
                const SlotKeyArgs& rows, DsaBwdParams prm, const KernelPolicy& kernel,
                cudaStream_t stream) {
  const DsaDims& d = p.dims;
  const int dqk = static_cast<int>(d.Dqk);
  auto* bins = reinterpret_cast<uint64_t*>(base + plan.fix);
  // Every plane with its spare row (one contiguous range; the int64 form's rows are its start).
  const int64_t words = kBinCount * bin_plane_words(d.Skv, dqk);
  SA_CUDA_CHECK(cudaMemsetAsync(bins, 0, static_cast<size_t>(words) * 8, stream));
  const BinArgs args{fixed_setup(p, plan, base, rows, prm, stream),
                     kernel.bin_min_resolution > 0 ? kernel.bin_min_resolution
                                                   : kBinMinResolution};
  prm.dkv_bins = bins;
  prm.dkv_fix = reinterpret_cast<int64_t*>(bins);
  prm.fix_bin_min = args.min_resolution;
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) bin_zero_if_retry(bins, d.Skv, dqk, args, stream);
    prm.fix_pass = pass;
    kernel.launch_binned(prm, d.Sq * plan.groups, p.device_index, stream);
  }
  convert_dkv_binned(bins, prm.dkv_bad, args, p.dkv.data, p.dtype, d.Skv, dqk, p.dkv.ss, stream);
}

// Steps 1-3 (or 2g and 2, or 2a-2d per slice; dsa_backward_driver.hpp): dkv through the fp32
// accumulator prm.dkv_acc.
void run_accumulated(const DsaBwdProblem& p, const WorkspacePlan& plan, uint8_t* base,
                     const SlotKeyArgs& rows, DsaBwdParams prm, const KernelPolicy& kernel,
                     cudaStream_t stream) {
  const DsaDims& d = p.dims;
  const int dqk = static_cast<int>(d.Dqk);
  float* acc = prm.dkv_acc;
  SA_CUDA_CHECK(cudaMemsetAsync(acc, 0, static_cast<size_t>(d.Skv * d.Dqk) * 4, stream));
  if (plan.group_tokens > 0) {
    const int G = plan.group_tokens;
    const int64_t all = (d.Sq + G - 1) / G;
    TokenGroupArgs groups{};
    groups.rows = rows;
    groups.sq = d.Sq;
    groups.G = G;
    groups.cap = plan.group_cap;
    groups.keys = reinterpret_cast<int32_t*>(base + plan.group_keys);
    groups.mult = reinterpret_cast<uint32_t*>(base + plan.group_mult);
    groups.entries = reinterpret_cast<int32_t*>(base + plan.group_len);
    groups.present = reinterpret_cast<uint32_t*>(base + plan.group_present);
    prm.group_keys = groups.keys;
    prm.group_mult = groups.mult;
    prm.group_len = groups.entries;
    prm.group_present = groups.present;
    prm.group_cap = plan.group_cap;
    // A group is one "token" of 64 heads (token_groups_eligible: token stride = H x head stride).
    prm.q_ss *= G;
    prm.o_ss *= G;
    prm.do_ss *= G;
    prm.dq_ss *= G;
    prm.lse_ss *= G;
    prm.head_groups = 1;
    for (int64_t first = 0; first < all; first += plan.group_slice) {
      groups.first = first;
      groups.groups = std::min(plan.group_slice, all - first);
      build_token_groups(groups, stream);
      prm.tok_begin = first;  // the slice's first group, as a token of 64 heads
      kernel.launch(prm, groups.groups, p.device_index, stream);
    }
  } else if (!plan.deterministic) {
    prm.tok_begin = 0;
    kernel.launch(prm, d.Sq * plan.groups, p.device_index, stream);
  } else {
    auto* keys_in = reinterpret_cast<uint32_t*>(base + plan.keys_in);
    auto* keys_out = reinterpret_cast<uint32_t*>(base + plan.keys_out);
    auto* vals_in = reinterpret_cast<uint32_t*>(base + plan.vals_in);
    auto* vals_out = reinterpret_cast<uint32_t*>(base + plan.vals_out);
    prm.dkv_part = reinterpret_cast<float*>(base + plan.part);
    for (int64_t t0 = 0; t0 < d.Sq; t0 += plan.slice) {
      const int64_t tokens = std::min(plan.slice, d.Sq - t0);
      const int items = static_cast<int>(tokens * d.topk);
      slot_keys(rows, t0, tokens, keys_in, vals_in, stream);
      sort_slots(base + plan.cub, plan.cub_bytes, keys_in, keys_out, vals_in, vals_out, items,
                 plan.end_bit, stream);
      prm.tok_begin = t0;
      kernel.launch(prm, tokens * plan.groups, p.device_index, stream);
      reduce_partials(keys_out, vals_out, items, prm.dkv_part, acc, d.Skv, dqk, prm.topk,
                      static_cast<int>(plan.groups), stream);
    }
  }
  // Deterministic mode's fixed-order reduction writes the accumulator in natural order.
  convert_dkv(acc, p.dkv.data, p.dtype, d.Skv, dqk, p.dkv.ss,
              plan.deterministic ? AccColumns::kNatural : kernel.reduce_columns, stream);
}

}  // namespace

WorkspacePlan plan_workspace(const DsaBwdProblem& p, int heads_per_cta, int64_t slice_tokens) {
  KernelPolicy kernel;
  kernel.heads_per_cta = heads_per_cta;
  return plan_workspace(p, kernel, slice_tokens);
}

WorkspacePlan plan_workspace(const DsaBwdProblem& p, const KernelPolicy& kernel,
                             int64_t slice_tokens) {
  const int heads_per_cta = kernel.heads_per_cta;
  const DsaDims& d = p.dims;
  WorkspacePlan plan;
  plan.heads_per_cta = heads_per_cta;
  plan.groups = (d.H + plan.heads_per_cta - 1) / plan.heads_per_cta;
  plan.deterministic = p.options.deterministic != 0;
  size_t at = 0;
  auto take = [&at](int64_t bytes) {
    const size_t offset = at;
    at = align_up(at + static_cast<size_t>(bytes));
    return offset;
  };
  plan.fixed = plan.deterministic && kernel.fixed_point;
  plan.binned = plan.fixed && kernel.launch_binned != nullptr;
  if (plan.fixed) {
    // int64 rows + the spare row of inactive slots, or the binned planes (each with its spare
    // row; the binned plan's int64 form takes the first two).
    plan.fix = take(plan.binned ? kBinCount * bin_plane_words(d.Skv, static_cast<int>(d.Dqk)) * 8
                                : (d.Skv + 1) * d.Dqk * 8);
    plan.bad = take(d.Skv * 4);
    plan.counts = take(d.Skv * 4);
    plan.ctl = take(sizeof(FixCtl));
  } else {
    plan.acc = take(d.Skv * d.Dqk * 4);
  }
  if (p.d_sink != nullptr) plan.terms = take(d.H * d.Sq * 4);
  if (p.meta.topk_length.data != nullptr) {
    plan.counter = true;
    plan.counter_at = take(4);
  }
  if (plan.deterministic && !plan.fixed) {
    const int64_t per_token = plan.groups * d.topk * d.Dqk * 4;
    plan.slice =
        slice_tokens > 0 ? slice_tokens : std::max<int64_t>(1, kPartialBytesCap / per_token);
    plan.slice = std::min<int64_t>({plan.slice, d.Sq, INT32_MAX / d.topk});
    const int64_t items = plan.slice * d.topk;
    plan.part = take(plan.slice * per_token);
    plan.keys_in = take(items * 4);
    plan.keys_out = take(items * 4);
    plan.vals_in = take(items * 4);
    plan.vals_out = take(items * 4);
    plan.end_bit = key_bits(d.Skv);
    const int64_t last = (d.Sq - 1) % plan.slice + 1;  // tokens of the last slice
    plan.cub_bytes = std::max(sort_temp_bytes(static_cast<int>(items), plan.end_bit),
                              sort_temp_bytes(static_cast<int>(last * d.topk), plan.end_bit));
    plan.cub = take(static_cast<int64_t>(plan.cub_bytes));
  }
  if (kernel.token_groups && token_groups_eligible(p)) {
    SA_CHECK(heads_per_cta == kGroupRows, SA_ERROR_INTERNAL,
             kernel.op << ": token groups need 64 rows per work item");
    plan.group_tokens = group_tokens(d.H);
    plan.group_cap = group_capacity(d.Skv, d.topk, plan.group_tokens);
    const int64_t all = (d.Sq + plan.group_tokens - 1) / plan.group_tokens;
    const int64_t per_group = plan.group_cap * 8 + 8;
    if (slice_tokens > 0) {
      plan.group_slice = std::min(all, std::max<int64_t>(1, slice_tokens / plan.group_tokens));
    } else {
      // As few slices as the cap allows, of equal size (no short last slice).
      const int64_t most = std::max<int64_t>(1, kGroupUnionBytesCap / per_group);
      const int64_t slices = (all + most - 1) / most;
      plan.group_slice = (all + slices - 1) / slices;
    }
    const int64_t items = plan.group_slice;
    if (!plan.counter) {
      plan.counter = true;
      plan.counter_at = take(4);
    }
    plan.group_keys = take(items * plan.group_cap * 4);
    plan.group_mult = take(items * plan.group_cap * 4);
    plan.group_len = take(items * 4);
    plan.group_present = take(items * 4);
  }
  plan.total = at + kAlign;  // the caller's pointer may be aligned to less
  return plan;
}

size_t workspace_bytes(const DsaBwdProblem& p, const KernelPolicy& kernel, int64_t slice_tokens) {
  return plan_workspace(p, kernel, slice_tokens).total;
}

void run(const DsaBwdProblem& p, void* workspace, size_t workspace_bytes, cudaStream_t stream,
         const KernelPolicy& kernel, int64_t slice_tokens) {
  const char* op = kernel.op;
  const WorkspacePlan plan = plan_workspace(p, kernel, slice_tokens);
  int current = -1;
  SA_CUDA_CHECK(cudaGetDevice(&current));
  SA_CHECK(current == p.device_index, SA_ERROR_INTERNAL,
           op << ": device " << p.device_index << " is not current (" << current << " is)");
  const DsaDims& d = p.dims;
  SA_CHECK(workspace != nullptr && workspace_bytes >= plan.total, SA_ERROR_WORKSPACE,
           op << ": needs " << plan.total << " bytes of workspace, got " << workspace_bytes
              << (workspace == nullptr ? " (null)" : ""));
  uint8_t* base = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(workspace)));
  DsaBwdParams prm = make_params(p, plan.heads_per_cta);
  prm.dkv_acc = plan.fixed ? nullptr : reinterpret_cast<float*>(base + plan.acc);
  prm.sink_terms = p.d_sink != nullptr ? reinterpret_cast<float*>(base + plan.terms) : nullptr;
  // The counter with topk_length or token groups (the plan may hold one for token groups that a
  // policy without them leaves unused: static items then, as without it).
  const bool dynamic = p.meta.topk_length.data != nullptr || plan.group_tokens > 0;
  prm.item_counter =
      plan.counter && dynamic ? reinterpret_cast<uint32_t*>(base + plan.counter_at) : nullptr;

  // The index rows as the union builder and the deterministic pass read them.
  SlotKeyArgs rows{};
  rows.idx = prm.idx;
  rows.len = prm.len;
  rows.idx_ss = prm.idx_ss;
  rows.idx_si = prm.idx_si;
  rows.len_s = prm.len_s;
  rows.skv = d.Skv;
  rows.topk = prm.topk;

  // 1-3 (or their variants), 4: see dsa_backward_driver.hpp.
  if (plan.binned) {
    run_binned(p, plan, base, rows, prm, kernel, stream);
  } else if (plan.fixed) {
    run_fixed(p, plan, base, rows, prm, kernel, stream);
  } else {
    run_accumulated(p, plan, base, rows, prm, kernel, stream);
  }
  if (p.d_sink != nullptr) {
    reduce_d_sink(prm.sink_terms, d.Sq, d.H, p.d_sink, p.d_sink_stride, p.meta.sink != nullptr,
                  stream);
  }
}

}  // namespace sa::portable::dsa_bwd
