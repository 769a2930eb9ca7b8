#include "portable/launch_checks.hpp"

#include <cstdint>
#include <sstream>

namespace sa::portable {

std::string check_tensor_addressing(const char* name, const Bhsd& t, int64_t B, int64_t H,
                                    int64_t S) {
  std::ostringstream os;
  if (t.data == nullptr) {
    os << name << " is missing";
  } else if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) {
    os << name << ": data pointer not 16-byte aligned";
  } else if (t.sd != 1) {
    os << name << ": last dimension not contiguous (stride " << t.sd << ")";
  } else if ((B > 1 && t.sb % 8 != 0) || (H > 1 && t.sh % 8 != 0) || (S > 1 && t.ss % 8 != 0)) {
    os << name << ": strides (" << t.sb << ", " << t.sh << ", " << t.ss
       << ") not multiples of 8 elements";
  }
  return os.str();
}

}  // namespace sa::portable
