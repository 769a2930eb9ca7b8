// Hopper indexer top-k, host side, two methods:
//  * fused (indexer_topk_kernel.cuh): scores and selection in one kernel, the workspace holding
//    the persistent CTAs' candidate buffers (O(k) per CTA slot, independent of S_kv);
//  * two passes (cuda/indexer_topk_two_pass.hpp): the sm90 score kernel writes the dense scores
//    of a chunk of query rows into the workspace, then a top-k per row (one CTA per row).
// Both give the same selection (SPEC 5's, over the same score bits). Two passes run unless the
// internal tuning forces the fused kernel (use_two_passes).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "common/cuda_check.hpp"
#include "common/cuda_device.hpp"
#include "common/tuning.hpp"
#include "cuda/indexer_checks.hpp"
#include "cuda/indexer_topk_two_pass.hpp"
#include "cuda/launch_checks.hpp"
#include "sm90/indexer.hpp"
#include "sm90/indexer_host.hpp"
#include "sm90/indexer_topk_kernel.cuh"

namespace sa::sm90 {
namespace {

constexpr const char* kPath = "sm90 indexer top-k";
constexpr size_t kAlign = 256;

template <int kHeads>
constexpr size_t smem_bytes() {
  // +1024: the kernel aligns its shared storage to 1024 bytes (128-byte swizzle atoms).
  return sizeof(indexer::TopkSmem<indexer::ScoresTraits<kHeads>>) + 1024;
}
static_assert(smem_bytes<16>() <= 227 * 1024 && smem_bytes<32>() <= 227 * 1024 &&
                  smem_bytes<64>() <= 227 * 1024,
              "one CTA per SM: within the sm_90 opt-in shared memory");

size_t smem_bytes_for(int64_t heads) {
  return heads == 16 ? smem_bytes<16>() : heads == 32 ? smem_bytes<32>() : smem_bytes<64>();
}

// The launch shape, a function of the shapes and the device only (the workspace size and the run
// agree): one persistent CTA per SM, never more than there are query blocks; one candidate buffer
// per token slot of a CTA.
struct Plan {
  int64_t q_blocks = 0, grid = 0, cap = 0;
  size_t bytes = 0;  // workspace, with slack to align the caller's pointer
};

Plan make_plan(const IndexerTopkProblem& p) {
  const int64_t tokens = 2 * 256 / p.dims.HI;  // ScoresTraits<H_I>::kTokensPerCta
  Plan plan;
  plan.q_blocks = (p.dims.Sq + tokens - 1) / tokens;
  const int sms = sm_count(p.device_index);
  SA_CHECK(sms > 0, SA_ERROR_CUDA,
           "indexer_topk (sm90): no SM count for device " << p.device_index);
  plan.grid = std::min<int64_t>(plan.q_blocks, sms);
  plan.cap = portable::indexer::topk_buffer_cap(p.dims.topk);
  plan.bytes = static_cast<size_t>(plan.grid * tokens * plan.cap) * sizeof(uint2) + kAlign;
  return plan;
}

template <int kHeads>
void launch(const IndexerTopkProblem& p, const Plan& plan, uint2* buf, cudaStream_t stream) {
  using T = indexer::ScoresTraits<kHeads>;
  static_assert(T::kTokensPerCta == 2 * 256 / kHeads, "make_plan's tokens per CTA");
  indexer::TopkParams prm{};
  prm.sc = indexer::score_params<kHeads>(kPath, p);
  prm.idx = p.topk_idx;
  prm.idx_ss = p.topk_idx_stride[0];
  prm.len = p.topk_length;
  prm.len_s = p.topk_length_stride;
  prm.buf = buf;
  prm.k = static_cast<int32_t>(p.dims.topk);
  prm.cap = static_cast<int32_t>(plan.cap);
  constexpr size_t kSmem = smem_bytes<kHeads>();
  auto* kernel = &indexer::indexer_topk_sm90_kernel<T>;
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kSmem)));
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared));
  kernel<<<static_cast<unsigned>(plan.grid), T::kThreads, kSmem, stream>>>(prm);
  SA_CUDA_CHECK_LAUNCH();
}

// Two passes unless the tuning forces the fused kernel: 1.9-2.8x faster on an H100 (S 8192, H_I
// 64 / 32; S 32768: 2.2x; docs/indexer_decisions.md), for at most 1 GiB of workspace.
bool use_two_passes() { return detail::tuning().sm90_indexer_topk != 1; }

portable::indexer::TwoPassOptions two_pass_options() {
  portable::indexer::TwoPassOptions o;
  o.scores = &indexer_scores;
  o.scores_unsupported = &indexer_scores_unsupported;
  o.rows_kernel = portable::indexer::rows_kernel_of(detail::tuning().sm90_indexer_topk);
  if (detail::tuning().indexer_topk_list_cap > 0) o.list_cap = detail::tuning().indexer_topk_list_cap;
  o.chunk_rows = detail::tuning().indexer_topk_rows;
  o.path = kPath;
  return o;
}

}  // namespace

std::string indexer_topk_unsupported(const IndexerTopkProblem& p) {
  const IndexerDims& d = p.dims;
  std::string why = indexer::inputs_unsupported(p, kPath);
  if (!why.empty()) return why;
  std::ostringstream os;
  if (p.topk_idx_stride[1] != 1 && d.topk > 1) {
    os << "topk_idx: the last dimension must be contiguous (" << kPath << ")";
    return os.str();
  }
  if (portable::indexer::topk_buffer_cap(d.topk) > INT32_MAX / 2) {
    os << "topk = " << d.topk << " (" << kPath << " supports < 2^29)";
    return os.str();
  }
  if (use_two_passes()) return portable::indexer::two_pass_unsupported(p, two_pass_options());
  return portable::smem_unsupported(p.device_index, smem_bytes_for(d.HI));
}

size_t indexer_topk_workspace_bytes(const IndexerTopkProblem& p) {
  return use_two_passes()
             ? portable::indexer::two_pass_plan(p, two_pass_options().chunk_rows).bytes
             : make_plan(p).bytes;
}

void indexer_topk(const IndexerTopkProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream) {
  const std::string why = indexer_topk_unsupported(p);
  SA_CHECK(why.empty(), SA_ERROR_UNSUPPORTED, "indexer_topk (sm90): " << why);
  if (use_two_passes()) {
    portable::indexer::two_pass_topk(p, workspace, workspace_bytes, two_pass_options(), stream);
    return;
  }
  const Plan plan = make_plan(p);
  if (plan.grid == 0) return;
  SA_CHECK(workspace != nullptr && workspace_bytes >= plan.bytes, SA_ERROR_WORKSPACE,
           "indexer_topk (sm90): needs " << plan.bytes << " bytes of workspace, got "
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

}  // namespace sa::sm90
