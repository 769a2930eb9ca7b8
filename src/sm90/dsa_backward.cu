// Hopper DSA backward, host side: support checks and the main kernel's policy for the shared
// driver (src/cuda/dsa_backward_driver.hpp), which plans the workspace and runs every other step
// (the fp32 dkv accumulator, deterministic mode's fixed point, the dkv conversion, d_sink). The
// main kernel is dsa_backward_kernel.cuh, instantiated here for D_qk in {512, 576} (H 64 and 128
// share them: H / 64 work items per token; bf16), each with and without token groups (H 8, 16,
// 32: G = 64 / H tokens per work item, cuda/dsa_token_groups.hpp; the driver picks them when not
// deterministic, unless Tuning::sm90_dsa_bwd_groups is 0: one token per item, heads padded to 64)
// and in deterministic mode (int64 fixed-point reductions: its own instantiation; with
// Tuning::sm90_dsa_bwd_det_binned the driver's binned plan, two more: DsaBwdBinPlanTraits).
#include "sm90/dsa_backward.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "common/cuda_check.hpp"
#include "common/cuda_device.hpp"
#include "common/error.hpp"
#include "common/host_numeric.hpp"
#include "common/narrow.hpp"
#include "common/tuning.hpp"
#include "cuda/dsa_backward_driver.hpp"
#include "cuda/dsa_backward_params.cuh"
#include "cuda/launch_checks.hpp"
#include "sm90/dsa_backward_kernel.cuh"

namespace sa::sm90 {
namespace {

using dsa_bwd::DsaBwdTraits;
using dsa_bwd::SharedStorage;

// Opt-in shared memory limit of sm_90 (227 KB).
constexpr size_t kMaxSmemSm90 = 232448;

template <int kDqk>
constexpr size_t smem_bytes() {
  // +1024: the kernel aligns its shared storage to 1024 bytes (128-byte swizzle atoms).
  return sizeof(SharedStorage<DsaBwdTraits<kDqk>>) + 1024;
}
static_assert(sizeof(SharedStorage<DsaBwdTraits<576, true>>) ==
                  sizeof(SharedStorage<DsaBwdTraits<576>>),
              "token groups use the same shared storage");
static_assert(smem_bytes<576>() <= kMaxSmemSm90, "sm90 DSA backward exceeds 227 KB of smem");
static_assert(smem_bytes<512>() <= kMaxSmemSm90, "sm90 DSA backward exceeds 227 KB of smem");

template <class Traits>
void launch_traits(const dsa_bwd::Params& params, int64_t grid, cudaStream_t stream) {
  constexpr size_t kSmem = smem_bytes<Traits::kDqk>();
  auto* kernel = &dsa_bwd::dsa_backward_sm90_kernel<Traits>;
  // Every launch (cheap, and right for whichever device is current).
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kSmem)));
  kernel<<<static_cast<unsigned>(grid), Traits::kThreads, kSmem, stream>>>(params);
  SA_CUDA_CHECK_LAUNCH();
}

template <int kDqk, bool kTokenGroups, bool kDeterministic = false>
void launch(const dsa_bwd::Params& params, int64_t grid, cudaStream_t stream) {
  launch_traits<DsaBwdTraits<kDqk, kTokenGroups, kDeterministic>>(params, grid, stream);
}

// Variant bits (dsa_backward_kernel.cuh, kTune*) from the internal tuning
// (Tuning::sm90_dsa_bwd_bits, set by the bench and tests only); 0: the default kernel.
int32_t tune_bits() {
  constexpr int32_t kKnown =
      dsa_bwd::kTuneLateRelease | dsa_bwd::kTuneRowIndex | dsa_bwd::kTuneGroupsInOrder;
  return detail::tuning().sm90_dsa_bwd_bits & kKnown;
}

// The policy's launch (dsa_bwd::MainKernelLaunch): `grid` work items (tokens x head groups, or
// token groups when prm.group_len is set), walked by at most one persistent CTA per SM; with
// topk_length or token groups (prm.item_counter, in the workspace) the CTAs take their items
// after the first from the counter, zeroed here.
// The launch's parameters (tune bits, items) and its item counter zeroed; returns the grid.
int64_t prepare_launch(const dsa_bwd::Params& prm, dsa_bwd::Params& tuned, int64_t grid,
                       int device, cudaStream_t stream) {
  tuned = prm;
  tuned.tune = tune_bits();
  tuned.items = grid;
  if (prm.item_counter != nullptr) {
    SA_CUDA_CHECK(cudaMemsetAsync(prm.item_counter, 0, sizeof(uint32_t), stream));
  }
  return std::min<int64_t>(grid, sm_count(device));
}

void launch_main(const dsa_bwd::Params& prm, int64_t grid, int device, cudaStream_t stream) {
  if (grid == 0) return;
  dsa_bwd::Params tuned;
  grid = prepare_launch(prm, tuned, grid, device, stream);
  const bool groups = prm.group_len != nullptr;
  SA_CHECK(!(groups && prm.deterministic), SA_ERROR_INTERNAL,
           "sm90 dsa_backward: token groups in deterministic mode");
  if (prm.dqk == 576) {
    if (prm.deterministic) return launch<576, false, true>(tuned, grid, stream);
    groups ? launch<576, true>(tuned, grid, stream) : launch<576, false>(tuned, grid, stream);
  } else {
    if (prm.deterministic) return launch<512, false, true>(tuned, grid, stream);
    groups ? launch<512, true>(tuned, grid, stream) : launch<512, false>(tuned, grid, stream);
  }
}

