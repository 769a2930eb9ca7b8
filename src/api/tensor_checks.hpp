// Argument checks shared by the validation of every operation. Each check throws sa::Error with
// SA_ERROR_INVALID_ARGUMENT and a message that names the argument and what was expected.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "api/enum_bits.hpp"
#include "common/error.hpp"
#include "common/problem.hpp"
#include "sparse_attention/sparse_attention.h"

namespace sa::api {

std::string shape_str(const sa_tensor& t);
std::string strides_str(const sa_tensor& t);

// The largest |options.scale|: scale * log2(e), which the kernels use, is finite in fp32.
constexpr float kMaxScale = 2.35865e38f;

// options.scale: 0 (the default, `default_doc`) or a finite, normal fp32 value of magnitude at
// most kMaxScale; negative scales are allowed.
void check_scale(float scale, const char* default_doc);

// Where every tensor of a call lives; the first present tensor fixes it.
struct DevicePlace {
  bool set = false;
  sa_device_type device = SA_DEVICE_CPU;
  int32_t index = 0;
};

// The checked inputs that every problem of an operation shares (its validate_*.cpp): shapes,
// metadata, the resolved scale and the device.
template <class Dims, class Meta>
struct CheckedCommon {
  Dims dims;
  Meta meta;
  float scale = 0;
  DevicePlace place;
};

// The flat token-major view (DSA and indexer tensors: [S, H, D] or [S, D]) of a checked tensor.
inline Shd to_shd(const sa_tensor& t) {
  Shd v;
  v.data = t.data;
  v.ss = t.strides[0];
  if (t.rank == 3) {
    v.sh = t.strides[1];
    v.sd = t.strides[2];
  } else {
    v.sd = t.strides[1];
  }
  return v;
}

// A problem's shared fields (ProblemHeader) from the checked inputs.
template <class Dims, class Options, class Meta>
void fill_header(ProblemHeader<Dims, Options, Meta>& h, const CheckedCommon<Dims, Meta>& c,
                 sa_dtype dtype, const Options& options) {
  h.dims = c.dims;
  h.dtype = dtype;
  h.device = c.place.device;
  h.device_index = c.place.index;
  h.scale = c.scale;
  h.options = options;
  h.meta = c.meta;
}

struct TensorRules {
  int rank = 0;                               // required rank
  std::initializer_list<sa_dtype> dtypes{};   // allowed dtypes (empty: any floating)
  bool inner_contiguous = true;               // last-dim stride must be 1
  bool output = false;                        // no zero or negative strides on dims of size > 1
};

// Checks presence, rank, dtype, strides, the element count and the farthest offset (in
// elements and bytes) against int64, device (same as `place`), CUDA pointer kind and alignment.
// `name` is the argument name used in messages ("q", "sparsity.q2k_index", ...).
void check_tensor(const sa_tensor& t, const char* name, const TensorRules& rules,
                  DevicePlace& place);

// Same, but an absent tensor (data == NULL) passes and returns false.
bool check_optional(const sa_tensor& t, const char* name, const TensorRules& rules,
                    DevicePlace& place);

// Dimension `dim` of `t` must be `expected`; `what` describes it ("S_q (from q)").
void check_dim(const sa_tensor& t, const char* name, int dim, int64_t expected,
               const char* what);

// The same dtype as a reference tensor.
void check_same_dtype(const sa_tensor& t, const char* name, const sa_tensor& ref,
                      const char* ref_name);

// Metadata view of an int32 tensor (strides copied, rank <= 4).
IntView int_view(const sa_tensor& t);

}  // namespace sa::api
