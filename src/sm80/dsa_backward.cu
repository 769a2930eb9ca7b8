// Portable DSA backward, host side: support checks, the variant (heads per CTA), the workspace
// plan and the launches. The main kernel and its design are in dsa_backward_kernel.cuh, the
// helper kernels in dsa_backward_aux.cu.
//
// Launches on the caller's stream (default, fp32 atomics):
//   1. memset   dkv_acc [S_kv, D_qk] fp32 = 0                                  (workspace)
//   2. main     S_q x ceil(H / M) CTAs: dq; one fp32 reduction per (CTA, active slot, column)
//               into dkv_acc; the d_sink term -exp(sink - L) delta of each (t, h) -> [H, S_q]
//   3. convert  dkv = dkv_acc in kv's dtype, every element (rows no slot selects become 0)
//   4. d_sink   per head, the terms summed in a fixed order; zeros without a sink
//
// Deterministic mode (options.deterministic). fp32 reductions add in arrival order, so dkv would
// differ in its last bits from run to run. Instead, tokens are processed in slices of T tokens
// (T such that the slice's partial rows take at most kPartialBytesCap), each slice:
//   2a. slot keys  item e = (t - t0) * topk + i of every slot of the slice; key = its kv row when
//                  the slot is active, else S_kv (sorts last, never read)
//   2b. sort       cub radix sort of (key, item) by key; it is stable, so the items of a key stay
//                  in ascending order: the inverse index, deterministic by construction
//   2c. main       the same kernel with deterministic = 1: each CTA stores its chunk's
//                  head-reduced dkv rows into its own partial row (t - t0, head group, slot)
//                  with plain stores instead of reducing
//   2d. reduce     a block per key j: dkv_acc[j] += its items' partial rows in sorted order
//                  (groups in order): a fixed order, the same sums on every run
// then 3 and 4 as above. d_sink is always reduced in a fixed order (no float atomics).
//
// Cost of deterministic mode, estimated at the headline shape (S_q 4096, H 128 -> 2 head groups,
// D_qk 576, topk 2048, all slots active): the partial rows are 2,304 B per (token, group, slot),
// 38.6 GB written by 2c and read once by 2d instead of the same volume of L2-resident
// reductions: ~2 x 38.6 GB / ~3.5 TB/s = ~22 ms of DRAM traffic on top of the main kernel
// (which does the same MMAs), plus 8.4 M-item radix sorts (~1 ms) and 18 slices of launches;
// i.e. roughly 1.5-2x the default mode's time, and up to ~2 GiB more workspace.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <sstream>

#include "common/cuda_check.hpp"
#include "common/cuda_device.hpp"
#include "common/host_numeric.hpp"
#include "sm80/dsa_backward.hpp"
#include "cuda/dsa_backward_aux.hpp"
#include "sm80/dsa_backward_launch.cuh"
#include "cuda/launch_checks.hpp"

