// Helpers shared by the test files: host tensors of any dtype, random fills, NaN poisoning,
// comparisons, a scoped environment variable. Header-only; nothing here calls into the library
// except through its public API.
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

namespace sa_test {

// A contiguous host tensor that owns its bytes.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(sa_dtype dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
    bytes_.assign(static_cast<size_t>(numel() * sa::dtype_size(dtype_)), 0);
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape_) n *= s;
    return n;
  }
  sa_dtype dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  std::vector<uint8_t>& bytes() { return bytes_; }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

  sa_tensor view() {
    return sa_tensor_contiguous(bytes_.data(), dtype_, static_cast<int32_t>(shape_.size()),
                                shape_.data(), SA_DEVICE_CPU, 0);
  }
  double get(int64_t i) const { return sa::load_as_double(bytes_.data(), dtype_, i); }
  void set(int64_t i, double v) { sa::store_from_double(bytes_.data(), dtype_, i, v); }
  int32_t* i32() { return reinterpret_cast<int32_t*>(bytes_.data()); }
  const int32_t* i32() const { return reinterpret_cast<const int32_t*>(bytes_.data()); }

  std::vector<double> to_double() const {
    std::vector<double> out(static_cast<size_t>(numel()));
    for (int64_t i = 0; i < numel(); ++i) out[static_cast<size_t>(i)] = get(i);
    return out;
  }
  void fill_uniform(std::mt19937_64& rng, double lo = -1.0, double hi = 1.0) {
    std::uniform_real_distribution<double> u(lo, hi);
    for (int64_t i = 0; i < numel(); ++i) set(i, u(rng));
  }
  void fill(double v) {
    for (int64_t i = 0; i < numel(); ++i) set(i, v);
  }
  void poison() { fill(NAN); }  // floating dtypes only

 private:
  sa_dtype dtype_ = SA_DTYPE_FP32;
  std::vector<int64_t> shape_;
  std::vector<uint8_t> bytes_;
};

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
