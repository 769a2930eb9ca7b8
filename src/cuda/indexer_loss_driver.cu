// The indexer KL loss and its gradients, host side, shared by every CUDA path
// (indexer_loss_driver.hpp): support checks, the workspace plan and the launches. Kernels: an
// arch's target (TargetLaunch: sm80/ or sm90/indexer_target_kernel.cuh; log A per slot and head
// group), indexer_loss_kernel.cuh (per token: K_t, the indexer scores, the loss, dq_I, dw, dk_I);
// dk_I's accumulation reuses the DSA backward's passes (dsa_backward_aux.hpp).
//
// Sparse mode, launches on the caller's stream:
//   1. target   log A_g[g, t, i] for every active slot                   (workspace)
//   2. memset   dk accumulator [S_kv, 128] fp32 = 0                      (gradients only)
//   3. loss     S_q CTAs (the arch's LossLaunch where it serves the call, else the portable
//               kernel; both modes): the row losses -> workspace (and loss_per_token), dq_I, dw; dk rows
//               as fp32 reductions into the accumulator
//   4. convert  dk_I = the accumulator in bf16, every element
//   5. total    loss = the row losses summed in a fixed order (one CTA)
// Deterministic mode (options.deterministic, with gradients): fp32 reductions would make dk_I's
// last bits depend on arrival order, so step 3 runs in slices of T tokens, as the DSA backward
// does: slot keys (SPEC 2's active rule) -> stable radix sort -> the loss kernel stores each
// slot's dk row into its partial row (zeros for active slots outside K_t) -> a fixed-order sum
// per key. loss, loss_per_token, dq_I and dw are reduced in a fixed order in every mode (the
// targets are deterministic too: fixed-order reductions).
//
// Dense mode (no topk_idx): K_t is the range, which may span every key, so nothing of size
// [S_q, S_kv] exists. Tokens run in slices of T (T x groups x S_kv fp32 of log A at most
// kLogABytesCap): per slice, 1 (the target over each token's range, contiguous kv rows) then 3
// (streaming: online normalizers, the loss from running sums, the gradients in a second pass
// over the keys that recomputes I and reads log A back). The target, the expensive part
// (H x D_qk per pair against H_I x D_I), is computed once per pair. dk_I by fp32 reductions;
// deterministic dk_I is not served in dense mode yet (it would need per-(token, key) partial
// rows or a key-major pass).
#include "cuda/indexer_loss_driver.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <sstream>

#include "common/cuda_check.hpp"
#include "common/cuda_device.hpp"
#include "common/host_numeric.hpp"
#include "cuda/dsa_backward_aux.hpp"
#include "cuda/indexer_checks.hpp"
#include "cuda/indexer_loss_kernel.cuh"

