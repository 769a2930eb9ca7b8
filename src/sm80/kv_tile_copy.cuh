// The K/V tile copy of the portable BSA kernels (forward, backward, backward dQ): rows
// [0, valid) of one K and one V tile of kRows rows, global -> shared with cp.async; rows >= valid
// are zero-filled and read nothing (their source address is the tensor base, never dereferenced).
//
// Copy role: a thread copies one 16-byte chunk of rows copy_row + i * kCopyRows. k_dst / v_dst
// are the shared byte addresses of that chunk in row copy_row of the tiles (swizzled_offset),
// k_src / v_src point at it in global memory, k_ss / v_ss are the row strides in elements.
#pragma once

#include <cstdint>

#include "sm80/sm80_primitives.hpp"

namespace sa::portable {

template <int kRows, int kCopyRows, int kRowBytes, class Element>
__device__ __forceinline__ void copy_kv_rows(uint32_t k_dst, uint32_t v_dst, const Element* k_src,
                                             const Element* v_src, int64_t k_ss, int64_t v_ss,
                                             const Element* k_base, const Element* v_base,
                                             int copy_row, int valid) {
  static_assert(kRows % kCopyRows == 0, "whole row passes");
#pragma unroll
  for (int i = 0; i < kRows / kCopyRows; ++i) {
    const bool ok = copy_row + i * kCopyRows < valid;
    sm80::cp_async_16(k_dst + i * kCopyRows * kRowBytes, ok ? k_src : k_base, ok);
    sm80::cp_async_16(v_dst + i * kCopyRows * kRowBytes, ok ? v_src : v_base, ok);
    k_src += kCopyRows * k_ss;
    v_src += kCopyRows * v_ss;
  }
}

}  // namespace sa::portable
