// The Hopper indexer KL loss (SPEC 5): the shared driver (cuda/indexer_loss_driver.hpp: plan,
// loss kernel, deterministic mode, dense slices) with the wgmma attention target of
// indexer_target_rs_kernel.cuh (Q in registers, RS; the default: 1.07x the SS kernel on an H100,
// session 35), or with the internal tuning sm90_indexer_target = 3 of indexer_target_kernel.cuh
// (Q in shared memory, SS); one CTA per (token, pair of 64-head groups), D_qk 512 or 576.
#include <algorithm>
#include <cstdint>
#include <string>

#include "common/cuda_check.hpp"
#include "common/tuning.hpp"
#include "cuda/indexer_loss_driver.hpp"
#include "sm90/indexer.hpp"
#include "sm90/indexer_target_kernel.cuh"
#include "sm90/indexer_target_rs_kernel.cuh"

namespace sa::sm90 {
namespace {

using portable::indexer::TargetParams;
using indexer::TargetRsTraits;
using indexer::TargetTraits;

// Opt-in shared memory limit of sm_90 (227 KB).
constexpr size_t kMaxSmemSm90 = 232448;
constexpr size_t kSmem576 = indexer::target_smem_bytes<TargetTraits<576>>();
constexpr size_t kSmem512 = indexer::target_smem_bytes<TargetTraits<512>>();
static_assert(kSmem576 <= kMaxSmemSm90, "sm90 indexer target exceeds 227 KB of smem");
static_assert(kSmem512 <= kMaxSmemSm90, "sm90 indexer target exceeds 227 KB of smem");
constexpr size_t kSmemRs576 = indexer::target_rs_smem_bytes<TargetRsTraits<576>>();
constexpr size_t kSmemRs512 = indexer::target_rs_smem_bytes<TargetRsTraits<512>>();
static_assert(kSmemRs576 <= kMaxSmemSm90, "sm90 indexer target (RS) exceeds 227 KB of smem");
static_assert(kSmemRs512 <= kMaxSmemSm90, "sm90 indexer target (RS) exceeds 227 KB of smem");

template <class Kernel>
void launch_kernel(Kernel* kernel, size_t smem, int threads, const TargetParams& prm, int64_t grid,
                   cudaStream_t stream) {
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(grid), threads, smem, stream>>>(prm);
  SA_CUDA_CHECK_LAUNCH();
}

template <int kDqk, bool kDense>
void launch_variant(const TargetParams& prm, int64_t grid, cudaStream_t stream) {
  if (detail::tuning().sm90_indexer_target != 3) {
    using T = TargetRsTraits<kDqk>;
    launch_kernel(&indexer::target_rs_sm90_kernel<T, kDense>, indexer::target_rs_smem_bytes<T>(),
                  T::kThreads, prm, grid, stream);
  } else {
    using T = TargetTraits<kDqk>;
    launch_kernel(&indexer::target_sm90_kernel<T, kDense>, indexer::target_smem_bytes<T>(),
                  T::kThreads, prm, grid, stream);
  }
}

// portable::indexer::TargetLaunch: one CTA per (token, pair of head groups).
void launch_target(const TargetParams& prm, bool dense, int64_t tokens, int /*device*/,
                   cudaStream_t stream) {
  const int64_t pairs = (prm.head_groups + 1) / 2;
  const int64_t grid = tokens * pairs;
  if (grid == 0) return;
  if (prm.qk_chunks == 72) {
    if (dense)
      launch_variant<576, true>(prm, grid, stream);
    else
      launch_variant<576, false>(prm, grid, stream);
  } else {
    if (dense)
      launch_variant<512, true>(prm, grid, stream);
    else
      launch_variant<512, false>(prm, grid, stream);
  }
}

portable::indexer::LossDriverOptions driver_options() {
  portable::indexer::LossDriverOptions o;
  o.target = &launch_target;
  o.target_smem_bytes = static_cast<int>(
      std::max(std::max(kSmem576, kSmem512), std::max(kSmemRs576, kSmemRs512)));
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
