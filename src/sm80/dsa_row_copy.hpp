// The row copy of the portable DSA kernels' gathers: one row of 16-bit elements, 64 16-byte
// chunks (+ 8 rope chunks when D_qk = 576), global -> a swizzled shared row with cp.async, by the
// 8 threads of a row (sub = 0..7 copies chunks sub + 8 k). Chunk c lands at chunk c ^ swz of the
// row (swz: the row's swizzle phase). src_bytes 0 zero-fills the row and reads nothing (src_row
// must still be a valid address: callers pass the tensor base).
#pragma once

#include <cstdint>

#include "cuda/dsa_mma.hpp"

namespace sa::portable::dsa {

template <class Element>
__device__ __forceinline__ void copy_row_swizzled(uint32_t dst_row, const Element* src_row,
                                                  int src_bytes, int sub, int swz, bool rope) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int ch = sub + 8 * k;
    cp_async_16_zfill(dst_row + ((ch ^ swz) << 4), src_row + ch * 8, src_bytes);
  }
  if (rope) {
    const int ch = 64 + sub;
    cp_async_16_zfill(dst_row + ((ch ^ swz) << 4), src_row + ch * 8, src_bytes);
  }
}

}  // namespace sa::portable::dsa