namespace sa::portable::indexer {
namespace {

constexpr size_t kAlign = 256;
// Partial dk rows of one deterministic slice: at most this many bytes (at least one token).
constexpr int64_t kPartialBytesCap = int64_t{1} << 30;
// Dense mode: log A of one slice of tokens, at most this many bytes (at least one token).
constexpr int64_t kLogABytesCap = int64_t{512} << 20;

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

int loss_smem_bytes(int64_t heads, int topk) {
  switch (heads) {
    case 16:
      return LossConfig<16>::smem_bytes(topk);
    case 32:
      return LossConfig<32>::smem_bytes(topk);
    default:
      return LossConfig<64>::smem_bytes(topk);
  }
}

// Byte offsets of the workspace parts (from a 256-byte aligned base); every size comes from the
// shapes and the options, never from metadata values.
struct Plan {
  int64_t groups = 0;
  bool grads = false, deterministic = false, dense = false;
  int64_t slice = 0;        // deterministic mode: tokens per slice
  int64_t dense_slice = 0;  // dense mode: tokens per slice
  int end_bit = 0;
  size_t cub_bytes = 0;
  size_t log_a = 0, rows = 0, acc = 0, part = 0, keys_in = 0, keys_out = 0, vals_in = 0,
         vals_out = 0, cub = 0;
  size_t total = 0;
};

Plan make_plan(const IndexerLossProblem& p) {
  const IndexerDims& d = p.dims;
  Plan plan;
  plan.groups = (d.H + 63) / 64;
  plan.grads = p.has_grad();
  plan.dense = !p.meta.sparse();
  plan.deterministic = plan.grads && p.options.deterministic != 0 && !plan.dense;
  size_t at = 0;
  auto take = [&at](int64_t bytes) {
    const size_t offset = at;
    at = align_up(at + static_cast<size_t>(bytes));
    return offset;
  };
  if (plan.dense) {
    const int64_t per_token = plan.groups * d.Skv * 4;
    plan.dense_slice = std::min<int64_t>(d.Sq, std::max<int64_t>(1, kLogABytesCap / per_token));
    plan.log_a = take(plan.groups * plan.dense_slice * d.Skv * 4);
  } else {
    plan.log_a = take(plan.groups * d.Sq * d.topk * 4);
  }
  plan.rows = take(d.Sq * 4);
  if (plan.grads) plan.acc = take(d.Skv * 128 * 4);
  if (plan.deterministic) {
    const int64_t per_token = d.topk * 128 * 4;
    plan.slice = std::max<int64_t>(1, kPartialBytesCap / per_token);
    plan.slice = std::min<int64_t>({plan.slice, d.Sq, INT32_MAX / d.topk});
    const int64_t items = plan.slice * d.topk;
    plan.part = take(plan.slice * per_token);
    plan.keys_in = take(items * 4);
    plan.keys_out = take(items * 4);
    plan.vals_in = take(items * 4);
    plan.vals_out = take(items * 4);
    plan.end_bit = dsa_bwd::key_bits(d.Skv);
    const int64_t last = (d.Sq - 1) % plan.slice + 1;
    plan.cub_bytes =
        std::max(dsa_bwd::sort_temp_bytes(static_cast<int>(items), plan.end_bit),
                 dsa_bwd::sort_temp_bytes(static_cast<int>(last * d.topk), plan.end_bit));
    plan.cub = take(static_cast<int64_t>(plan.cub_bytes));
  }
  plan.total = at + kAlign;
  return plan;
}

// loss = sum of the row losses, in a fixed order: each thread a fixed stride, then a fixed tree.
constexpr int kTotalThreads = 256;
__global__ void __launch_bounds__(kTotalThreads)
    loss_total_kernel(const float* __restrict__ rows, int64_t sq, float* __restrict__ loss) {
  __shared__ float part[kTotalThreads];
  float sum = 0.f;
  for (int64_t t = threadIdx.x; t < sq; t += kTotalThreads) sum += rows[t];
  part[threadIdx.x] = sum;
  __syncthreads();
  for (int off = kTotalThreads / 2; off > 0; off /= 2) {
    if (static_cast<int>(threadIdx.x) < off) part[threadIdx.x] += part[threadIdx.x + off];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = part[0];
}

template <int kHeads, bool kDense>
void launch_loss_for(const LossParams& prm, int64_t tokens, cudaStream_t stream) {
  using Cfg = LossConfig<kHeads>;
  auto* kernel = &loss_kernel<Cfg, kDense>;
  const int smem = Cfg::smem_bytes(prm.topk);
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<static_cast<unsigned>(tokens), Cfg::kThreads, smem, stream>>>(prm);
  SA_CUDA_CHECK_LAUNCH();
}

template <bool kDense>
void launch_loss(int64_t heads, const LossParams& prm, int64_t tokens,
                 cudaStream_t stream) {
  if (tokens == 0) return;
  switch (heads) {
    case 16:
      launch_loss_for<16, kDense>(prm, tokens, stream);
      break;
    case 32:
      launch_loss_for<32, kDense>(prm, tokens, stream);
      break;
    default:
      launch_loss_for<64, kDense>(prm, tokens, stream);
      break;
  }
}

}  // namespace

std::string loss_unsupported(const IndexerLossProblem& p, const LossDriverOptions& o) {
  const char* const kPath = o.path;
  const IndexerDims& d = p.dims;
  std::string why = indexer_inputs_unsupported(p, kPath);
  if (!why.empty()) return why;
  std::ostringstream os;
  const std::string contract = indexer_gpu_contract(p);
  if (!contract.empty()) {
    os << contract << " (" << kPath << ")";
    return os.str();
  }
  if (!p.meta.sparse() && p.has_grad() && p.options.deterministic) {
    os << "options.deterministic in dense mode (no topk_idx): not implemented on the " << kPath
       << " (sparse mode serves it)";
    return os.str();
  }
  if (d.Dqk != 512 && d.Dqk != 576) {
    os << "q: D_qk = " << d.Dqk << " (" << kPath << " supports 512, 576)";
    return os.str();
  }
  auto rows16 = [](const Shd& t, int64_t s, int64_t h) {
    return t.sd == 1 && is_aligned(t.data, 16) && (t.sh % 8 == 0 || h == 1) &&
           (t.ss % 8 == 0 || s == 1);
  };
  if (!rows16(p.q, d.Sq, d.H) || !rows16(p.kv, d.Skv, 1)) {
    os << "q, kv: the last dimension must be contiguous and rows 16-byte aligned (" << kPath
       << ")";
    return os.str();
  }
  if (p.has_grad() &&
      (p.dq_I.sd != 1 || p.dk_I.sd != 1 || !is_aligned(p.dq_I.data, 4) ||
       !is_aligned(p.dk_I.data, 8) || p.dq_I.sh % 2 != 0 || p.dq_I.ss % 2 != 0 ||
       (p.dk_I.ss % 4 != 0 && d.Skv > 1))) {
    os << "dq_I, dk_I: the last dimension must be contiguous and rows 8-byte aligned (" << kPath
       << ")";
    return os.str();
  }
  if (d.H > INT32_MAX - 64 || d.Sq * ((d.H + 63) / 64) > INT32_MAX || d.Sq > INT32_MAX) {
    os << "S_q = " << d.Sq << ", H = " << d.H << " (" << kPath
       << " supports S_q * ceil(H / 64) < 2^31)";
    return os.str();
  }
  const int max_topk = 8192;
  if (d.topk > max_topk) {
    os << "topk = " << d.topk << " (" << kPath << " supports up to " << max_topk << ")";
    return os.str();
  }
  why = smem_unsupported(p.device_index, static_cast<size_t>(o.target_smem_bytes));
  if (!why.empty()) return why + " (" + kPath + ", attention target)";
  why = smem_unsupported(p.device_index,
                         loss_smem_bytes(d.HI, p.meta.sparse() ? static_cast<int>(d.topk) : 0));
  if (!why.empty()) return why + " (" + kPath + ")";
  return "";
}

size_t loss_workspace_bytes(const IndexerLossProblem& p) {
  return make_plan(p).total;
}

void loss_run(const IndexerLossProblem& p, void* workspace, size_t workspace_bytes,
              const LossDriverOptions& o, cudaStream_t stream) {
  const std::string why = loss_unsupported(p, o);
  SA_CHECK(why.empty(), SA_ERROR_UNSUPPORTED, "indexer_loss (" << o.path << "): " << why);
  int current = -1;
  SA_CUDA_CHECK(cudaGetDevice(&current));
  SA_CHECK(current == p.device_index, SA_ERROR_INTERNAL,
           "indexer_loss (" << o.path << "): device " << p.device_index << " is not current ("
                                << current << " is)");
  const IndexerDims& d = p.dims;
  const Plan plan = make_plan(p);
  SA_CHECK(workspace != nullptr && workspace_bytes >= plan.total, SA_ERROR_WORKSPACE,
           "indexer_loss (" << o.path << "): needs " << plan.total
                            << " bytes of workspace, got " << workspace_bytes
                            << (workspace == nullptr ? " (null)" : ""));
  uint8_t* base = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(workspace)));
  float* log_a = reinterpret_cast<float*>(base + plan.log_a);
  float* rows = reinterpret_cast<float*>(base + plan.rows);
  float* acc = plan.grads ? reinterpret_cast<float*>(base + plan.acc) : nullptr;
  const int topk = static_cast<int>(d.topk);

