// Checked integer narrowing (int64 sizes from the API to the int32 a kernel indexes with).
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

}  // namespace sa
