// The exponent-binned int32 fixed point of the DSA backward (cuda/dsa_binned_fixed.cuh), on the
// host: packed words summed in any order, the overflow bound at its worst case, the bins' edges
// and the bound of their shifts, the decode of all bins, the resolution, the bound's retry, and
// the design's precision model (docs/research/dsa_det_bwd_design_s48.md, section 6).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "cuda/dsa_binned_fixed.cuh"
#include "fix_ctl_util.hpp"

namespace sa_test {
namespace {

using sa::portable::dsa_bwd::bin_bound;
using sa::portable::dsa_bwd::bin_decode;
using sa::portable::dsa_bwd::bin_exponent_above;
using sa::portable::dsa_bwd::bin_grid;
using sa::portable::dsa_bwd::bin_of;
using sa::portable::dsa_bwd::bin_pack;
using sa::portable::dsa_bwd::bin_plane_words;
using sa::portable::dsa_bwd::bin_resolution;
using sa::portable::dsa_bwd::bin_round;
using sa::portable::dsa_bwd::bin_serves;
using sa::portable::dsa_bwd::bin_shift;
using sa::portable::dsa_bwd::bin_unpack;
using sa::portable::dsa_bwd::bin_word;
using sa::portable::dsa_bwd::BinBound;
using sa::portable::dsa_bwd::BinPair;
using sa::portable::dsa_bwd::FixCtl;
using sa::portable::dsa_bwd::kBinCount;
using sa::portable::dsa_bwd::kBinMaxResolution;
using sa::portable::dsa_bwd::kBinMinResolution;
using sa::portable::dsa_bwd::kBinWidth;
using sa::portable::dsa_bwd::kFixMaxShift;
using sa::portable::dsa_bwd::kFixMinShift;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();

// round(x 2^t), ties to even, in double (the reference for bin_round).
double round_at(float x, int t) { return std::nearbyint(std::ldexp(static_cast<double>(x), t)); }

// The finest bin whose upper edge B 2^-Wb lies above m, from the definition, in double.
int true_bin(float m, int eB) {
  int b = 0;
  while (b + 1 < kBinCount && static_cast<double>(m) < std::ldexp(1.0, eB - kBinWidth * (b + 1)))
    ++b;
  return b;
}

// int32 values whose int64 sum is `target`: `count` random ones over the whole int32 range (their
// partial sums leave int32 often), then as many as it takes to reach the target.
std::vector<int32_t> values_summing_to(int64_t target, int count, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> any(std::numeric_limits<int32_t>::min(),
                                             std::numeric_limits<int32_t>::max());
  std::vector<int32_t> v(count);
  int64_t sum = 0;
  for (int32_t& x : v) sum += x = any(rng);
  for (int64_t rest = target - sum; rest != 0;) {
    const int64_t x = std::clamp(rest, kInt32Min, kInt32Max);
    v.push_back(static_cast<int32_t>(x));
    rest -= x;
  }
  return v;
}

TEST(DsaBinnedFixed, PackedWordsRoundTrip) {
  const int32_t edge[] = {std::numeric_limits<int32_t>::min(), -1, 0, 1,
                          std::numeric_limits<int32_t>::max()};
  for (int32_t a : edge) {
    for (int32_t b : edge) {
      const BinPair p = bin_unpack(bin_pack(a, b));
      EXPECT_EQ(p.a, a) << a << " " << b;
      EXPECT_EQ(p.b, b) << a << " " << b;
    }
  }
}

// Column sums up to int32's limits, from words added in random orders whose partial sums wrap.
TEST(DsaBinnedFixed, WrappedPartialSumsDecodeExactly) {
  std::mt19937_64 rng(0x5eed0001);
  const int64_t targets[][2] = {{kInt32Max, -kInt32Max}, {-kInt32Max, kInt32Max},
                                {kInt32Max, kInt32Max},  {-kInt32Max, -kInt32Max},
                                {kInt32Min, kInt32Max},  {0, 0},
                                {123456789, -987654321}};
  for (const auto& target : targets) {
    std::vector<int32_t> a = values_summing_to(target[0], 1000, rng);
    std::vector<int32_t> b = values_summing_to(target[1], 1000, rng);
    a.resize(std::max(a.size(), b.size()), 0);
    b.resize(a.size(), 0);
    std::vector<size_t> order(a.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    for (int shuffle = 0; shuffle < 5; ++shuffle) {
      std::shuffle(order.begin(), order.end(), rng);
      uint64_t v = 0;
      int64_t partial = 0;
      bool wrapped = false;
      for (size_t i : order) {
        v += bin_pack(a[i], b[i]);
        partial += a[i];
        wrapped |= partial > kInt32Max || partial < kInt32Min;
      }
      EXPECT_TRUE(wrapped);
      const BinPair p = bin_unpack(v);
      EXPECT_EQ(p.a, target[0]) << shuffle;
      EXPECT_EQ(p.b, target[1]) << shuffle;
    }
  }
}

TEST(DsaBinnedFixed, ResolutionLeavesRoomForEveryAddition) {
  EXPECT_EQ(bin_resolution(4096, 2), 17);
  EXPECT_EQ(bin_resolution(4096, 1), 18);
  EXPECT_EQ(bin_resolution(2048, 1), 19);
  EXPECT_EQ(bin_resolution(0, 0), kBinMaxResolution);
  EXPECT_EQ(bin_resolution(511, 1), kBinMaxResolution);  // 511 2^22 = 2^31 - 2^22
  EXPECT_EQ(bin_resolution(512, 1), 21);
  EXPECT_EQ(bin_resolution(0x7fffffff, 1), 0);
  EXPECT_LT(bin_resolution(0x80000000u, 1), kBinMinResolution);
  EXPECT_LT(bin_resolution(UINT32_MAX, 2), kBinMinResolution);
  EXPECT_FALSE(bin_serves(UINT32_MAX, 2));
  // Served through n = 2^17 - 1 (LW 14), not from 2^17 on (LW 13).
  EXPECT_TRUE(bin_serves((1u << 16) - 1, 2));
  EXPECT_TRUE(bin_serves((1u << 17) - 1, 1));
  EXPECT_FALSE(bin_serves(1u << 17, 1));
  EXPECT_FALSE(bin_serves(1u << 16, 2));
  // A least resolution above the cap serves nothing (the tests' forced int64 form).
  for (uint32_t count : {0u, 1u, 511u, 4096u})
    EXPECT_FALSE(bin_serves(count, 1, kBinMaxResolution + 1)) << count;
  EXPECT_TRUE(bin_serves(511, 1, kBinMaxResolution));
  // LW is the largest with n 2^LW <= 2^31 - 1, unless capped.
  for (uint64_t n : {1u, 3u, 1000u, 4096u, 65535u, 131071u, 1u << 20, 0x7fffffffu}) {
    const int lw = bin_resolution(static_cast<uint32_t>(n), 1);
    ASSERT_GE(lw, 0) << n;
    EXPECT_LE(n << lw, static_cast<uint64_t>(kInt32Max)) << n;
    if (lw < kBinMaxResolution) {
      EXPECT_GT(n << (lw + 1), static_cast<uint64_t>(kInt32Max)) << n;
    }
  }
}

// N G values of the largest magnitude, 2^LW (a bin's upper edge, rounded by bin_round), all of
// one sign per column: the column sums reach N G 2^LW and still decode exactly.
TEST(DsaBinnedFixed, WorstCaseSumsStayWithinInt32) {
  for (uint32_t count : {1u, 1u << 11, 1u << 17}) {
    for (int groups : {1, 2}) {
      const int lw = bin_resolution(count, groups);
      const int64_t n = static_cast<int64_t>(count) * groups;
      ASSERT_GE(lw, 2);
      const int e_bound = 10, bin = 3;
      const float top = std::ldexp(1.f, e_bound - kBinWidth * bin);
      const auto f = bin_grid(bin_shift(bin, lw, e_bound));
      const int32_t v = bin_round(top, f);
      ASSERT_EQ(v, int64_t{1} << lw);
      ASSERT_EQ(bin_round(-top, f), -v);
      EXPECT_LE(n * v, kInt32Max) << count << " " << groups;
      for (int sa : {1, -1}) {
        for (int sb : {1, -1}) {
          const uint64_t word = bin_pack(sa * v, sb * v);
          uint64_t sum = 0;
          for (int64_t i = 0; i < n; ++i) sum += word;
          const BinPair p = bin_unpack(sum);
          EXPECT_EQ(p.a, sa * n * v) << count << " " << groups << " " << sa;
          EXPECT_EQ(p.b, sb * n * v) << count << " " << groups << " " << sb;
        }
      }
    }
  }
}

TEST(DsaBinnedFixed, ExponentFromBits) {
  for (int e = -125; e <= 128; ++e) {
    const float low = std::ldexp(1.f, e - 1);  // the bottom of [2^(e - 1), 2^e)
    EXPECT_EQ(bin_exponent_above(bits(low)), e) << e;
    EXPECT_EQ(bin_exponent_above(bits(std::nextafter(low, 0.f))), e - 1) << e;
  }
  EXPECT_EQ(bin_exponent_above(bits(FLT_MAX)), 128);
  EXPECT_EQ(bin_exponent_above(bits(0.f)), -126);
  EXPECT_EQ(bin_exponent_above(bits(std::ldexp(1.f, -149))), -126);
}

// Each bin's upper edge B 2^-Wb belongs to the bin above; just below it, to the bin itself.
TEST(DsaBinnedFixed, BinEdges) {
  for (int e_bound : {-60, -20, 0, 13, 40, 100, 127}) {
    for (int b = 0; b <= kBinCount; ++b) {
      const int e_edge = e_bound - kBinWidth * b;
      if (e_edge < -125) continue;
      const float edge = std::ldexp(1.f, e_edge), below = std::nextafter(edge, 0.f);
      EXPECT_EQ(bin_of(bits(edge), e_bound), std::clamp(b - 1, 0, kBinCount - 1))
          << e_bound << " " << b;
      EXPECT_EQ(bin_of(bits(below), e_bound), std::min(b, kBinCount - 1)) << e_bound << " " << b;
      if (b > 0) {
        EXPECT_EQ(bin_of(bits(edge), e_bound), true_bin(edge, e_bound)) << e_bound << " " << b;
      }
      EXPECT_EQ(bin_of(bits(below), e_bound), true_bin(below, e_bound));
    }
    // Zero goes to the last bin; m just below B and m = B itself (the premise's limit) to bin 0.
    EXPECT_EQ(bin_of(bits(0.f), e_bound), kBinCount - 1);
    EXPECT_EQ(bin_of(bits(std::nextafter(std::ldexp(1.f, e_bound), 0.f)), e_bound), 0);
    EXPECT_EQ(bin_of(bits(std::ldexp(1.f, e_bound)), e_bound), 0);
  }
  // B = 2^128, above every finite float: FLT_MAX is in bin 0.
  EXPECT_EQ(bin_of(bits(FLT_MAX), 128), 0);
  // Random normal maxima: the bin of the definition.
  std::mt19937_64 rng(0x5eed0002);
  std::uniform_real_distribution<double> exponent(-120.0, 60.0);
  for (int i = 0; i < 100000; ++i) {
    const float m = static_cast<float>(std::exp2(exponent(rng)));
    ASSERT_EQ(bin_of(bits(m), 60), true_bin(m, 60)) << m;
  }
}

// Subnormal maxima take E = -126: their bin is never finer than the true one.
TEST(DsaBinnedFixed, SubnormalMaximaNeverGetAFinerBin) {
  for (int e_bound : {-120, -100, -90, -80, -60, 0}) {
    for (float m : {std::ldexp(1.f, -149), std::ldexp(1.f, -140), std::ldexp(1.f, -127),
                    std::nextafter(std::ldexp(1.f, -126), 0.f)}) {
      const int b = bin_of(bits(m), e_bound);
      EXPECT_LE(b, true_bin(m, e_bound)) << e_bound << " " << m;
      EXPECT_LE(static_cast<double>(m), std::ldexp(1.0, e_bound - kBinWidth * b));
    }
  }
  // 2^-126 and above: the true bin again.
  EXPECT_EQ(bin_of(bits(std::ldexp(1.f, -126)), -90), true_bin(std::ldexp(1.f, -126), -90));
}

// |round(x 2^t)| <= 2^LW for x up to each bin's upper edge, at the edge, just below it, both
// signs; bin_round agrees with round-to-nearest-even in double.
TEST(DsaBinnedFixed, ShiftBoundsEveryBin) {
  for (int lw : {kBinMinResolution, 17, kBinMaxResolution}) {
    const double limit = std::ldexp(1.0, lw);
    for (int e_bound : {-60, 0, 13, 40, 127, 128}) {
      for (int b = 0; b < kBinCount; ++b) {
        const int e_edge = e_bound - kBinWidth * b;
        if (e_edge < -125) continue;
        const int t = bin_shift(b, lw, e_bound);
        const auto f = bin_grid(t);
        const float edge = e_edge <= 127 ? std::ldexp(1.f, e_edge) : FLT_MAX;
        const float below = std::nextafter(edge, 0.f);
        for (float m : {edge, below, std::nextafter(below, 0.f)}) {
          for (float x : {m, -m}) {
            EXPECT_LE(std::fabs(round_at(x, t)), limit) << lw << " " << e_bound << " " << b;
            EXPECT_EQ(bin_round(x, f), round_at(x, t)) << lw << " " << e_bound << " " << b;
          }
        }
        if (e_edge <= 127) {
          EXPECT_EQ(bin_round(edge, f), int64_t{1} << lw) << lw << " " << e_bound << " " << b;
        }
      }
    }
  }
  // The clamps. Up: at B = 2^200 (above every float), t of bin 0 would be -186; at -126 even
  // FLT_MAX rounds to 4.
  const int up = bin_shift(0, kBinMinResolution, 200);
  EXPECT_EQ(up, kFixMinShift);
  EXPECT_EQ(bin_round(FLT_MAX, bin_grid(up)), 4);
  EXPECT_EQ(bin_round(-FLT_MAX, bin_grid(up)), -4);
  // Down: at B = 2^-200 only 0 meets the premise; t stays finite.
  EXPECT_EQ(bin_shift(kBinCount - 1, kBinMaxResolution, -200), kFixMaxShift);
  EXPECT_EQ(bin_round(0.f, bin_grid(kFixMaxShift)), 0);
}

// Ties go to even, halves and quarters round to nearest, the sign is kept.
TEST(DsaBinnedFixed, RoundsToNearestEven) {
  const auto one = bin_grid(0);
  const float cases[] = {0.5f,       1.5f,   -0.5f,   -1.5f,      2.5f,        -2.5f,
                         0.25f,      0.75f,  -0.75f,  4194303.5f, -4194303.5f, 4194304.f,
                         -4194304.f, 1e-30f, -1e-30f, 0.f};
  for (float x : cases) EXPECT_EQ(bin_round(x, one), round_at(x, 0)) << x;
  // At t = 148: the subnormal 3 2^-149 is 1.5, rounding to 2.
  EXPECT_EQ(bin_round(std::ldexp(3.f, -149), bin_grid(148)), 2);
  std::mt19937_64 rng(0x5eed0003);
  std::uniform_real_distribution<float> in(-4194304.f, 4194304.f);
  for (int i = 0; i < 100000; ++i) {
    const float x = in(rng);
    ASSERT_EQ(bin_round(x, one), round_at(x, 0)) << x;
  }
}

// Every t of the clamp, through the grid's three regimes (u = t; u = -103 with m < 1; u = 149
// with m > 1) and their edges: random x with |x 2^t| <= 2^22, ties, the largest magnitude and
// subnormal x, against round-to-nearest-even in double.
TEST(DsaBinnedFixed, RoundsAtEveryShift) {
  std::mt19937_64 rng(0x5eed0005);
  std::uniform_real_distribution<double> frac(-1.0, 1.0);
  for (int t = kFixMinShift; t <= kFixMaxShift; ++t) {
    const auto g = bin_grid(t);
    std::vector<float> xs;
    for (int i = 0; i < 400; ++i) {
      // |x| up to 2^(22 - t) (or FLT_MAX), on a spread of magnitudes.
      const int e = std::uniform_int_distribution<int>(-30, 0)(rng);
      const double x = std::ldexp(frac(rng), 22 - t + e);
      if (std::fabs(x) < static_cast<double>(FLT_MAX)) xs.push_back(static_cast<float>(x));
    }
    for (double k : {0.5, 1.5, -2.5, 4194303.5, -4194304.0}) {  // ties and the limit at 2^-t
      const double x = std::ldexp(k, -t);
      if (std::fabs(x) < static_cast<double>(FLT_MAX) && static_cast<float>(x) == x)
        xs.push_back(static_cast<float>(x));
    }
    for (float x : {std::ldexp(1.f, -149), -std::ldexp(5.f, -149), std::ldexp(1.f, -126), 0.f})
      if (std::fabs(std::ldexp(static_cast<double>(x), t)) <= std::ldexp(1.0, 22)) xs.push_back(x);
    for (float x : xs) {
      ASSERT_LE(std::fabs(std::ldexp(static_cast<double>(x), t)), std::ldexp(1.0, 22));
      ASSERT_EQ(bin_round(x, g), round_at(x, t)) << "t " << t << " x " << x;
    }
  }
}

// Bin b's sum is worth 2^-t_b; all bins together, exactly when the total fits a double.
TEST(DsaBinnedFixed, DecodesEveryBin) {
  for (int e_bound : {-30, 0, 20, 128}) {
    for (int lw : {kBinMinResolution, kBinMaxResolution}) {
      for (int b = 0; b < kBinCount; ++b) {
        int32_t sums[kBinCount] = {};
        sums[b] = -3;
        EXPECT_EQ(bin_decode(sums, lw, e_bound), -3 * std::ldexp(1.0, -bin_shift(b, lw, e_bound)));
      }
      // 8 terms of at most 5 bits, 6 binades apart: 47 bits, exact in any order.
      int32_t sums[kBinCount];
      double expected = 0.0;
      for (int b = 0; b < kBinCount; ++b) {
        sums[b] = (b % 2 ? -1 : 1) * (17 + b);
        expected += std::ldexp(static_cast<double>(sums[b]), -bin_shift(b, lw, e_bound));
      }
      EXPECT_EQ(bin_decode(sums, lw, e_bound), expected) << e_bound << " " << lw;
    }
  }
}

TEST(DsaBinnedFixed, BoundFromTheEstimateAndItsRetry) {
  const float scale = 1.f / 24.f;
  const double estimate = 64.0 * (1024.0 * scale + 1.0);  // 2794.7
  const BinBound first = bin_bound(ctl_of(1.f, 1.f, 1.f, 4096), scale, 64, true);
  EXPECT_FALSE(first.retry);
  EXPECT_LT(estimate, std::ldexp(1.0, first.e));
  EXPECT_GE(estimate, std::ldexp(1.0, first.e - 1));
  const int e0 = first.e;
  auto with_max = [&](float m, bool first_pass = false) {
    return bin_bound(ctl_of(1.f, 1.f, 1.f, 4096, m), scale, 64, first_pass);
  };
  // Kept from just below B down to the last bin's lower edge B 2^-48.
  const int floor_e = e0 - kBinWidth * kBinCount;
  for (float m : {0.f, std::nextafter(std::ldexp(1.f, e0), 0.f), std::ldexp(1.f, e0 - 20),
                  std::ldexp(1.f, floor_e)}) {
    EXPECT_FALSE(with_max(m).retry) << m;
    EXPECT_EQ(with_max(m).e, e0) << m;
  }
  // B itself or above: the premise broke; below B 2^-48: the largest segment would lose bits.
  // The second pass puts B just above max_x.
  for (float m : {std::ldexp(1.f, e0), std::ldexp(1.f, e0 + 30),
                  std::nextafter(std::ldexp(1.f, floor_e), 0.f), std::ldexp(1.f, floor_e - 40)}) {
    const BinBound r = with_max(m);
    EXPECT_TRUE(r.retry) << m;
    EXPECT_LT(static_cast<double>(m), std::ldexp(1.0, r.e)) << m;
    EXPECT_GE(static_cast<double>(m), std::ldexp(1.0, r.e - 1)) << m;
  }
  // The first pass ignores max_x; dout = 0 keeps e = 0; huge maxima cap B at 2^128.
  EXPECT_EQ(with_max(1e30f, true).e, e0);
  EXPECT_FALSE(with_max(1e30f, true).retry);
  EXPECT_EQ(bin_bound(ctl_of(1.f, 0.f, 1.f, 7), scale, 64).e, 0);
  EXPECT_EQ(bin_bound(ctl_of(3e38f, 3e38f, 3e38f, 1), 1.f, 64, true).e, 128);
}

// The design's precision model (section 6) at N 4,096, s 3: one key, N segments of 64 columns
// g a (g ~ N(0, 1) per column, log2 a ~ N(0, 3^2)), B = 2^(E(m) + 12) for the largest segment
// maximum m, LW from N with G = 1; each segment binned by its maximum, rounded, summed as packed
// words (column pairs) and decoded. The rms error over columns, relative to the rms of the fp64
// sum: 2^-15.49 at this seed with libstdc++'s distributions, 2^-14.87 to 2^-15.65 over seeds 1-8
// (the design's NumPy model: 2^-15.2).
TEST(DsaBinnedFixed, PrecisionModel) {
  constexpr int kN = 4096, kColumns = 64;
  std::mt19937_64 rng(0x5eed0004);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<float> x(static_cast<size_t>(kN) * kColumns);
  std::vector<float> seg_max(kN, 0.f);
  for (int i = 0; i < kN; ++i) {
    const double a = std::exp2(3.0 * normal(rng));
    for (int j = 0; j < kColumns; ++j) {
      const float v = static_cast<float>(normal(rng) * a);
      x[static_cast<size_t>(i) * kColumns + j] = v;
      seg_max[i] = std::max(seg_max[i], std::fabs(v));
    }
  }
  const float largest = *std::max_element(seg_max.begin(), seg_max.end());
  const int e_bound = bin_exponent_above(bits(largest)) + 12;
  const int lw = bin_resolution(kN, 1);
  ASSERT_TRUE(bin_serves(kN, 1));

  std::vector<uint64_t> words(static_cast<size_t>(kBinCount) * (kColumns / 2), 0);
  std::vector<int64_t> exact(static_cast<size_t>(kBinCount) * kColumns, 0);  // the int64 sums
  std::vector<double> reference(kColumns, 0.0);
  for (int i = 0; i < kN; ++i) {
    const int b = bin_of(bits(seg_max[i]), e_bound);
    const auto f = bin_grid(bin_shift(b, lw, e_bound));
    const float* seg = &x[static_cast<size_t>(i) * kColumns];
    for (int k = 0; k < kColumns / 2; ++k) {
      const int32_t lo = bin_round(seg[2 * k], f), hi = bin_round(seg[2 * k + 1], f);
      words[static_cast<size_t>(b) * (kColumns / 2) + k] += bin_pack(lo, hi);
      exact[static_cast<size_t>(b) * kColumns + 2 * k] += lo;
      exact[static_cast<size_t>(b) * kColumns + 2 * k + 1] += hi;
    }
    for (int j = 0; j < kColumns; ++j) reference[j] += seg[j];
  }
  double err2 = 0.0, ref2 = 0.0;
  for (int k = 0; k < kColumns / 2; ++k) {
    int32_t lo[kBinCount], hi[kBinCount];
    for (int b = 0; b < kBinCount; ++b) {
      const BinPair p = bin_unpack(words[static_cast<size_t>(b) * (kColumns / 2) + k]);
      lo[b] = p.a;
      hi[b] = p.b;
      ASSERT_EQ(p.a, exact[static_cast<size_t>(b) * kColumns + 2 * k]) << b << " " << k;
      ASSERT_EQ(p.b, exact[static_cast<size_t>(b) * kColumns + 2 * k + 1]) << b << " " << k;
    }
    const double got[2] = {bin_decode(lo, lw, e_bound), bin_decode(hi, lw, e_bound)};
    for (int c = 0; c < 2; ++c) {
      const double r = reference[2 * k + c];
      err2 += (got[c] - r) * (got[c] - r);
      ref2 += r * r;
    }
  }
  const double rel = std::sqrt(err2 / ref2);
  std::printf("[ precision ] D1 at N %d, s 3: rms error 2^%.2f of the rms sum (LW %d)\n", kN,
              std::log2(rel), lw);
  EXPECT_LE(rel, std::exp2(-14.5));
}

// The planes' layout: kBinCount planes of skv + 1 rows of dqk / 2 words, every (plane, row, word)
// at its own index and the planes contiguous; row skv (the spare row) last in each plane; a row's
// words contiguous, so that a warp instruction's eight words of one row (words 8m .. 8m + 7) are
// 64 contiguous bytes, 64-byte aligned where the planes' base is. The int64 rows [skv + 1, dqk]
// take the bytes of two planes (dqk / 2 words of 8 bytes per row and plane): the binned plan's
// int64 form fits at the planes' start.
TEST(DsaBinnedFixed, PlaneLayout) {
  for (int dqk : {512, 576}) {
    for (int64_t skv : {int64_t{1}, int64_t{7}, int64_t{300}}) {
      const int64_t plane = bin_plane_words(skv, dqk);
      EXPECT_EQ(plane, (skv + 1) * (dqk / 2));
      std::vector<int> seen(static_cast<size_t>(kBinCount * plane), 0);
      for (int b = 0; b < kBinCount; ++b) {
        for (int64_t row = 0; row <= skv; ++row) {
          for (int w = 0; w < dqk / 2; ++w) {
            const int64_t at = bin_word(b, row, w, skv, dqk);
            ASSERT_GE(at, b * plane);
            ASSERT_LT(at, (b + 1) * plane);
            ++seen[static_cast<size_t>(at)];
          }
        }
        EXPECT_EQ(bin_word(b, skv, dqk / 2 - 1, skv, dqk), (b + 1) * plane - 1);
        EXPECT_EQ(bin_word(b, 3, 9, skv, dqk), bin_word(b, 3, 8, skv, dqk) + 1);
        EXPECT_EQ(bin_word(b, 2, 8, skv, dqk) % 8, 0) << "64-byte pieces of a row";
      }
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
      EXPECT_GE(2 * plane * 8, (skv + 1) * dqk * 8);
    }
  }
}

}  // namespace
}  // namespace sa_test
