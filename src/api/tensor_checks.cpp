#include "api/tensor_checks.hpp"

#include <cuda_runtime_api.h>

#include <cfloat>
#include <cmath>
#include <sstream>

#include "common/host_numeric.hpp"
#include "common/narrow.hpp"

namespace sa::api {

std::string shape_str(const sa_tensor& t) {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < t.rank && i < SA_MAX_RANK; ++i) os << (i ? ", " : "") << t.shape[i];
  os << "]";
  return os.str();
}

std::string strides_str(const sa_tensor& t) {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < t.rank && i < SA_MAX_RANK; ++i) os << (i ? ", " : "") << t.strides[i];
  os << "]";
  return os.str();
}

void check_scale(float scale, const char* default_doc) {
  // 0 (either sign) is the default. Anything else is used as given: finite, normal, and small
  // enough that the kernels' scale * log2(e) is finite in fp32 (kMaxScale).
  const bool ok = scale == 0.f || (std::isfinite(scale) && std::fabs(scale) >= FLT_MIN &&
                                   std::fabs(scale) <= kMaxScale);
  SA_CHECK_ARG(ok, "options.scale: expected 0 (for " << default_doc << ") or a finite value "
                       << "with " << FLT_MIN << " <= |scale| <= " << kMaxScale << ", got "
                       << scale);
}

static const char* device_name(sa_device_type d) { return d == SA_DEVICE_CUDA ? "cuda" : "cpu"; }

static void check_cuda_pointer(const void* p, const char* name, int32_t index) {
  cudaPointerAttributes attr{};
  cudaError_t e = cudaPointerGetAttributes(&attr, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error state of this query
    SA_FAIL(SA_ERROR_INVALID_ARGUMENT,
            name << ": tensor says device cuda:" << index << " but the CUDA runtime cannot "
                 << "inspect its pointer (" << cudaGetErrorString(e) << ")");
  }
  SA_CHECK_ARG(attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged,
               name << ": tensor says device cuda:" << index
                    << " but its pointer is not device memory");
  SA_CHECK_ARG(attr.device == index, name << ": tensor says device cuda:" << index
                                          << " but its memory is on cuda:" << attr.device);
}

