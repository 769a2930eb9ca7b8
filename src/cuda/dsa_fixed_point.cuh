// Deterministic DSA backward by fixed-point reductions (the driver's fixed-point mode,
// dsa_backward_driver.hpp): every head-reduced dkv value x a work item produces is rounded once
// to the integer round(x 2^s) and added into an int64 accumulator with an integer reduction.
// Integer addition is associative, so the sums, and dkv, are the same in every arrival order.
//
// What holds:
//   - No overflow: with N the most values any dkv element receives (the key's active slots times
//     the head groups) and lim = 62 - ceil(log2 N), every |round(x 2^s)| <= 2^lim and every
//     partial sum stays within N 2^lim <= 2^62.
//   - Precision: s puts the largest |x| of the call, M, at M 2^s >= 2^kFixLowBits, so each value
//     is rounded at most 2^-(kFixLowBits + 1) M away; the fp32 reductions of the other mode round
//     each partial sum at 2^-24 of its size, which for the N-term sums of a key is as coarse or
//     coarser (bench/NOTES.md, deterministic DSA backward).
//   - s is a function of the inputs only: s0 from the estimate below, kept when the call's M lands
//     in the window [2^kFixLowBits, 2^lim) at s0; otherwise (an estimate off by more than the
//     window, ~20-25 binades) a second pass recomputes every value at s1 from M itself.
//
// The estimate of M: a value sums, over the R <= 64 rows (heads) of a work item, dS' q + P dO with
// P <= 1 and |dS'| <= scale (|dP| + |delta|) <= scale 1024 max|dO| max|kv| (512-term dot
// products, |out| <= max|kv| for a consistent forward), so
// M <= B = R max|dO| (1024 scale max|kv| max|q| + 1).
// B is loose by the dot products' and the softmax's slack (typically 2^8-2^16); s0 puts B at
// 2^(lim - 1). Inputs that break its premises (an lse or out unrelated to q and kv) only cost the
// second pass.
//
// Non-finite values cannot be added as integers: a value that is NaN or infinite marks its kv row
// (dkv_bad), whose every column is written as NaN.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace sa::portable::dsa_bwd {

// Control words, in the workspace, zeroed before the call. The maxima are the bits of
// non-negative finite floats (their uint order is their float order); non-finite inputs are left
// out of them.
struct FixCtl {
  uint32_t max_q;     // max |q|
  uint32_t max_dout;  // max |dout|
  uint32_t max_kv;    // max |kv|
  uint32_t count;     // the most active slots on one key
  uint32_t max_x;     // the first pass's max |x| over finite values
  uint32_t pad[3];
};

constexpr int kFixLowBits = 20;
// s within [-126, 254]: 2^s is the product of two normal floats (fix_factors), so that the
// smallest normal M (2^-126) still gets the window (a finite M never needs s < -126).
constexpr int kFixMinShift = -126;
constexpr int kFixMaxShift = 254;

struct FixScale {
  int s;       // values are rounded to integers at x 2^s
  bool retry;  // the first pass's s0 missed the window: the second pass runs at s
};

// lim for `count` slots on the busiest key and `head_groups` work items per token.
__host__ __device__ inline int fix_limit_bits(uint32_t count, int head_groups) {
  const uint64_t n = static_cast<uint64_t>(count > 0 ? count : 1) *
                     static_cast<uint64_t>(head_groups > 0 ? head_groups : 1);
  int ceil_log2 = 0;
  while ((uint64_t{1} << ceil_log2) < n) ++ceil_log2;
  return 62 - ceil_log2;
}

__host__ __device__ inline int fix_clamp_shift(int s) {
  return s < kFixMinShift ? kFixMinShift : (s > kFixMaxShift ? kFixMaxShift : s);
}

// 2^s = a b with a, b normal floats (s within the clamp): x 2^s is (x a) b, exact unless it
// overflows (then s missed the window anyway) or falls below 2^-126 (below the resolution).
struct FixFactors {
  float a, b;
};
__host__ __device__ inline FixFactors fix_factors(int s) {
  const int sa = s > 127 ? 127 : s;
  union {
    uint32_t u;
    float f;
  } a, b;
  a.u = static_cast<uint32_t>(sa + 127) << 23;
  b.u = static_cast<uint32_t>(s - sa + 127) << 23;
  return {a.f, b.f};
}

// The smallest e with x < 2^e, for finite x > 0.
__host__ __device__ inline int fix_exponent_above(double x) {
  int e = 0;
  frexp(x, &e);  // x = m 2^e, m in [0.5, 1)
  return e;
}

// The estimate B of M above from max |q|, max |dout|, max |kv| (rows and scale as fix_scale's); 0
// when dout is 0 (then so is every value).
__host__ __device__ inline double fix_estimate(float q, float dout, float kv, float scale,
                                               int rows) {
  return static_cast<double>(rows) * dout * (1024.0 * static_cast<double>(scale) * kv * q + 1.0);
}
// The same from the control words.
__host__ __device__ inline double fix_estimate(const FixCtl& c, float scale, int rows) {
  union {
    uint32_t u;
    float f;
  } q{c.max_q}, dout{c.max_dout}, kv{c.max_kv};
  return fix_estimate(q.f, dout.f, kv.f, scale, rows);
}

// s for this call from the control words. `first_pass`: s0 from the estimate alone; the first
// pass must not read max_x, which its own CTAs raise while others still run (a CTA starting late
// would see a partial maximum and could pick another scale). Otherwise (the second pass, the
// conversion: after the first pass is complete) s0, or s1 with retry when max_x missed s0's
// window. `rows`: heads per work item (min(H, the kernel's M)), `scale`: the softmax scale.
__host__ __device__ inline FixScale fix_scale(const FixCtl& c, float scale, int rows,
                                              int head_groups, bool first_pass = false) {
  union {
    uint32_t u;
    float f;
  } q{c.max_q}, dout{c.max_dout}, kv{c.max_kv}, x{c.max_x};
  const int lim = fix_limit_bits(c.count, head_groups);
  const double b = fix_estimate(q.f, dout.f, kv.f, scale, rows);
  int s0 = 0;  // b == 0: dout is 0, so is every value
  if (b > 0.0) s0 = fix_clamp_shift(b < 1e300 ? lim - 1 - fix_exponent_above(b) : kFixMinShift);
  if (first_pass || !(x.f > 0.f)) return {s0, false};
  const int em = fix_exponent_above(x.f);  // M in [2^(em - 1), 2^em)
  if (em + s0 <= lim && em - 1 + s0 >= kFixLowBits) return {s0, false};
  const int s1 = fix_clamp_shift(lim - em);
  return {s1, s1 != s0};
}

}  // namespace sa::portable::dsa_bwd
