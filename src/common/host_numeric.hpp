// Host-side element access by dtype: read any floating tensor element as double, write a double
// back with round-to-nearest-even. Used by the reference implementation and by tests. Also the
// kernels' exp2 scale, computed once on the host.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "sparse_attention/sparse_attention.h"

namespace sa {

// The softmax scale times log2(e), rounded once to fp32: kernels take exp2(score * this - max).
inline float scale_times_log2e(double scale) {
  return static_cast<float>(scale * 1.4426950408889634);
}

inline float bf16_bits_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

inline float fp16_bits_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal
      float f = std::ldexp(static_cast<float>(man), -24);
      std::memcpy(&u, &f, 4);
      u |= sign;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_fp16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  float a = std::fabs(f);
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7e00u);
  if (a >= 65520.0f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (a < 6.103515625e-05f) {  // subnormal or zero: quantum 2^-24
    float q = std::nearbyint(a * 16777216.0f);  // ties to even under the default mode
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));
  }
  uint32_t ua;
  std::memcpy(&ua, &a, 4);
  uint32_t exp = (ua >> 23) - 112;
  uint32_t man = ua & 0x7fffffu;
  uint32_t h = (exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;  // may carry into the exponent
  return static_cast<uint16_t>(sign | h);
}

inline int64_t dtype_size(sa_dtype t) {
  switch (t) {
    case SA_DTYPE_BF16:
    case SA_DTYPE_FP16: return 2;
    case SA_DTYPE_FP32:
    case SA_DTYPE_INT32: return 4;
    case SA_DTYPE_FP64: return 8;
  }
  return 0;
}

inline const char* dtype_name(sa_dtype t) {
  switch (t) {
    case SA_DTYPE_BF16: return "bf16";
    case SA_DTYPE_FP16: return "fp16";
    case SA_DTYPE_FP32: return "fp32";
    case SA_DTYPE_FP64: return "fp64";
    case SA_DTYPE_INT32: return "int32";
  }
  return "unknown";
}

// Element `off` (in elements) of a floating buffer of dtype t.
inline double load_as_double(const void* base, sa_dtype t, int64_t off) {
  switch (t) {
    case SA_DTYPE_BF16: return bf16_bits_to_float(static_cast<const uint16_t*>(base)[off]);
    case SA_DTYPE_FP16: return fp16_bits_to_float(static_cast<const uint16_t*>(base)[off]);
    case SA_DTYPE_FP32: return static_cast<const float*>(base)[off];
    case SA_DTYPE_FP64: return static_cast<const double*>(base)[off];
    case SA_DTYPE_INT32: return static_cast<const int32_t*>(base)[off];
  }
  return NAN;
}

inline void store_from_double(void* base, sa_dtype t, int64_t off, double v) {
  switch (t) {
    case SA_DTYPE_BF16:
      static_cast<uint16_t*>(base)[off] = float_to_bf16_bits(static_cast<float>(v));
      return;
    case SA_DTYPE_FP16:
      static_cast<uint16_t*>(base)[off] = float_to_fp16_bits(static_cast<float>(v));
      return;
    case SA_DTYPE_FP32: static_cast<float*>(base)[off] = static_cast<float>(v); return;
    case SA_DTYPE_FP64: static_cast<double*>(base)[off] = v; return;
    case SA_DTYPE_INT32: static_cast<int32_t*>(base)[off] = static_cast<int32_t>(v); return;
  }
}

}  // namespace sa
