// How the command-line tool stops: throw ToolError with the exit status and the message for
// stderr; main() prints "error: <message>" and returns the status.
#pragma once

#include <stdexcept>
#include <string>

namespace sa_tool {

constexpr int kExitPass = 0;
constexpr int kExitCheckFailed = 1;  // a check failed, or the library or CUDA failed at run time
constexpr int kExitBadArgument = 2;  // unknown flag, bad value, or the library refused the call

class ToolError : public std::runtime_error {
 public:
  ToolError(int exit_code, const std::string& message)
      : std::runtime_error(message), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

}  // namespace sa_tool