  // The target's and the loss kernel's arguments (log A's layout is set per mode below).
  TargetParams tp{};
  tp.q = static_cast<const __nv_bfloat16*>(p.q.data);
  tp.kv = static_cast<const __nv_bfloat16*>(p.kv.data);
  tp.lse = p.lse;
  tp.idx = p.meta.topk_idx.data;
  tp.len = p.meta.topk_length.data;
  tp.dims = d;
  tp.meta = p.meta;
  tp.log_a = log_a;
  tp.q_ss = p.q.ss;
  tp.q_sh = p.q.sh;
  tp.kv_ss = p.kv.ss;
  tp.lse_ss = p.lse_stride[0];
  tp.lse_sh = p.lse_stride[1];
  tp.idx_ss = p.meta.topk_idx.stride[0];
  tp.idx_si = p.meta.topk_idx.stride[1];
  tp.len_s = p.meta.topk_length.stride[0];
  tp.skv = d.Skv;
  tp.H = static_cast<int32_t>(d.H);
  tp.topk = topk;
  tp.head_groups = static_cast<int32_t>(plan.groups);
  tp.qk_chunks = static_cast<int32_t>(d.Dqk / 8);
  tp.scale_log2 = scale_times_log2e(p.attn_scale);

  LossParams lp{};
  lp.q_I = static_cast<const __nv_bfloat16*>(p.in.q_I.data);
  lp.k_I = static_cast<const __nv_bfloat16*>(p.in.k_I.data);
  lp.w = static_cast<const float*>(p.in.w);
  lp.qi_ss = p.in.q_I.ss;
  lp.qi_sh = p.in.q_I.sh;
  lp.ki_ss = p.in.k_I.ss;
  lp.w_ss = p.in.w_stride[0];
  lp.w_sh = p.in.w_stride[1];
  lp.dims = d;
  lp.meta = p.meta;
  lp.scale_I = p.scale;
  lp.coeff = p.options.coeff;
  lp.log_a = log_a;
  lp.head_groups = static_cast<int32_t>(plan.groups);
  lp.topk = topk;
  lp.loss_rows = rows;
  lp.loss_per_token = static_cast<float*>(p.loss_per_token);
  lp.lpt_s = p.loss_per_token_stride;
  lp.grads = plan.grads ? 1 : 0;
  lp.dk_acc = acc;
  if (plan.grads) {
    lp.dq_I = static_cast<__nv_bfloat16*>(p.dq_I.data);
    lp.dq_ss = p.dq_I.ss;
    lp.dq_sh = p.dq_I.sh;
    lp.dw = static_cast<float*>(p.dw);
    lp.dw_ss = p.dw_stride[0];
    lp.dw_sh = p.dw_stride[1];
    SA_CUDA_CHECK(cudaMemsetAsync(acc, 0, static_cast<size_t>(d.Skv * 128) * 4, stream));
  }