namespace sa::portable {
namespace {

using dsa_bwd::BwdConfig;
using dsa_bwd::DsaBwdParams;

// Partial dkv rows of one deterministic slice: at most this many bytes (at least one token).
constexpr int64_t kPartialBytesCap = int64_t{2} << 30;
constexpr size_t kAlign = 256;

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Heads per CTA for `p` on its device (support already checked).
int choose_block_m(const DsaBwdProblem& p, const DsaBackwardTuning& tuning) {
  const int dqk = static_cast<int>(p.dims.Dqk);
  const int smem = max_smem_optin(p.device_index);
  if (tuning.block_m != 0) {
    SA_CHECK(tuning.block_m == 32 || tuning.block_m == 64, SA_ERROR_INVALID_ARGUMENT,
             "dsa_backward tuning.block_m: expected 0, 32 or 64, got " << tuning.block_m);
    SA_CHECK(smem >= dsa_backward_smem_bytes(dqk, tuning.block_m), SA_ERROR_UNSUPPORTED,
             "dsa_backward tuning.block_m = "
                 << tuning.block_m << " needs " << dsa_backward_smem_bytes(dqk, tuning.block_m)
                 << " bytes of shared memory per block (device offers " << smem << ")");
    return tuning.block_m;
  }
  return p.dims.H >= 64 && smem >= dsa_backward_smem_bytes(dqk, 64) ? 64 : 32;
}

// Byte offsets of the workspace parts (from a 256-byte aligned base) and the sizes they derive
// from; every size comes from the shapes and the device, never from metadata values.
struct Plan {
  int block_m = 0;
  int64_t groups = 0;
  bool deterministic = false;
  int64_t slice = 0;  // tokens per deterministic slice
  int end_bit = 0;    // key bits of the sort
  size_t cub_bytes = 0;
  size_t acc = 0, terms = 0, part = 0, keys_in = 0, keys_out = 0, vals_in = 0, vals_out = 0,
         cub = 0;
  bool counter = false;  // an item counter (with topk_length; the Hopper kernel's dynamic items)
  size_t counter_at = 0;
  size_t total = 0;  // including the slack to align the caller's pointer
};

// `block_m`: heads per CTA of the main kernel; `slice_tokens` > 0 pins the deterministic slice.
Plan make_plan(const DsaBwdProblem& p, int block_m, int64_t slice_tokens) {
  const DsaDims& d = p.dims;
  Plan plan;
  plan.block_m = block_m;
  plan.groups = (d.H + plan.block_m - 1) / plan.block_m;
  plan.deterministic = p.options.deterministic != 0;
  size_t at = 0;
  auto take = [&at](int64_t bytes) {
    const size_t offset = at;
    at = align_up(at + static_cast<size_t>(bytes));
    return offset;
  };
  plan.acc = take(d.Skv * d.Dqk * 4);
  if (p.d_sink != nullptr) plan.terms = take(d.H * d.Sq * 4);
  if (p.meta.topk_length.data != nullptr) {
    plan.counter = true;
    plan.counter_at = take(4);
  }
  if (plan.deterministic) {
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
    plan.end_bit = dsa_bwd::key_bits(d.Skv);
    const int64_t last = (d.Sq - 1) % plan.slice + 1;  // tokens of the last slice
    plan.cub_bytes =
        std::max(dsa_bwd::sort_temp_bytes(static_cast<int>(items), plan.end_bit),
                 dsa_bwd::sort_temp_bytes(static_cast<int>(last * d.topk), plan.end_bit));
    plan.cub = take(static_cast<int64_t>(plan.cub_bytes));
  }
  plan.total = at + kAlign;  // the caller's pointer may be aligned to less
  return plan;
}

Plan make_plan(const DsaBwdProblem& p, const DsaBackwardTuning& tuning) {
  return make_plan(p, choose_block_m(p, tuning), tuning.deterministic_slice_tokens);
}

// The portable main kernels, by (D_qk, heads per CTA) (explicitly instantiated in
// dsa_backward_d<D_qk>_m<heads>.cu).
DsaBackwardMainKernel portable_main(int dqk, int block_m) {
  if (dqk == 576)
    return block_m == 64 ? &dsa_bwd::launch_main<576, 64> : &dsa_bwd::launch_main<576, 32>;
  return block_m == 64 ? &dsa_bwd::launch_main<512, 64> : &dsa_bwd::launch_main<512, 32>;
}

// Every pass of the backward around `main` (see the top of this file), on a checked problem.
void run_passes(const DsaBwdProblem& p, void* workspace, size_t workspace_bytes,
                cudaStream_t stream, const Plan& plan, DsaBackwardMainKernel main,
                const char* op, dsa_bwd::AccColumns reduce_columns) {
  int current = -1;
  SA_CUDA_CHECK(cudaGetDevice(&current));
  SA_CHECK(current == p.device_index, SA_ERROR_INTERNAL,
           op << ": device " << p.device_index << " is not current (" << current << " is)");
  const DsaDims& d = p.dims;
  SA_CHECK(workspace != nullptr && workspace_bytes >= plan.total, SA_ERROR_WORKSPACE,
           op << ": needs " << plan.total << " bytes of workspace, got " << workspace_bytes
              << (workspace == nullptr ? " (null)" : ""));
  uint8_t* base = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(workspace)));
  float* acc = reinterpret_cast<float*>(base + plan.acc);

  DsaBwdParams prm = dsa_bwd::make_params(p, plan.block_m);
  prm.dkv_acc = acc;
  prm.sink_terms = p.d_sink != nullptr ? reinterpret_cast<float*>(base + plan.terms) : nullptr;
  prm.item_counter = plan.counter ? reinterpret_cast<uint32_t*>(base + plan.counter_at) : nullptr;
  const int dqk = static_cast<int>(d.Dqk);

