#include "common/tuning.hpp"

namespace sa::detail {
namespace {
thread_local Tuning g_tuning;
}  // namespace

const Tuning& tuning() { return g_tuning; }

Tuning set_tuning(const Tuning& t) {
  const Tuning previous = g_tuning;
  g_tuning = t;
  return previous;
}

}  // namespace sa::detail
