// Internal error handling. Code inside the library reports failures by throwing sa::Error
// (through the SA_CHECK macros); the C ABI entry points catch it and turn it into an sa_status
// plus the thread's last-error message. Nothing else crosses the API boundary.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

#include "sparse_attention/sparse_attention.h"

namespace sa {

class Error : public std::runtime_error {
 public:
  Error(sa_status code, const std::string& message) : std::runtime_error(message), code_(code) {}
  sa_status code() const { return code_; }

 private:
  sa_status code_;
};

namespace detail {
[[noreturn]] inline void fail(sa_status code, const std::string& message, const char* file,
                              int line) {
  // Print the path from the repository's src/ on, not the build machine's absolute path.
  std::string path(file);
  size_t src = path.rfind("/src/");
  if (src != std::string::npos) path = path.substr(src + 1);
  std::ostringstream os;
  os << message << " [" << path << ":" << line << "]";
  throw Error(code, os.str());
}
}  // namespace detail

}  // namespace sa

// SA_CHECK(cond, code, stream-expression): always on, in every build type.
//   SA_CHECK(q.rank == 4, SA_ERROR_INVALID_ARGUMENT, "q: expected rank 4, got " << q.rank);
#define SA_CHECK(cond, code, msg)                                   \
  do {                                                              \
    if (!(cond)) {                                                  \
      std::ostringstream sa_check_os_;                              \
      sa_check_os_ << msg;                                          \
      ::sa::detail::fail((code), sa_check_os_.str(), __FILE__, __LINE__); \
    }                                                               \
  } while (0)

#define SA_CHECK_ARG(cond, msg) SA_CHECK(cond, SA_ERROR_INVALID_ARGUMENT, msg)
#define SA_FAIL(code, msg) SA_CHECK(false, code, msg)
