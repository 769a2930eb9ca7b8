// The order of indexer scores that every top-k kernel ranks by (SPEC 5): larger = ranks first,
// numbers by value (-0 == +0), NaN below -inf. A candidate is (order_key(score), smaller key):
// ties go to the smaller key, so the selection is a function of the scores alone.
#pragma once

#include <cstdint>

namespace sa::portable::indexer {

// fp32 score -> unsigned integer of the same order (larger ranks first).
__device__ __forceinline__ uint32_t order_key(float v) {
  if (v != v) return 0u;  // NaN: below every number
  if (v == 0.f) v = 0.f;  // -0 ranks as +0
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

}  // namespace sa::portable::indexer
