// The integer a caller stored in an enum field or argument of the C API. A C caller may store any
// int there; in C++, reading a value outside the enumerators' range through the enum type is
// undefined (UBSan's -fsanitize=enum flags it), so the API reads the bits and compares integers
// until the value is known to be an enumerator.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace sa::api {

template <class E>
int32_t enum_bits(const E& e) {
  static_assert(std::is_enum_v<E> && sizeof(E) == sizeof(int32_t), "a 4-byte C enum");
  int32_t v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

}  // namespace sa::api
