#include "host_tensor.hpp"

#include <cmath>

#include "common/host_numeric.hpp"

namespace sa_testing {

HostTensor::HostTensor(sa_dtype dtype, std::vector<int64_t> shape)
    : present_(true), dtype_(dtype), shape_(std::move(shape)) {
  bytes_.assign(static_cast<size_t>(numel() * sa::dtype_size(dtype_)), 0);
}

int64_t HostTensor::numel() const {
  if (!present_) return 0;
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return n;
}

double HostTensor::get(int64_t i) const { return sa::load_as_double(bytes_.data(), dtype_, i); }

void HostTensor::set(int64_t i, double v) { sa::store_from_double(bytes_.data(), dtype_, i, v); }

std::vector<double> HostTensor::to_double() const {
  std::vector<double> out(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out[static_cast<size_t>(i)] = get(i);
  return out;
}

void HostTensor::fill(double v) {
  for (int64_t i = 0; i < numel(); ++i) set(i, v);
}

void HostTensor::fill_uniform(std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < numel(); ++i) set(i, u(rng));
}

void HostTensor::poison() { fill(NAN); }

sa_tensor HostTensor::view() {
  if (!present_) return sa_tensor_none();
  return sa_tensor_contiguous(bytes_.data(), dtype_, static_cast<int32_t>(shape_.size()),
                              shape_.data(), SA_DEVICE_CPU, 0);
}

sa_tensor narrow(sa_tensor t, int dim, int64_t start, int64_t len) {
  t.data = static_cast<char*>(t.data) + start * t.strides[dim] * sa::dtype_size(t.dtype);
  t.shape[dim] = len;
  return t;
}

std::vector<double> values(const sa_tensor& t) {
  int64_t n = 1;
  for (int d = 0; d < t.rank; ++d) n *= t.shape[d];
  std::vector<double> out;
  out.reserve(static_cast<size_t>(n));
  if (n == 0) return out;
  int64_t idx[SA_MAX_RANK] = {0, 0, 0, 0};
  for (int64_t e = 0; e < n; ++e) {
    int64_t off = 0;
    for (int d = 0; d < t.rank; ++d) off += idx[d] * t.strides[d];
    out.push_back(sa::load_as_double(t.data, t.dtype, off));
    for (int d = t.rank - 1; d >= 0; --d) {  // odometer step, last dimension fastest
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

int64_t count_nan(const HostTensor& t) {
  int64_t n = 0;
  for (int64_t i = 0; i < t.numel(); ++i) n += std::isnan(t.get(i)) ? 1 : 0;
  return n;
}

}  // namespace sa_testing
