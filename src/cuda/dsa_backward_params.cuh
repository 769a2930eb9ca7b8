// What the DSA backward kernels (portable: dsa_backward_kernel.cuh; Hopper:
// src/sm90/dsa_backward_kernel.cuh) share on the device: the per-row normalizer and sink share of
// SPEC 2's backward (their argument struct: dsa_backward_params.hpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/problem.hpp"
#include "cuda/dsa_backward_params.hpp"

namespace sa::portable::dsa_bwd {

// L = logaddexp(lse, sink) in log2 units, or +inf when the row takes no part (lse = +inf: empty
// row; sink = +inf: P = 0; a huge finite sink overflows L * log2(e) to +inf, the same). Never NaN
// for lse in (-inf, +inf].
__device__ __forceinline__ float row_log2_normalizer(float lse, float sink) {
  const float kInf = INFINITY;
  if (!(lse < kInf) || sink == kInf) return kInf;
  float L = lse;
  if (sink > -kInf) L = fmaxf(lse, sink) + log1pf(expf(-fabsf(lse - sink)));
  return L * 1.4426950408889634f;
}

// exp(sink - L) for a row that takes part (finite lse): 1 for sink = +inf or huge (L == sink),
// 0 for sink = -inf.
__device__ __forceinline__ float sink_share(float lse, float sink) {
  const float kInf = INFINITY;
  if (sink == -kInf) return 0.f;
  if (sink == kInf) return 1.f;
  const float L = fmaxf(lse, sink) + log1pf(expf(-fabsf(lse - sink)));
  return expf(sink - L);
}

}  // namespace sa::portable::dsa_bwd
