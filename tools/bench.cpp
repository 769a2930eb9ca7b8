#include "bench.hpp"

#include <cstdio>

#include "tool_error.hpp"

namespace sa_tool {

int run_bench(int /*argc*/, const char* const* /*argv*/) {
  std::fprintf(stderr, "bench: not implemented yet\n");
  return kExitBadArgument;
}

}  // namespace sa_tool
