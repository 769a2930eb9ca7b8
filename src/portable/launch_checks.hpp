// Host-side checks that the portable BSA launchers (bsa_forward.cu, bsa_backward.cu) share before
// they accept a problem. No device code.
#pragma once

#include <cstdint>
#include <string>

#include "common/problem.hpp"

namespace sa::portable {

// "" when the tensor's addressing suits 16-byte vector access, else the reason.
std::string check_tensor_addressing(const char* name, const Bhsd& t, int64_t B, int64_t H,
                                    int64_t S);

}  // namespace sa::portable
