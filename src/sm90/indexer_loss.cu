// The Hopper indexer KL loss (SPEC 5): the shared driver (cuda/indexer_loss_driver.hpp: plan,
// loss kernel, deterministic mode, dense slices) with the wgmma attention target of
// indexer_target_kernel.cuh, one CTA per (token, pair of 64-head groups), D_qk 512 or 576.
#include <cstdint>
#include <string>

#include "common/cuda_check.hpp"
#include "cuda/indexer_loss_driver.hpp"
#include "sm90/indexer.hpp"
#include "sm90/indexer_target_kernel.cuh"

namespace sa::sm90 {
namespace {

using portable::indexer::TargetParams;
using indexer::TargetTraits;

// Opt-in shared memory limit of sm_90 (227 KB).
constexpr size_t kMaxSmemSm90 = 232448;
constexpr size_t kSmem576 = indexer::target_smem_bytes<TargetTraits<576>>();
constexpr size_t kSmem512 = indexer::target_smem_bytes<TargetTraits<512>>();
static_assert(kSmem576 <= kMaxSmemSm90, "sm90 indexer target exceeds 227 KB of smem");
static_assert(kSmem512 <= kMaxSmemSm90, "sm90 indexer target exceeds 227 KB of smem");

template <int kDqk, bool kDense>
void launch_for(const TargetParams& prm, int64_t grid, cudaStream_t stream) {
  using T = TargetTraits<kDqk>;
  constexpr size_t kSmem = indexer::target_smem_bytes<T>();
  auto* kernel = &indexer::target_sm90_kernel<T, kDense>;
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kSmem)));
  kernel<<<static_cast<unsigned>(grid), T::kThreads, kSmem, stream>>>(prm);
  SA_CUDA_CHECK_LAUNCH();
}

// portable::indexer::TargetLaunch: one CTA per (token, pair of head groups).
void launch_target(const TargetParams& prm, bool dense, int64_t tokens, int /*device*/,
                   cudaStream_t stream) {
  const int64_t pairs = (prm.head_groups + 1) / 2;
  const int64_t grid = tokens * pairs;
  if (grid == 0) return;
  if (prm.qk_chunks == 72) {
    if (dense)
      launch_for<576, true>(prm, grid, stream);
    else
      launch_for<576, false>(prm, grid, stream);
  } else {
    if (dense)
      launch_for<512, true>(prm, grid, stream);
    else
      launch_for<512, false>(prm, grid, stream);
  }
}

portable::indexer::LossDriverOptions driver_options() {
  portable::indexer::LossDriverOptions o;
  o.target = &launch_target;
  o.target_smem_bytes = static_cast<int>(kSmem576 > kSmem512 ? kSmem576 : kSmem512);
  o.path = "sm90 indexer loss";
  return o;
}

}  // namespace

std::string indexer_loss_unsupported(const IndexerLossProblem& p) {
  return portable::indexer::loss_unsupported(p, driver_options());
}

size_t indexer_loss_workspace_bytes(const IndexerLossProblem& p) {
  return portable::indexer::loss_workspace_bytes(p);
}

void indexer_loss(const IndexerLossProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream) {
  portable::indexer::loss_run(p, workspace, workspace_bytes, driver_options(), stream);
}

}  // namespace sa::sm90