  SA_CUDA_CHECK(cudaMemsetAsync(acc, 0, static_cast<size_t>(d.Skv * d.Dqk) * 4, stream));
  if (!plan.deterministic) {
    prm.tok_begin = 0;
    main(prm, d.Sq * plan.groups, p.device_index, stream);
  } else {
    auto* keys_in = reinterpret_cast<uint32_t*>(base + plan.keys_in);
    auto* keys_out = reinterpret_cast<uint32_t*>(base + plan.keys_out);
    auto* vals_in = reinterpret_cast<uint32_t*>(base + plan.vals_in);
    auto* vals_out = reinterpret_cast<uint32_t*>(base + plan.vals_out);
    prm.dkv_part = reinterpret_cast<float*>(base + plan.part);
    dsa_bwd::SlotKeyArgs keys{};
    keys.idx = prm.idx;
    keys.len = prm.len;
    keys.idx_ss = prm.idx_ss;
    keys.idx_si = prm.idx_si;
    keys.len_s = prm.len_s;
    keys.skv = d.Skv;
    keys.topk = prm.topk;
    for (int64_t t0 = 0; t0 < d.Sq; t0 += plan.slice) {
      const int64_t tokens = std::min(plan.slice, d.Sq - t0);
      const int items = static_cast<int>(tokens * d.topk);
      dsa_bwd::slot_keys(keys, t0, tokens, keys_in, vals_in, stream);
      dsa_bwd::sort_slots(base + plan.cub, plan.cub_bytes, keys_in, keys_out, vals_in, vals_out,
                          items, plan.end_bit, stream);
      prm.tok_begin = t0;
      main(prm, tokens * plan.groups, p.device_index, stream);
      dsa_bwd::reduce_partials(keys_out, vals_out, items, prm.dkv_part, acc, d.Skv, dqk, prm.topk,
                               static_cast<int>(plan.groups), stream);
    }
  }
  // Deterministic mode's fixed-order reduction writes the accumulator in natural order.
  dsa_bwd::convert_dkv(acc, p.dkv.data, p.dtype, d.Skv, dqk, p.dkv.ss,
                       plan.deterministic ? dsa_bwd::AccColumns::kNatural : reduce_columns, stream);
  if (p.d_sink != nullptr) {
    dsa_bwd::reduce_d_sink(prm.sink_terms, d.Sq, d.H, p.d_sink, p.d_sink_stride,
                           p.meta.sink != nullptr, stream);
  }
}

}  // namespace

int dsa_backward_smem_bytes(int dqk, int block_m) {
  if (dqk == 576) {
    return block_m == 64 ? BwdConfig<576, 64>::kSmemBytes : BwdConfig<576, 32>::kSmemBytes;
  }
  return block_m == 64 ? BwdConfig<512, 64>::kSmemBytes : BwdConfig<512, 32>::kSmemBytes;
}

std::string dsa_backward_unsupported(const DsaBwdProblem& p) {
  const DsaDims& d = p.dims;
  std::ostringstream os;
  if (p.device != SA_DEVICE_CUDA) return "needs CUDA tensors";
  if (p.dtype != SA_DTYPE_BF16) {
    os << "dtype " << dtype_name(p.dtype) << " (portable DSA backward supports bf16)";
    return os.str();
  }
  const std::string sizes = dsa_sizes_unsupported(d, "portable DSA backward");
  if (!sizes.empty()) return sizes;
  if (d.Skv > INT32_MAX) {
    os << "S_kv = " << d.Skv << " (portable DSA backward supports < 2^31)";
    return os.str();
  }
  if (d.Sq * ((d.H + 31) / 32) > INT32_MAX) {
    os << "S_q = " << d.Sq << " (portable DSA backward supports S_q * ceil(H / 32) < 2^31)";
    return os.str();
  }
  const std::string layout = dsa_backward_layout_unsupported(p);
  if (!layout.empty()) return layout + " (portable DSA backward)";
  return smem_unsupported(p.device_index, dsa_backward_smem_bytes(static_cast<int>(d.Dqk), 32));
}

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

size_t dsa_backward_workspace_bytes(const DsaBwdProblem& p, const DsaBackwardTuning& tuning) {
  return make_plan(p, tuning).total;
}

void dsa_backward(const DsaBwdProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream, const DsaBackwardTuning& tuning) {
  const std::string why = dsa_backward_unsupported(p);
  SA_CHECK(why.empty(), SA_ERROR_UNSUPPORTED, "dsa_backward (portable): " << why);
  const Plan plan = make_plan(p, tuning);
  run_passes(p, workspace, workspace_bytes, stream, plan,
             portable_main(static_cast<int>(p.dims.Dqk), plan.block_m), "dsa_backward (portable)",
             dsa_bwd::AccColumns::kNatural);
}

size_t dsa_backward_workspace_bytes_around(const DsaBwdProblem& p, int heads_per_cta,
                                           int64_t slice_tokens) {
  return make_plan(p, heads_per_cta, slice_tokens).total;
}

void dsa_backward_around(const DsaBwdProblem& p, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream, int heads_per_cta, DsaBackwardMainKernel main,
                         const char* op, dsa_bwd::AccColumns reduce_columns,
                         int64_t slice_tokens) {
  run_passes(p, workspace, workspace_bytes, stream, make_plan(p, heads_per_cta, slice_tokens),
             main, op, reduce_columns);
}

}  // namespace sa::portable
