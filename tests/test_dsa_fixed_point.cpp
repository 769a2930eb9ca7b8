// The scale rule of the DSA backward's fixed-point deterministic mode (cuda/dsa_fixed_point.cuh),
// on the host: the overflow limit, the first pass's scale from the estimate, when the second pass
// runs and at which scale, the clamp, and the two factors of 2^s. (The GPU suite runs the mode
// itself: test_gpu_dsa_backward.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "cuda/dsa_fixed_point.cuh"
#include "fix_ctl_util.hpp"

namespace sa_test {
namespace {

using sa::portable::dsa_bwd::fix_factors;
using sa::portable::dsa_bwd::fix_limit_bits;
using sa::portable::dsa_bwd::fix_scale;
using sa::portable::dsa_bwd::FixCtl;
using sa::portable::dsa_bwd::FixScale;
using sa::portable::dsa_bwd::kFixLowBits;
using sa::portable::dsa_bwd::kFixMaxShift;
using sa::portable::dsa_bwd::kFixMinShift;

TEST(DsaFixedPoint, LimitLeavesRoomForEveryAddition) {
  EXPECT_EQ(fix_limit_bits(0, 1), 62);
  EXPECT_EQ(fix_limit_bits(1, 1), 62);
  EXPECT_EQ(fix_limit_bits(4096, 2), 49);
  EXPECT_EQ(fix_limit_bits(4097, 2), 48);
  EXPECT_EQ(fix_limit_bits(UINT32_MAX, 2), 29);
  // N values of at most 2^lim each stay below 2^63.
  for (uint32_t n : {1u, 3u, 1000u, 65536u, 1u << 31}) {
    const int lim = fix_limit_bits(n, 2);
    EXPECT_LE(std::log2(2.0 * n) + lim, 62.0) << n;
  }
}

TEST(DsaFixedPoint, FirstScalePutsTheEstimateBelowTheLimit) {
  const float scale = 1.f / 24.f;
  const FixCtl c = ctl_of(1.f, 1.f, 1.f, 4096);
  const FixScale f = fix_scale(c, scale, 64, 2);
  const double b = 64.0 * 1.0 * (1024.0 * scale + 1.0);  // the estimate, 2794.7
  const int lim = fix_limit_bits(4096, 2);
  EXPECT_FALSE(f.retry);
  EXPECT_LT(b * std::ldexp(1.0, f.s), std::ldexp(1.0, lim - 1));
  EXPECT_GE(b * std::ldexp(1.0, f.s), std::ldexp(1.0, lim - 2));
  // dout = 0: every value is 0, any scale does.
  EXPECT_EQ(fix_scale(ctl_of(1.f, 0.f, 1.f, 7), scale, 64, 1).s, 0);
  EXPECT_FALSE(fix_scale(ctl_of(1.f, 0.f, 1.f, 7), scale, 64, 1).retry);
}

TEST(DsaFixedPoint, SecondPassOnlyOutsideTheWindow) {
  const float scale = 1.f / 24.f;
  const int lim = fix_limit_bits(4096, 2);
  const int s0 = fix_scale(ctl_of(1.f, 1.f, 1.f, 4096), scale, 64, 2).s;
  auto with_max = [&](double m) {
    return fix_scale(ctl_of(1.f, 1.f, 1.f, 4096, static_cast<float>(m)), scale, 64, 2);
  };
  // In the window [2^kFixLowBits, 2^lim) at s0: no second pass.
  for (int e = kFixLowBits; e < lim; ++e) {
    const FixScale f = with_max(std::ldexp(1.0, e - s0));
    EXPECT_FALSE(f.retry) << e;
    EXPECT_EQ(f.s, s0) << e;
  }
  // Below or above it: the second pass at s1, which puts M in [2^(lim - 1), 2^lim).
  for (int e : {kFixLowBits - 1, kFixLowBits - 30, lim, lim + 40}) {
    const double m = std::ldexp(1.0, e - s0);
    const FixScale f = with_max(m);
    EXPECT_TRUE(f.retry) << e;
    EXPECT_GE(m * std::ldexp(1.0, f.s), std::ldexp(1.0, lim - 1)) << e;
    EXPECT_LT(m * std::ldexp(1.0, f.s), std::ldexp(1.0, lim)) << e;
  }
  // The largest value just under 2^lim at s0 stays; at 2^lim it does not.
  EXPECT_FALSE(with_max(std::nextafter(std::ldexp(1.0f, lim - s0), 0.f)).retry);
  EXPECT_TRUE(with_max(std::ldexp(1.0, lim - s0)).retry);
}

// The first pass never reads max_x (its CTAs raise it while others still run): s0 whatever it
// holds.
TEST(DsaFixedPoint, FirstPassIgnoresThePartialMaximum) {
  const float scale = 1.f / 24.f;
  const int s0 = fix_scale(ctl_of(1.f, 1.f, 1.f, 4096), scale, 64, 2).s;
  for (float m : {1e-30f, 1.f, 1e30f}) {
    const FixScale f = fix_scale(ctl_of(1.f, 1.f, 1.f, 4096, m), scale, 64, 2, true);
    EXPECT_EQ(f.s, s0) << m;
    EXPECT_FALSE(f.retry) << m;
  }
}

TEST(DsaFixedPoint, ScaleClampsAtBothEnds) {
  // Huge maxima: s0 at the low clamp, finite.
  const FixScale big = fix_scale(ctl_of(3e38f, 3e38f, 3e38f, 1), 1.f, 64, 1);
  EXPECT_EQ(big.s, kFixMinShift);
  // The largest finite M fits below the limit at the lowest s.
  EXPECT_LT(3.4028235e38 * std::ldexp(1.0, kFixMinShift), std::ldexp(1.0, fix_limit_bits(1, 1)));
  // Tiny maxima (subnormal ones too): s stays within the clamp, and the smallest M gets the
  // window.
  const float tiny = std::ldexp(1.f, -126), least = std::ldexp(1.f, -149);
  for (float m : {tiny, least}) {
    const FixScale f = fix_scale(ctl_of(tiny, least, tiny, 1, m), 1.f, 1, 1);
    EXPECT_LE(f.s, kFixMaxShift);
    EXPECT_GE(static_cast<double>(m) * std::ldexp(1.0, f.s), std::ldexp(1.0, kFixLowBits)) << m;
    EXPECT_LT(static_cast<double>(m) * std::ldexp(1.0, f.s), std::ldexp(1.0, 62)) << m;
  }
}

TEST(DsaFixedPoint, FactorsMultiplyToThePowerOfTwo) {
  for (int s = kFixMinShift; s <= kFixMaxShift; ++s) {
    const auto f = fix_factors(s);
    EXPECT_TRUE(std::isnormal(f.a) && std::isnormal(f.b)) << s;
    EXPECT_EQ(static_cast<double>(f.a) * f.b, std::ldexp(1.0, s)) << s;
  }
}

}  // namespace
}  // namespace sa_test
