// Device pieces that the portable and the Hopper DSA kernels share.
#pragma once

#include <cstdint>

namespace sa {

// Active prefix of row `tok`: topk_length[tok] clamped to [0, topk] (len null: topk). Slots at or
// past it are never read.
__device__ __forceinline__ int dsa_active_slots(const int32_t* len, int64_t len_s, int topk,
                                                int64_t tok) {
  int n = topk;
  if (len != nullptr) {
    const int32_t l = len[tok * len_s];
    n = l <= 0 ? 0 : min(l, topk);
  }
  return n;
}

}  // namespace sa
