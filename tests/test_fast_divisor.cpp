// FastDivisor (src/common/fast_divisor.hpp), on the CPU: the kernels divide reverse-map entries by
// N_q with it, so it must equal integer division for every divisor and every non-negative int32.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/fast_divisor.hpp"

namespace sa_test {
namespace {

TEST(FastDivisor, EqualsIntegerDivision) {
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  std::vector<int32_t> divisors;
  for (int32_t d = 1; d <= 4100; ++d) divisors.push_back(d);
  for (int s = 12; s <= 30; ++s) {
    const int32_t p = int32_t{1} << s;
    for (int32_t d : {p - 1, p, p + 1, 3 * (p / 2) + 7}) divisors.push_back(d);
  }
  divisors.push_back(kMax - 1);
  divisors.push_back(kMax);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> any(0, kMax);
  for (int32_t d : divisors) {
    const sa::FastDivisor f = sa::FastDivisor::make(d);
    std::vector<int32_t> xs = {0, 1, d - 1, d, kMax, kMax - 1};
    if (d < kMax) xs.push_back(d + 1);
    for (int32_t q : {2, 3, 1000}) {  // around multiples of d
      const int64_t m = int64_t{q} * d;
      for (int64_t x : {m - 1, m, m + 1})
        if (x >= 0 && x <= kMax) xs.push_back(static_cast<int32_t>(x));
    }
    for (int i = 0; i < 64; ++i) xs.push_back(any(rng));
    for (int32_t x : xs) ASSERT_EQ(f.div(x), x / d) << x << " / " << d;
  }
}

}  // namespace
}  // namespace sa_test
