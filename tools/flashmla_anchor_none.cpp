// The FlashMLA anchor's stand-in when the build has none (SA_FLASHMLA_DIR unset: CI and the
// default build): `anchor=flashmla` then reports that it is not built.
#include "flashmla_anchor.hpp"

namespace sa_tool {

bool flashmla_anchor_built() { return false; }

const char* flashmla_unsupported(const FlashMlaFwdCall&, int, int) {
  return "this build has no FlashMLA anchor (configure with -DSA_FLASHMLA_DIR=<FlashMLA "
         "checkout>; scripts/flashmla_anchor.sh)";
}

cudaError_t flashmla_sparse_fwd(const FlashMlaFwdCall&, int, cudaStream_t) {
  return cudaErrorNotSupported;
}

}  // namespace sa_tool
