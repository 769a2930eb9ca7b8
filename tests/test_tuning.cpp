// sa::detail::Tuning (common/tuning.hpp), on the CPU: the defaults are the shipped kernels', a
// ScopedTuning restores the previous tuning when its scope ends (also when an assertion returns
// early), and a tuning set on one thread does not reach calls made on another.
#include <gtest/gtest.h>

#include <thread>

#include "common/tuning.hpp"

namespace sa_test {
namespace {

using sa::detail::ScopedTuning;
using sa::detail::Tuning;
using sa::detail::tuning;

bool is_default(const Tuning& t) {
  return t.sm90_fwd_splits == 0 && t.sm90_fwd_dyn == 0 && t.sm90_bwd_tail == -1 &&
         t.sm90_dsa_bwd_bits == 0 && t.sm90_dsa_bwd_groups == 1 &&
         t.sm90_dsa_bwd_det_binned == 0 && !t.sm90_dsa_fwd_pad_h16 &&
         t.sm90_bsa_bwd_stats == -1 && t.sm90_bsa_bwd_full == -1;
}

TEST(Tuning, DefaultsAreTheShippedKernels) { EXPECT_TRUE(is_default(tuning())); }

TEST(Tuning, ScopedTuningRestoresThePreviousOne) {
  Tuning outer;
  outer.sm90_fwd_splits = 4;
  {
    const ScopedTuning a(outer);
    Tuning inner = outer;
    inner.sm90_dsa_bwd_bits = 3;
    {
      const ScopedTuning b(inner);
      EXPECT_EQ(tuning().sm90_fwd_splits, 4);
      EXPECT_EQ(tuning().sm90_dsa_bwd_bits, 3);
    }
    EXPECT_EQ(tuning().sm90_fwd_splits, 4);
    EXPECT_EQ(tuning().sm90_dsa_bwd_bits, 0);
  }
  EXPECT_TRUE(is_default(tuning()));
}

TEST(Tuning, StaysOnItsThread) {
  Tuning t;
  t.sm90_bwd_tail = 0;
  t.sm90_dsa_fwd_pad_h16 = true;
  const ScopedTuning scoped(t);
  bool other_default = false;
  std::thread([&] { other_default = is_default(tuning()); }).join();
  EXPECT_TRUE(other_default);
  EXPECT_EQ(tuning().sm90_bwd_tail, 0);
}

}  // namespace
}  // namespace sa_test
