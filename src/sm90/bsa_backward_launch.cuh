// The Hopper BSA backward main kernel's launches, one per instantiation of
// bsa_backward_kernel.cuh: bsa_backward.cu instantiates the default kernels ({block 64, 128} x
// {D 64, 128} x {unmasked, masked}), bsa_backward_tuned.cu the same eight for each set of
// variant bits the internal tuning can ask for (bwd::kTuneStatsWarp, bwd::kTuneFullBlocks),
// bsa_backward_varlen.cu the packed-batch kernels (BwdTraits::kVarlen).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/cuda_check.hpp"
#include "sm90/bsa_backward_kernel.cuh"

namespace sa::sm90::bwd_launch {

template <int kBlock, int kHeadDim, bool kMask, int kTune, bool kVarlen = false>
struct Kernel {
  using Traits = bwd::BwdTraits<kBlock, kHeadDim, kMask, kTune, kVarlen>;
  // +1024: the kernel aligns its shared storage to 1024 bytes (128-byte swizzle atoms).
  static constexpr size_t kSmem = sizeof(bwd::SharedStorage<Traits>) + 1024;
  // sm_90: 227 KB per block at most, 228 KB per SM with 1 KB reserved per CTA.
  static_assert(kSmem <= 227 * 1024, "shared storage exceeds an sm_90 block's opt-in maximum");
  static_assert(Traits::kCtasPerSm * (kSmem + 1024) <= 228 * 1024,
                "kCtasPerSm CTAs do not fit an sm_90 SM's shared memory");

  static void launch(const BsaBwdSm90Params& params, int64_t max_items, cudaStream_t stream) {
    auto* kernel = &bsa_backward_sm90_kernel<Traits>;
    SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kSmem)));
    SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared));
    kernel<<<static_cast<unsigned>(max_items), Traits::kThreads, kSmem, stream>>>(params);
    SA_CUDA_CHECK_LAUNCH();
  }
};

// The kernel of (block, D) with mask kMask and variant bits kTune (kVarlen: packed batches).
template <bool kMask, int kTune, bool kVarlen = false>
void dispatch(const BsaBwdSm90Params& params, int block, int64_t D, int64_t max_items,
              cudaStream_t stream) {
  if (block == 128 && D == 128)
    return Kernel<128, 128, kMask, kTune, kVarlen>::launch(params, max_items, stream);
  if (block == 128 && D == 64)
    return Kernel<128, 64, kMask, kTune, kVarlen>::launch(params, max_items, stream);
  if (block == 64 && D == 128)
    return Kernel<64, 128, kMask, kTune, kVarlen>::launch(params, max_items, stream);
  if (block == 64 && D == 64)
    return Kernel<64, 64, kMask, kTune, kVarlen>::launch(params, max_items, stream);
  SA_FAIL(SA_ERROR_INTERNAL, "sm90 bsa backward: no kernel for block " << block << ", D " << D);
}

// bsa_backward_tuned.cu: the variant kernels (tune: a non-zero combination of the kTune bits).
void launch_tuned(const BsaBwdSm90Params& params, int block, int64_t D, bool masked, int tune,
                  int64_t max_items, cudaStream_t stream);

// bsa_backward_varlen.cu: the packed-batch kernels (masked path, with or without a mask): the
// loader warp's ring at block 128, the default kernel at block 64 (varlen_tune); never the
// full-block path.
constexpr int varlen_tune(int block) { return block == 128 ? bwd::kTuneStatsWarp : 0; }
void launch_varlen(const BsaBwdSm90Params& params, int block, int64_t D, int64_t max_items,
                   cudaStream_t stream);

}  // namespace sa::sm90::bwd_launch