  bool arch_loss = false;  // o.loss served step 3 (every slice of it)
  if (plan.dense) {
    // Dense mode: per slice of tokens, 1. the target over the ranges, 3. the streaming loss.
    tp.la_gs = lp.la_gs = plan.dense_slice * d.Skv;
    tp.la_ts = lp.la_ts = d.Skv;
    for (int64_t t0 = 0; t0 < d.Sq; t0 += plan.dense_slice) {
      const int64_t tokens = std::min(plan.dense_slice, d.Sq - t0);
      tp.tok_begin = t0;
      o.target(tp, true, tokens, p.device_index, stream);
      lp.la_tok0 = lp.tok_begin = t0;
      const bool arch = o.loss != nullptr && o.loss(lp, true, d.HI, tokens, stream);
      if (!arch) launch_loss<true>(d.HI, lp, tokens, stream);
      SA_CHECK(t0 == 0 || arch == arch_loss, SA_ERROR_INTERNAL,
               o.path << ": the loss kernel changed between dense slices");
      arch_loss = arch;
    }
  } else {
    // Sparse mode: 1. the target of every token, then 3. (in slices when deterministic).
    tp.la_gs = lp.la_gs = d.Sq * d.topk;
    tp.la_ts = lp.la_ts = d.topk;
    tp.tok_begin = lp.la_tok0 = 0;
    o.target(tp, false, d.Sq, p.device_index, stream);
    if (!plan.deterministic) {
      lp.tok_begin = 0;
      arch_loss = o.loss != nullptr && o.loss(lp, false, d.HI, d.Sq, stream);
      if (!arch_loss) launch_loss<false>(d.HI, lp, d.Sq, stream);
    } else {
      auto* keys_in = reinterpret_cast<uint32_t*>(base + plan.keys_in);
      auto* keys_out = reinterpret_cast<uint32_t*>(base + plan.keys_out);
      auto* vals_in = reinterpret_cast<uint32_t*>(base + plan.vals_in);
      auto* vals_out = reinterpret_cast<uint32_t*>(base + plan.vals_out);
      lp.dk_acc = nullptr;
      lp.dk_part = reinterpret_cast<float*>(base + plan.part);
      dsa_bwd::SlotKeyArgs keys{};
      keys.idx = p.meta.topk_idx.data;
      keys.len = p.meta.topk_length.data;
      keys.idx_ss = p.meta.topk_idx.stride[0];
      keys.idx_si = p.meta.topk_idx.stride[1];
      keys.len_s = p.meta.topk_length.stride[0];
      keys.skv = d.Skv;
      keys.topk = topk;
      for (int64_t t0 = 0; t0 < d.Sq; t0 += plan.slice) {
        const int64_t tokens = std::min(plan.slice, d.Sq - t0);
        const int items = static_cast<int>(tokens * d.topk);
        dsa_bwd::slot_keys(keys, t0, tokens, keys_in, vals_in, stream);
        dsa_bwd::sort_slots(base + plan.cub, plan.cub_bytes, keys_in, keys_out, vals_in,
                            vals_out, items, plan.end_bit, stream);
        lp.tok_begin = t0;
        launch_loss<false>(d.HI, lp, tokens, stream);
        dsa_bwd::reduce_partials(keys_out, vals_out, items, lp.dk_part, acc, d.Skv, 128, topk, 1,
                                 stream);
      }
    }
  }
  // 4. dk_I, in the column order of the kernel that reduced it (deterministic mode's fixed-order
  // sums and the portable kernel: natural).
  if (plan.grads)
    dsa_bwd::convert_dkv(acc, p.dk_I.data, SA_DTYPE_BF16, d.Skv, 128, p.dk_I.ss,
                         arch_loss ? o.loss_columns : dsa_bwd::AccColumns::kNatural, stream);
  // 5. The total.
  loss_total_kernel<<<1, kTotalThreads, 0, stream>>>(rows, d.Sq, static_cast<float*>(p.loss));
  SA_CUDA_CHECK_LAUNCH();
}

}  // namespace sa::portable::indexer
