// Division of non-negative int32 values by a divisor fixed for a launch: a multiply-high and a
// shift on the device (and a select for divisor 1) instead of the ~20 instructions of an integer
// division. Set up on the host (FastDivisor::make) and passed in a kernel's parameters.
//
// Method (round-up multiplier, Granlund and Montgomery): for d >= 2 let l = ceil(log2 d) and
// m = ceil(2^(31 + l) / d) (< 2^32 because d > 2^(l - 1)). With e = m d - 2^(31 + l) < d <= 2^l,
// floor(x m / 2^(31 + l)) = floor(x / d) for every 0 <= x < 2^31, since x e < 2^(31 + l).
#pragma once

#include <cstdint>

#include "common/problem.hpp"  // SA_HD

namespace sa {

struct FastDivisor {
  uint32_t multiplier = 0;  // 0: divisor 1 (the quotient is x)
  uint32_t shift = 0;       // l - 1: the quotient is mulhi(x, m) >> shift

  static FastDivisor make(int32_t d) {
    FastDivisor f;
    if (d <= 1) return f;  // d == 1 (callers pass d >= 1: N_q >= 1 is checked with the map)
    uint32_t l = 0;
    while ((int64_t{1} << l) < d) ++l;
    f.multiplier = static_cast<uint32_t>(((uint64_t{1} << (31 + l)) + d - 1) / d);
    f.shift = l - 1;
    return f;
  }

  // floor(x / d) for 0 <= x < 2^31 (host and device).
  SA_HD int32_t div(int32_t x) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(static_cast<uint32_t>(x), multiplier);
#else
    const uint32_t hi = static_cast<uint32_t>(
        (static_cast<uint64_t>(static_cast<uint32_t>(x)) * multiplier) >> 32);
#endif
    return multiplier == 0 ? x : static_cast<int32_t>(hi >> shift);
  }
};

}  // namespace sa
