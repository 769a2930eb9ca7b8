// Checked integer narrowing (int64 sizes from the API to the int32 a kernel indexes with) and
// overflow-checked size arithmetic.
#pragma once

#include <cstdint>
#include <limits>

#include "common/error.hpp"

namespace sa {

inline int32_t narrow_i32(int64_t v, const char* what) {
  SA_CHECK(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
           SA_ERROR_UNSUPPORTED, what << " = " << v << " does not fit in int32");
  return static_cast<int32_t>(v);
}

inline bool fits_i32(int64_t v) {
  return v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max();
}

// a * b and a + b into *out; false (and *out unspecified) when the result does not fit in int64.
inline bool mul_overflows(int64_t a, int64_t b, int64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}
inline bool add_overflows(int64_t a, int64_t b, int64_t* out) {
  return __builtin_add_overflow(a, b, out);
}

// ceil(n / d) for n >= 0, d >= 1, without the overflow of (n + d - 1) / d.
inline int64_t ceil_div_i64(int64_t n, int64_t d) { return n == 0 ? 0 : (n - 1) / d + 1; }

}  // namespace sa
