// The Hopper BSA backward main kernel's tuning variants (bsa_backward_kernel.cuh, kTune bits):
// the loader warp's stats ring, the full-block path, and both, each for the eight default shapes
// ({block 64, 128} x {D 64, 128} x {unmasked, masked}). The internal tuning (common/tuning.hpp)
// selects them per call (bsa_backward.cu); the shipped library never does. A separate file so
// that the default kernels' object (bsa_backward.cu) stays as it was.
#include "sm90/bsa_backward_launch.cuh"

namespace sa::sm90::bwd_launch {

void launch_tuned(const BsaBwdSm90Params& params, int block, int64_t D, bool masked, int tune,
                  int64_t max_items, cudaStream_t stream) {
  constexpr int kStats = bwd::kTuneStatsWarp, kFull = bwd::kTuneFullBlocks;
  switch (tune) {
    case kStats:
      return masked ? dispatch<true, kStats>(params, block, D, max_items, stream)
                    : dispatch<false, kStats>(params, block, D, max_items, stream);
    case kFull:
      return masked ? dispatch<true, kFull>(params, block, D, max_items, stream)
                    : dispatch<false, kFull>(params, block, D, max_items, stream);
    case kStats | kFull:
      return masked ? dispatch<true, kStats | kFull>(params, block, D, max_items, stream)
                    : dispatch<false, kStats | kFull>(params, block, D, max_items, stream);
    default:
      SA_FAIL(SA_ERROR_INTERNAL, "sm90 bsa backward: no kernel variant " << tune);
  }
}

}  // namespace sa::sm90::bwd_launch
