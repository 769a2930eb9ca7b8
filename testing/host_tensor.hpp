// Host tensors for the tests and the command-line tool: a contiguous buffer that owns its bytes,
// and the few operations on strided CPU views (sa_tensor) both need. Nothing here calls into the
// library except through its public API and the host numeric conversions.
//
//   HostTensor q(SA_DTYPE_BF16, {S, H, D});   // zeros, rounded to bf16 on every set()
//   std::mt19937_64 rng(seed);  q.fill_uniform(rng);
//   sa_tensor v = q.view();                     // a contiguous CPU view of its bytes
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "sparse_attention/sparse_attention.hpp"

namespace sa_testing {

class HostTensor {
 public:
  // Absent (an optional tensor that is not given): present() is false, numel() 0, view() is
  // sa_tensor_none().
  HostTensor() = default;
  // Present, zero-filled; an empty shape is a scalar (one element).
  HostTensor(sa_dtype dtype, std::vector<int64_t> shape);

  bool present() const { return present_; }
  sa_dtype dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  size_t nbytes() const { return bytes_.size(); }
  std::vector<uint8_t>& bytes() { return bytes_; }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  int32_t* i32() { return reinterpret_cast<int32_t*>(bytes_.data()); }
  const int32_t* i32() const { return reinterpret_cast<const int32_t*>(bytes_.data()); }

  double get(int64_t i) const;    // element i (row-major) as a double
  void set(int64_t i, double v);  // rounded to the dtype (nearest even)
  std::vector<double> to_double() const;  // every element, row-major

  void fill(double v);
  // Uniform in [lo, hi) from `rng`, element by element in row-major order, rounded to the dtype.
  void fill_uniform(std::mt19937_64& rng, double lo = -1.0, double hi = 1.0);
  // Floating dtypes only: NaN in every element (the canonical NaN, rounded to the dtype).
  void poison();
  // Every bit set: a NaN in bf16, fp16, fp32 and fp64 (floating dtypes only).
  void fill_nan() { std::fill(bytes_.begin(), bytes_.end(), uint8_t{0xff}); }

  sa_tensor view();  // contiguous CPU view (sa_tensor_none() when absent)

 private:
  bool present_ = false;
  sa_dtype dtype_ = SA_DTYPE_FP32;
  std::vector<int64_t> shape_;
  std::vector<uint8_t> bytes_;
};

// `t` restricted to [start, start + len) along `dim`, like torch.narrow: same strides, the data
// pointer moved to the first element.
sa_tensor narrow(sa_tensor t, int dim, int64_t start, int64_t len);

// Every element of a CPU view, in row-major order of its shape, as doubles.
std::vector<double> values(const sa_tensor& t);

// NaN elements of a floating host tensor.
int64_t count_nan(const HostTensor& t);

}  // namespace sa_testing
