// The portable indexer KL loss (SPEC 5): the shared driver (cuda/indexer_loss_driver.hpp) with
// the portable attention target (indexer_target_kernel.cuh, mma.sync), per (token, 64-head group)
// CTAs of chunks of 64 keys where the device offers the shared memory, else 32.
#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "common/cuda_check.hpp"
#include "common/cuda_device.hpp"
#include "cuda/indexer_loss_driver.hpp"
#include "sm80/indexer.hpp"
#include "sm80/indexer_target_kernel.cuh"

namespace sa::portable {
namespace {

constexpr int kTargetSmem32 = indexer::TargetConfig<32>::kSmemBytes;
constexpr int kTargetSmem64 = indexer::TargetConfig<64>::kSmemBytes;

template <class Cfg, bool kDense>
void launch_target_for(const indexer::TargetParams& prm, int64_t grid, cudaStream_t stream) {
  auto* kernel = &indexer::target_kernel<Cfg, kDense>;
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     Cfg::kSmemBytes));
  kernel<<<static_cast<unsigned>(grid), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(prm);
  SA_CUDA_CHECK_LAUNCH();
}

template <bool kDense>
void launch_target_mode(const indexer::TargetParams& prm, int64_t grid, int device,
                        cudaStream_t stream) {
  if (max_smem_optin(device) >= kTargetSmem64) {
    launch_target_for<indexer::TargetConfig<64>, kDense>(prm, grid, stream);
  } else {
    launch_target_for<indexer::TargetConfig<32>, kDense>(prm, grid, stream);
  }
}

// `tokens` CTAs of the target kernel per head group (indexer::TargetLaunch).
void launch_target(const indexer::TargetParams& prm, bool dense, int64_t tokens, int device,
                   cudaStream_t stream) {
  const int64_t grid = tokens * prm.head_groups;
  if (grid == 0) return;
  if (dense) {
    launch_target_mode<true>(prm, grid, device, stream);
  } else {
    launch_target_mode<false>(prm, grid, device, stream);
  }
}

indexer::LossDriverOptions driver_options() {
  indexer::LossDriverOptions o;
  o.target = &launch_target;
  o.target_smem_bytes = kTargetSmem32;
  o.path = "portable indexer loss";
  return o;
}

}  // namespace

std::string indexer_loss_unsupported(const IndexerLossProblem& p) {
  return indexer::loss_unsupported(p, driver_options());
}

size_t indexer_loss_workspace_bytes(const IndexerLossProblem& p) {
  return indexer::loss_workspace_bytes(p);
}

void indexer_loss(const IndexerLossProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream) {
  indexer::loss_run(p, workspace, workspace_bytes, driver_options(), stream);
}

}  // namespace sa::portable
