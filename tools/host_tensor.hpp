// Host tensors of the command-line tool: a contiguous buffer that owns its bytes, and the few
// operations on strided views (sa_tensor) the tool needs: narrow one dimension, read every element
// as a double, count NaNs.
#pragma once

#include <algorithm>

#include <cmath>
#include <cstdint>
#include <vector>

#include "sparse_attention/sparse_attention.hpp"

namespace sa_tool {

class HostTensor {
 public:
  HostTensor() = default;  // absent (an optional tensor that is not given)
  HostTensor(sa_dtype dtype, std::vector<int64_t> shape);

  bool present() const { return !shape_.empty(); }
  sa_dtype dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  size_t bytes() const { return bytes_.size(); }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  int32_t* i32() { return reinterpret_cast<int32_t*>(bytes_.data()); }
  const int32_t* i32() const { return reinterpret_cast<const int32_t*>(bytes_.data()); }

  double get(int64_t i) const;    // element i (row-major) as a double
  void set(int64_t i, double v);  // rounded to the dtype (nearest even)
  void fill(double v);
  // Every bit set: a NaN in bf16, fp16, fp32 and fp64 (floating dtypes only).
  void fill_nan() { std::fill(bytes_.begin(), bytes_.end(), uint8_t{0xff}); }

  sa_tensor view();  // contiguous CPU view (sa_tensor_none() when absent)

 private:
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

}  // namespace sa_tool
