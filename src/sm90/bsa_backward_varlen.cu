// The Hopper BSA backward main kernel for packed (THD) batches (bsa_backward_kernel.cuh,
// BwdTraits::kVarlen): {block 64, 128} x {D 64, 128}, bf16, on the masked path (a call without a
// mask walks it with each sequence's band [-sq, skv]), with the variant bits the default rule
// picks (varlen_tune: the loader warp at block 128). A separate file so that the dense kernels'
// objects stay as they were.
#include "sm90/bsa_backward_launch.cuh"

namespace sa::sm90::bwd_launch {

static_assert(Kernel<128, 128, true, varlen_tune(128), true>::kSmem <= 227 * 1024 &&
              Kernel<64, 128, true, varlen_tune(64), true>::kSmem <= 113 * 1024);

void launch_varlen(const BsaBwdSm90Params& params, int block, int64_t D, int64_t max_items,
                   cudaStream_t stream) {
  constexpr int k128 = varlen_tune(128), k64 = varlen_tune(64);
  if (block == 128 && D == 128)
    return Kernel<128, 128, true, k128, true>::launch(params, max_items, stream);
  if (block == 128 && D == 64)
    return Kernel<128, 64, true, k128, true>::launch(params, max_items, stream);
  if (block == 64 && D == 128)
    return Kernel<64, 128, true, k64, true>::launch(params, max_items, stream);
  if (block == 64 && D == 64) return Kernel<64, 64, true, k64, true>::launch(params, max_items, stream);
  SA_FAIL(SA_ERROR_INTERNAL, "sm90 bsa backward: no packed kernel for block " << block << ", D "
                                                                              << D);
}

}  // namespace sa::sm90::bwd_launch
