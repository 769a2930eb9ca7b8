// Exponent-binned int32 fixed point in packed 64-bit words (design D1 of
// docs/research/dsa_det_bwd_design_s48.md, section 5): the host and device arithmetic of a
// deterministic DSA backward that rounds each head-reduced dkv value to an int32 on a grid chosen
// by its segment, and adds two int32 columns at a time with one 64-bit integer reduction.
//
// The grid. B = 2^eB bounds every value: every finite |x| < B (bin_bound picks eB, with
// dsa_fixed_point.cuh's estimate and retry). A segment (the values one work item adds to one kv row
// in one piece) goes to bin b in [0, kBinCount) by its maximum m: bin b holds m in
// [B 2^-W(b+1), B 2^-Wb), W = kBinWidth, and the last bin also everything smaller, zero included.
// Bin b rounds its values to v = round(x 2^t_b), t_b = LW - eB + W b, which maps the bin's upper
// edge B 2^-Wb to 2^LW.
//
// What holds:
//   - No overflow: |v| <= 2^LW (bin_shift), and LW = bin_resolution(N, G) keeps the N G values a
//     dkv element receives in one bin within N G 2^LW <= 2^31 - 1, so every column sum is an int32.
//   - Exact sums in any order: a word holding two int32 columns (bin_pack) adds as an integer mod
//     2^64, and a sum of words gives back both exact column sums (bin_unpack), however the partial
//     sums wrapped.
//   - Precision: a segment's maximum m >= B 2^-W(b+1) lands at m 2^t_b >= 2^(LW - W), so every
//     value is rounded within 2^-(L + 1) m of it, L = LW - W; only segments of the last bin below
//     its lower edge B 2^-W kBinCount keep fewer bits (bin_bound retries when the largest does).
//   - A segment's bin and its values' v are functions of the values alone: the sums, and dkv, are
//     the same in every arrival order.
//
// Non-finite values are not binned: a NaN or infinite value marks its kv row, as in the int64
// mode, and its segment goes to the spare row.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/dsa_fixed_point.cuh"

