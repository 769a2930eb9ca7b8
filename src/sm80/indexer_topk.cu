// Portable indexer top-k, host side: support checks, then the two passes of
// cuda/indexer_topk_two_pass.hpp over the portable score kernel (the default), or, when the
// internal tuning asks, the fused kernel (indexer_topk_kernel.cuh): its workspace (the persistent
// CTAs' candidate buffers) and its launch by H_I.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "common/cuda_check.hpp"
#include "common/cuda_device.hpp"
#include "common/tuning.hpp"
#include "cuda/indexer_checks.hpp"
#include "cuda/indexer_topk_two_pass.hpp"
#include "sm80/indexer.hpp"
#include "sm80/indexer_topk_kernel.cuh"

namespace sa::portable {
namespace {

constexpr const char* kPath = "portable indexer top-k";
constexpr size_t kAlign = 256;

int64_t buffer_cap(int64_t k) { return indexer::topk_buffer_cap(k); }

template <int kHeads>
int smem_bytes() {
  return indexer::TopkSmem<indexer::TileConfig<kHeads>>::kBytes;
}

int smem_bytes_for(int64_t heads) {
  return heads == 16 ? smem_bytes<16>() : heads == 32 ? smem_bytes<32>() : smem_bytes<64>();
}

// The launch shape: persistent CTAs, as many as are resident at once (never more than there are
// query blocks). A function of the problem's shapes and device only, so that the workspace size
// and the run agree.
struct Plan {
  int64_t q_blocks = 0;
  int64_t grid = 0;
  int block_q = 0;
  int64_t cap = 0;
  size_t bytes = 0;  // workspace, with slack to align the caller's pointer
};

template <int kHeads>
Plan make_plan_for(const IndexerTopkProblem& p) {
  using Cfg = indexer::TileConfig<kHeads>;
  constexpr int kSmem = indexer::TopkSmem<Cfg>::kBytes;
  Plan plan;
  plan.block_q = Cfg::kBlockQ;
  plan.q_blocks = (p.dims.Sq + Cfg::kBlockQ - 1) / Cfg::kBlockQ;
  auto* kernel = &indexer::topk_kernel<Cfg>;
  SA_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  int per_sm = 0;
  SA_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Cfg::kThreads, kSmem));
  const int sms = sm_count(p.device_index);
  SA_CHECK(per_sm > 0 && sms > 0, SA_ERROR_CUDA,
           "indexer_topk (portable): no CTA of " << kSmem << " bytes of shared memory fits device "
                                                 << p.device_index);
  plan.grid = std::min<int64_t>(plan.q_blocks, int64_t{per_sm} * sms);
  plan.cap = buffer_cap(p.dims.topk);
  plan.bytes = static_cast<size_t>(plan.grid * Cfg::kBlockQ * plan.cap) * sizeof(uint2) + kAlign;
  return plan;
}

Plan make_plan(const IndexerTopkProblem& p) {
  switch (p.dims.HI) {
    case 16:
      return make_plan_for<16>(p);
    case 32:
      return make_plan_for<32>(p);
    default:
      return make_plan_for<64>(p);
  }
}

template <int kHeads>
void launch(const IndexerTopkProblem& p, const Plan& plan, uint2* buf, cudaStream_t stream) {
  using Cfg = indexer::TileConfig<kHeads>;
  constexpr int kSmem = indexer::TopkSmem<Cfg>::kBytes;
  indexer::TopkOut o{};
  o.idx = p.topk_idx;
  o.idx_ss = p.topk_idx_stride[0];
  o.len = p.topk_length;
  o.len_s = p.topk_length_stride;
  o.buf = buf;
  o.k = static_cast<int32_t>(p.dims.topk);
  o.cap = static_cast<int32_t>(plan.cap);
  o.q_blocks = plan.q_blocks;
  auto* kernel = &indexer::topk_kernel<Cfg>;
  SA_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  kernel<<<static_cast<unsigned>(plan.grid), Cfg::kThreads, kSmem, stream>>>(
      indexer::make_score_params(p), o);
  SA_CUDA_CHECK_LAUNCH();
}

// Two passes (the portable score kernel, then the shared top-k per row) unless the tuning forces
// the fused kernel: 1.75x / 2.72x faster on an H100 (S 8192, H_I 64 / 32, session 35), for at
// most 1 GiB of workspace.
bool use_two_passes() { return detail::tuning().portable_indexer_topk != 1; }

indexer::TwoPassOptions two_pass_options() {
  indexer::TwoPassOptions o;
  o.scores = &indexer_scores;
  o.scores_unsupported = &indexer_scores_unsupported;
  o.rows_kernel = indexer::rows_kernel_of(detail::tuning().portable_indexer_topk);
  if (detail::tuning().indexer_topk_list_cap > 0) o.list_cap = detail::tuning().indexer_topk_list_cap;
  o.chunk_rows = detail::tuning().indexer_topk_rows;
  o.path = kPath;
  return o;
}

}  // namespace

std::string indexer_topk_unsupported(const IndexerTopkProblem& p) {
  const IndexerDims& d = p.dims;
  std::string why = indexer_inputs_unsupported(p, kPath);
  if (!why.empty()) return why;
  std::ostringstream os;
  if (p.topk_idx_stride[1] != 1 && d.topk > 1) {
    os << "topk_idx: the last dimension must be contiguous (" << kPath << ")";
    return os.str();
  }
  if (buffer_cap(d.topk) > INT32_MAX / 2) {
    os << "topk = " << d.topk << " (" << kPath << " supports < 2^29)";
    return os.str();
  }
  if (use_two_passes()) return indexer::two_pass_unsupported(p, two_pass_options());
  return smem_unsupported(p.device_index, smem_bytes_for(d.HI));
}

size_t indexer_topk_workspace_bytes(const IndexerTopkProblem& p) {
  return use_two_passes() ? indexer::two_pass_plan(p, two_pass_options().chunk_rows).bytes
                          : make_plan(p).bytes;
}

void indexer_topk(const IndexerTopkProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream) {
  const std::string why = indexer_topk_unsupported(p);
  SA_CHECK(why.empty(), SA_ERROR_UNSUPPORTED, "indexer_topk (portable): " << why);
  if (use_two_passes()) {
    indexer::two_pass_topk(p, workspace, workspace_bytes, two_pass_options(), stream);
    return;
  }
  const Plan plan = make_plan(p);
  if (plan.grid == 0) return;
  SA_CHECK(workspace != nullptr && workspace_bytes >= plan.bytes, SA_ERROR_WORKSPACE,
           "indexer_topk (portable): needs " << plan.bytes << " bytes of workspace, got "
                                             << workspace_bytes
                                             << (workspace == nullptr ? " (null)" : ""));
  auto* buf = reinterpret_cast<uint2*>((reinterpret_cast<uintptr_t>(workspace) + kAlign - 1) /
                                       kAlign * kAlign);
  switch (p.dims.HI) {
    case 16:
      launch<16>(p, plan, buf, stream);
      break;
    case 32:
      launch<32>(p, plan, buf, stream);
      break;
    default:
      launch<64>(p, plan, buf, stream);
      break;
  }
}

}  // namespace sa::portable