// The binned plan's launch (the policy's launch_binned; deterministic, no token groups): its two
// kernels, the binned form and the int64 one, each returning at once unless the slot counts
// pick its form (DsaBwdBinPlanTraits). One counter reset serves both: a kernel that returns at
// once does so before its first item.
void launch_main_binned(const dsa_bwd::Params& prm, int64_t grid, int device,
                        cudaStream_t stream) {
  if (grid == 0) return;
  SA_CHECK(prm.deterministic && prm.group_len == nullptr && prm.dkv_bins != nullptr,
           SA_ERROR_INTERNAL, "sm90 dsa_backward: the binned plan without its workspace");
  dsa_bwd::Params tuned;
  grid = prepare_launch(prm, tuned, grid, device, stream);
  if (prm.dqk == 576) {
    launch_traits<dsa_bwd::DsaBwdBinPlanTraits<576, true>>(tuned, grid, stream);
    launch_traits<dsa_bwd::DsaBwdBinPlanTraits<576, false>>(tuned, grid, stream);
  } else {
    launch_traits<dsa_bwd::DsaBwdBinPlanTraits<512, true>>(tuned, grid, stream);
    launch_traits<dsa_bwd::DsaBwdBinPlanTraits<512, false>>(tuned, grid, stream);
  }
}

// The driver's view of this kernel: 64 heads per work item, reductions in quad-16 column order,
// token groups, deterministic mode by fixed point. The workspace is always planned with token
// groups (a size from the arguments only); a call tuned without them runs within it.
constexpr portable::dsa_bwd::KernelPolicy kPolicy{
    "sm90 dsa_backward", DsaBwdTraits<576>::kHeads, portable::dsa_bwd::AccColumns::kQuad16,
    &launch_main, true, true};

// kPolicy with deterministic mode's plan from Tuning::sm90_dsa_bwd_det_binned (set by the bench
// and tests only, around both the workspace query and the call): 0 the int64 plan, 1 the binned
// plan, 2 the binned plan with its int64 form forced (a least resolution no call reaches).
portable::dsa_bwd::KernelPolicy workspace_policy() {
  portable::dsa_bwd::KernelPolicy policy = kPolicy;
  const int32_t binned = detail::tuning().sm90_dsa_bwd_det_binned;
  if (binned != 0) {
    policy.launch_binned = &launch_main_binned;
    if (binned == 2) policy.bin_min_resolution = portable::dsa_bwd::kBinMaxResolution + 1;
  }
  return policy;
}

// The policy of this call: without token groups when Tuning::sm90_dsa_bwd_groups is 0 (set by
// the bench and tests only: today's head padding for A/B runs).
portable::dsa_bwd::KernelPolicy call_policy() {
  portable::dsa_bwd::KernelPolicy policy = workspace_policy();
  policy.token_groups = detail::tuning().sm90_dsa_bwd_groups != 0;
  return policy;
}

}  // namespace

std::string dsa_backward_unsupported(const DsaBwdProblem& p) {
  const DsaDims& d = p.dims;
  std::ostringstream os;
  if (p.device != SA_DEVICE_CUDA) return "needs CUDA tensors";
  if (p.dtype != SA_DTYPE_BF16) {
    os << "dtype " << dtype_name(p.dtype) << " (sm90 DSA backward supports bf16)";
    return os.str();
  }
  if (d.Dqk != 512 && d.Dqk != 576) {
    os << "D_qk = " << d.Dqk << " (sm90 DSA backward supports 512, 576)";
    return os.str();
  }
  if (d.Dv != 512) {
    os << "d_v = " << d.Dv << " (sm90 DSA backward supports 512)";
    return os.str();
  }
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  if (d.H < 1 || d.H > kMaxInt || d.topk > kMaxInt - 64) {
    os << "H = " << d.H << ", topk = " << d.topk << " (sm90 DSA backward supports < 2^31 - 64)";
    return os.str();
  }
  if (d.Skv > kMaxInt || d.Sq * ((d.H + 63) / 64) > kMaxInt) {
    os << "S_q = " << d.Sq << ", S_kv = " << d.Skv
       << " (sm90 DSA backward supports S_kv < 2^31 and S_q * ceil(H / 64) < 2^31)";
    return os.str();
  }
  const std::string layout = portable::dsa_backward_layout_unsupported(p);
  if (!layout.empty()) return layout + " (sm90 DSA backward)";
  return portable::smem_unsupported(p.device_index, smem_bytes<576>());
}

size_t dsa_backward_workspace_bytes(const DsaBwdProblem& p, int64_t slice_tokens) {
  return portable::dsa_bwd::workspace_bytes(p, workspace_policy(), slice_tokens);
}

void dsa_backward(const DsaBwdProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream, int64_t slice_tokens) {
  const std::string why = dsa_backward_unsupported(p);
  SA_CHECK(why.empty(), SA_ERROR_UNSUPPORTED, "sm90 dsa_backward: " << why);
  portable::dsa_bwd::run(p, workspace, workspace_bytes, stream, call_policy(), slice_tokens);
}

}  // namespace sa::sm90
