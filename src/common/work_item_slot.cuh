// The work item a CTA takes in a kernel launched with one CTA per reverse-map work item
// (cuda/reverse_map_gpu.hpp): the CTAs start in index order, and the map's step 6 reorders
// the last tail_items launch slots so that the last waves run their longest items first.
// Device code only.
#pragma once

#include <cstdint>

namespace sa {

// Slot s (blockIdx.x) < t0 = num_items - min(num_items, tail) takes item s; slot t0 + i takes
// item_order[i]. A null item_order: every slot takes its own item.
__device__ __forceinline__ int work_item_of_slot(int slot, int num_items,
                                                 const int32_t* item_order, int tail) {
  const int t0 = num_items - min(num_items, tail);
  return item_order != nullptr && slot >= t0 ? item_order[slot - t0] : slot;
}

}  // namespace sa