void check_tensor(const sa_tensor& t, const char* name, const TensorRules& r,
                  DevicePlace& place) {
  SA_CHECK_ARG(t.data != nullptr, name << ": required tensor is missing (data is NULL)");
  SA_CHECK_ARG(t.rank == r.rank,
               name << ": expected rank " << r.rank << ", got rank " << t.rank << " "
                    << shape_str(t));
  bool dtype_ok = false;
  const int32_t dtype = enum_bits(t.dtype);
  if (r.dtypes.size() == 0) {
    dtype_ok = dtype == SA_DTYPE_BF16 || dtype == SA_DTYPE_FP16 || dtype == SA_DTYPE_FP32 ||
               dtype == SA_DTYPE_FP64;
  } else {
    for (sa_dtype d : r.dtypes) dtype_ok |= (d == dtype);
  }
  if (!dtype_ok) {
    std::ostringstream allowed;
    if (r.dtypes.size() == 0) {
      allowed << "bf16, fp16, fp32 or fp64";
    } else {
      bool first = true;
      for (sa_dtype d : r.dtypes) {
        allowed << (first ? "" : " or ") << dtype_name(d);
        first = false;
      }
    }
    SA_FAIL(SA_ERROR_INVALID_ARGUMENT, name << ": expected dtype " << allowed.str() << ", got "
                                            << (dtype >= SA_DTYPE_BF16 && dtype <= SA_DTYPE_INT32
                                                    ? dtype_name(static_cast<sa_dtype>(dtype))
                                                    : "an unknown dtype"));
  }
  for (int i = 0; i < t.rank; ++i) {
    SA_CHECK_ARG(t.shape[i] >= 0, name << ": dimension " << i << " is negative ("
                                       << shape_str(t) << ")");
    SA_CHECK_ARG(t.strides[i] >= 0, name << ": stride " << i << " is negative ("
                                         << t.strides[i] << "); strides must be >= 0");
    if (r.output && t.shape[i] > 1)
      SA_CHECK_ARG(t.strides[i] > 0, name << ": output stride " << i
                                          << " is 0 on a dimension of size " << t.shape[i]
                                          << "; outputs cannot broadcast");
  }
  // Every element count, element offset and byte offset of the view fits in int64, so that no
  // size product made from these dimensions downstream can overflow.
  int64_t numel = 1;
  for (int i = 0; i < t.rank; ++i)
    SA_CHECK_ARG(!mul_overflows(numel, t.shape[i], &numel),
                 name << ": shape " << shape_str(t) << " holds more than 2^63 - 1 elements");
  if (numel > 0) {
    int64_t last = 0;  // offset of the farthest element, in elements
    for (int i = 0; i < t.rank; ++i) {
      int64_t step = 0;
      SA_CHECK_ARG(!mul_overflows(t.shape[i] - 1, t.strides[i], &step) &&
                       !add_overflows(last, step, &last),
                   name << ": shape " << shape_str(t) << " with strides " << strides_str(t)
                        << " addresses elements past offset 2^63 - 1");
    }
    int64_t bytes = 0;
    SA_CHECK_ARG(!mul_overflows(last, dtype_size(t.dtype), &bytes),
                 name << ": shape " << shape_str(t) << " with strides " << strides_str(t)
                      << " spans more than 2^63 - 1 bytes");
  }
  if (r.inner_contiguous && t.rank > 0 && t.shape[t.rank - 1] > 1)
    SA_CHECK_ARG(t.strides[t.rank - 1] == 1, name << ": the last dimension must be contiguous "
                                                  << "(stride 1), got stride "
                                                  << t.strides[t.rank - 1]);
  SA_CHECK_ARG(enum_bits(t.device) == SA_DEVICE_CPU || enum_bits(t.device) == SA_DEVICE_CUDA,
               name << ": unknown device type " << enum_bits(t.device));
  if (!place.set) {
    place.set = true;
    place.device = t.device;
    place.index = t.device == SA_DEVICE_CUDA ? t.device_index : 0;
  } else {
    int32_t idx = t.device == SA_DEVICE_CUDA ? t.device_index : 0;
    SA_CHECK_ARG(t.device == place.device && idx == place.index,
                 name << ": expected device " << device_name(place.device)
                      << (place.device == SA_DEVICE_CUDA ? ":" + std::to_string(place.index) : "")
                      << " like the other tensors, got " << device_name(t.device)
                      << (t.device == SA_DEVICE_CUDA ? ":" + std::to_string(idx) : ""));
  }
  if (t.device == SA_DEVICE_CUDA) {
    // Vector loads need 16-byte aligned rows for the floating tensors; int32 metadata needs 4.
    int64_t esize = dtype_size(t.dtype);
    int64_t align = t.dtype == SA_DTYPE_INT32 ? 4 : 16;
    SA_CHECK_ARG(reinterpret_cast<uintptr_t>(t.data) % align == 0,
                 name << ": CUDA data pointer must be " << align << "-byte aligned");
    if (t.dtype != SA_DTYPE_INT32 && t.dtype != SA_DTYPE_FP32) {
      for (int i = 0; i + 1 < t.rank; ++i)
        SA_CHECK_ARG((t.strides[i] * esize) % 16 == 0 || t.shape[i] == 1,
                     name << ": stride " << i << " (" << t.strides[i]
                          << " elements) must be a multiple of 16 bytes on CUDA");
    }
    check_cuda_pointer(t.data, name, t.device_index);
  }
}

bool check_optional(const sa_tensor& t, const char* name, const TensorRules& rules,
                    DevicePlace& place) {
  if (t.data == nullptr) return false;
  check_tensor(t, name, rules, place);
  return true;
}

void check_dim(const sa_tensor& t, const char* name, int dim, int64_t expected,
               const char* what) {
  SA_CHECK_ARG(t.shape[dim] == expected, name << ": dimension " << dim << " must be " << what
                                              << " = " << expected << ", got " << t.shape[dim]
                                              << " (shape " << shape_str(t) << ")");
}

void check_same_dtype(const sa_tensor& t, const char* name, const sa_tensor& ref,
                      const char* ref_name) {
  SA_CHECK_ARG(t.dtype == ref.dtype, name << ": expected dtype " << dtype_name(ref.dtype)
                                          << " (the dtype of " << ref_name << "), got "
                                          << dtype_name(t.dtype));
}

IntView int_view(const sa_tensor& t) {
  IntView v;
  v.data = static_cast<const int32_t*>(t.data);
  for (int i = 0; i < t.rank && i < 4; ++i) v.stride[i] = t.strides[i];
  return v;
}

}  // namespace sa::api
