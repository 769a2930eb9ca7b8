// Host helpers of the fixed-point deterministic modes' CPU tests (test_dsa_fixed_point.cpp,
// test_dsa_binned_fixed.cpp): a float's bits, and control words from the input maxima.
#pragma once

#include <cstdint>
#include <cstring>

#include "cuda/dsa_fixed_point.cuh"

namespace sa_test {

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// FixCtl as the setup pass leaves it: max |q|, |dout|, |kv|, the busiest key's slot count and
// (after the first pass) max |x|.
inline sa::portable::dsa_bwd::FixCtl ctl_of(float q, float dout, float kv, uint32_t count,
                                            float x = 0.f) {
  sa::portable::dsa_bwd::FixCtl c{};
  c.max_q = bits(q);
  c.max_dout = bits(dout);
  c.max_kv = bits(kv);
  c.count = count;
  c.max_x = bits(x);
  return c;
}

}  // namespace sa_test