namespace sa::portable::dsa_bwd {

constexpr int kBinCount = 8;
constexpr int kBinWidth = 6;  // binades per bin (W)
// The most LW: bin_round rounds exactly for |x 2^t| <= 2^22.
constexpr int kBinMaxResolution = 22;
// The least LW this mode serves; below it (N G >= 2^17) the caller takes the int64 mode. It
// keeps L = LW - W >= 8 bits under each segment's maximum: the design's precision model
// (section 6, N = 2^17, L = 7) puts the typical error at 2^-9.4 of the key's sum, as coarse as
// bf16's output rounding (~2^-9), against 2^-11.9 at L = 9 (N = 2^15).
constexpr int kBinMinValueBits = 8;
constexpr int kBinMinResolution = kBinMinValueBits + kBinWidth;

// LW for `count` slots on the key and `head_groups` work items per token: the largest L <= 22
// with n 2^L <= 2^31 - 1, n = max(count, 1) max(head_groups, 1); -1 when n > 2^31 - 1.
__host__ __device__ inline int bin_resolution(uint32_t count, int head_groups) {
  constexpr uint64_t kMaxSum = (uint64_t{1} << 31) - 1;
  const uint64_t n = static_cast<uint64_t>(count > 0 ? count : 1) *
                     static_cast<uint64_t>(head_groups > 0 ? head_groups : 1);
  if (n > kMaxSum) return -1;
  int lw = 0;
  while (lw < kBinMaxResolution && (n << (lw + 1)) <= kMaxSum) ++lw;
  return lw;
}

// Whether this mode serves a key with `count` slots (bin_resolution >= min_resolution; tests pass
// a min_resolution above kBinMaxResolution to force the int64 mode).
__host__ __device__ inline bool bin_serves(uint32_t count, int head_groups,
                                           int min_resolution = kBinMinResolution) {
  return bin_resolution(count, head_groups) >= min_resolution;
}

// The accumulator: kBinCount planes, each of skv + 1 rows of dqk / 2 packed words (bin_pack; word
// w of a row holds columns 2w and 2w + 1). Row skv of every plane is the spare row: it takes the
// segments of inactive slots and the non-finite ones, so that no reduction is predicated, and is
// never read. Word w of row `row` in plane `bin` is at bin_word(bin, row, w, skv, dqk).
__host__ __device__ inline int64_t bin_plane_words(int64_t skv, int dqk) {
  return (skv + 1) * (dqk / 2);
}
__host__ __device__ inline int64_t bin_word(int bin, int64_t row, int word, int64_t skv,
                                            int dqk) {
  return bin * bin_plane_words(skv, dqk) + row * (dqk / 2) + word;
}

// E(m), the smallest e with m < 2^e, from the bits of a non-negative finite float m; for zero and
// subnormals (m < 2^-126) -126, an e with m < 2^e but not the smallest.
__host__ __device__ inline int bin_exponent_above(uint32_t m_bits) {
  return static_cast<int>(m_bits >> 23) - 126;  // normal m in [2^(e - 1), 2^e)
}

// The bin of a segment whose maximum |x| has the bits m_bits (a non-negative finite float):
// floor((eB - E(m)) / W) within [0, kBinCount - 1], the finest bin whose upper edge B 2^-Wb lies
// above m (for normal m: m < 2^(eB - Wb) exactly when E(m) <= eB - Wb). Zero and subnormals take
// E = -126, never a bin finer than their true one, so the bound of bin_shift still holds for them.
// Premise m < B: a segment with m >= B goes to bin 0 and its values may exceed 2^LW (bin_round
// is then meaningless and the sums may wrap); the pass is void and bin_bound's retry reruns it
// with B above the maximum.
__host__ __device__ inline int bin_of(uint32_t m_bits, int eB) {
  const int d = eB - bin_exponent_above(m_bits);
  // d clamped to [0, W (kBinCount - 1)] (no branch in the kernels): bins 0 and kBinCount - 1.
  const int c = d < 0 ? 0 : (d > kBinWidth * (kBinCount - 1) ? kBinWidth * (kBinCount - 1) : d);
  return c / kBinWidth;
}

// t of bin b: values are rounded to round(x 2^t). For every finite |x| <= B 2^-Wb,
// |round(x 2^t)| <= 2^LW, given 2 <= LW:
//   - unclamped, t = LW - eB + W b: |x 2^t| <= 2^(eB - Wb) 2^t = 2^LW, an integer, so rounding
//     stays within it;
//   - clamped down to kFixMaxShift: a smaller t only shrinks |x 2^t|;
//   - clamped up to kFixMinShift = -126: |x| < 2^128 for every finite float, so
//     |x 2^-126| < 4 <= 2^LW.
// bin_grid(t) gives bin_round's operands for t (within the clamp); decoding multiplies by 2^-t.
__host__ __device__ inline int bin_shift(int bin, int resolution, int eB) {
  return fix_clamp_shift(resolution - eB + kBinWidth * bin);
}

// The operands of bin_round at t in [kFixMinShift, kFixMaxShift]: x 2^t = (x m) 2^u with
// m = 2^(t - u) and the bias c = 1.5 2^(23 - u), u = t clamped to [-103, 149], so that c and
// 2^(24 - u) are normal floats and m is one too (t - u within [-23, 105]).
struct BinGrid {
  float m, c;
};
__host__ __device__ inline BinGrid bin_grid(int t) {
  const int u = t < -103 ? -103 : (t > 149 ? 149 : t);
  union {
    uint32_t u;
    float f;
  } m, c;
  m.u = static_cast<uint32_t>(t - u + 127) << 23;
  c.u = (static_cast<uint32_t>(23 - u + 127) << 23) | 0x400000u;  // 1.5 2^(23 - u)
  return {m.f, c.f};
}

// round(x 2^t), to nearest with ties to even, for |x 2^t| <= 2^22, with g = bin_grid(t): one fused
// multiply-add. Its exact value x m + c = 2^-u (x 2^t + 1.5 2^23) lies in [2^(23 - u), 2^(24 - u)]
// (x m is exact inside the fma, whatever its size), where the floats are the multiples of 2^-u
// with consecutive bits: rounding it once rounds x 2^t to an integer (1.5 2^23 is even, so ties go
// to even), and subtracting c's bits leaves round(x 2^t).
__host__ __device__ inline int32_t bin_round(float x, BinGrid g) {
  union {
    float f;
    uint32_t u;
  } r{fmaf(x, g.m, g.c)}, bias{g.c};
  return static_cast<int32_t>(r.u - bias.u);
}

// Two int32 columns in one 64-bit word, V = a + 2^32 b mod 2^64: lo = a, hi = b + (a >> 31).
// Words add as integers mod 2^64, in any order.
__host__ __device__ inline uint64_t bin_pack(int32_t a, int32_t b) {
  // The halves directly (a 64-bit addition would carry a constant 0 into the high half).
  const uint32_t lo = static_cast<uint32_t>(a);
  const uint32_t hi = static_cast<uint32_t>(b) + (a < 0 ? 0xffffffffu : 0u);
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

struct BinPair {
  int32_t a, b;
};
// The column sums (A, B) of a sum V of packed words, exact whenever both lie within int32:
// V = A + 2^32 B mod 2^64, so its low half is A mod 2^32, and V - A = 2^32 B mod 2^64, whose high
// half is B mod 2^32.
__host__ __device__ inline BinPair bin_unpack(uint64_t v) {
  const int32_t a = static_cast<int32_t>(static_cast<uint32_t>(v));
  const uint64_t high = (v - static_cast<uint64_t>(static_cast<int64_t>(a))) >> 32;
  return {a, static_cast<int32_t>(static_cast<uint32_t>(high))};
}

// One column's value from its kBinCount bin sums: sum over b of A_b 2^-t_b. Each term is exact in
// double (31 bits, 2^-t within 2^-254..2^126); the terms are added from the last bin to the first
// and the total is rounded to double.
__host__ __device__ inline double bin_decode(const int32_t (&sums)[kBinCount], int resolution,
                                             int eB) {
  double x = 0.0;
  for (int b = kBinCount - 1; b >= 0; --b) {
    x += ldexp(static_cast<double>(sums[b]), -bin_shift(b, resolution, eB));
  }
  return x;
}

struct BinBound {
  int e;       // B = 2^e bounds every value
  bool retry;  // the first pass's e missed: the second pass runs at e
};

// eB for this call from the control words, as fix_scale's s. `first_pass`: from the estimate
// alone, B the smallest power of two above it (at most 2^128, above every finite float);
// otherwise (after the first pass) that e, or the retry's e = E(max_x) when max_x broke the
// premise (max_x >= B) or fell below the last bin's lower edge B 2^-W kBinCount, where it would
// keep fewer than L bits. `rows` and `scale` as fix_scale's.
__host__ __device__ inline BinBound bin_bound(const FixCtl& c, float scale, int rows,
                                              bool first_pass = false) {
  const double estimate = fix_estimate(c, scale, rows);
  int e0 = 0;  // estimate == 0: dout is 0, so is every value
  if (estimate > 0.0) e0 = estimate < 0x1p128 ? fix_exponent_above(estimate) : 128;
  if (first_pass || c.max_x == 0) return {e0, false};
  const int em = bin_exponent_above(c.max_x);
  if (em <= e0 && e0 - em < kBinWidth * kBinCount) return {e0, false};
  return {em, true};
}

}  // namespace sa::portable::dsa_bwd
