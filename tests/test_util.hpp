// Helpers shared by the test files: comparisons and the GPU skip; host tensors come from the
// testing library (testing/), which the command-line tool shares. Nothing here calls into the
// library except through its public API.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/host_numeric.hpp"
#include "sparse_attention/sparse_attention.hpp"
#include "testing/host_tensor.hpp"

namespace sa_test {

// Host tensors of any dtype (testing/host_tensor.hpp, shared with the command-line tool).
using sa_testing::HostTensor;

// ||a - b|| / max(||b||, tiny); NaN anywhere gives NaN (which fails every comparison).
inline double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = a[i] - b[i];
    num += d * d;
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

inline double l2_norm(const std::vector<double>& a) {
  double n = 0;
  for (double x : a) n += x * x;
  return std::sqrt(n);
}

// ||a - b|| / max(||b||, floor): rel_l2 for a quantity that may cancel to (near) 0, whose error is
// then bounded by its terms' rounding rather than by its own norm.
inline double rel_l2_floor(const std::vector<double>& a, const std::vector<double>& b,
                           double floor) {
  double num = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(num) / std::max({l2_norm(b), floor, 1e-30});
}

inline bool any_nan(const std::vector<double>& a) {
  for (double x : a)
    if (std::isnan(x)) return true;
  return false;
}

// Every element equal bit for bit (same bytes).
inline bool bitwise_equal(const HostTensor& a, const HostTensor& b) {
  return a.bytes() == b.bytes();
}

// inf/NaN at the same positions, finite values within atol + rtol*|b|; reports the worst element.
inline ::testing::AssertionResult all_close(const std::vector<double>& a,
                                            const std::vector<double>& b, double atol,
                                            double rtol) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "size mismatch";
  size_t worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i]))
      return ::testing::AssertionFailure() << "NaN at " << i << ": " << a[i] << " vs " << b[i];
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i])
        return ::testing::AssertionFailure() << "inf mismatch at " << i << ": " << a[i] << " vs "
                                             << b[i];
      continue;
    }
    double excess = std::fabs(a[i] - b[i]) - (atol + rtol * std::fabs(b[i]));
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  if (worst_excess > 0)
    return ::testing::AssertionFailure() << "worst element " << worst << ": " << a[worst]
                                         << " vs " << b[worst] << " (atol " << atol << ", rtol "
                                         << rtol << ")";
  return ::testing::AssertionSuccess();
}

// True when this process sees at least one CUDA device. GPU tests call GTEST_SKIP() otherwise.
bool cuda_available();

}  // namespace sa_test

#define SA_SKIP_WITHOUT_GPU()                                          \
  do {                                                                 \
    if (!::sa_test::cuda_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)
