// Where the BSA backward's per-row fp32 buffers (lse2, delta, the dQ accumulator) keep a packed
// batch's rows (SPEC 4), shared by the plan, the preprocess and conversion passes and the
// portable kernels.
//
// A dense batch gives each (b, h) Sq_pad = N_q * block rows. A packed batch cannot (B * N_q_max *
// block rows can be B times T_q), so its buffers are [H_q, rows] with
//   rows = packed_stat_rows(T_q, B, block)  ~ T_q + B (block + 4)
// and sequence b's local row r at packed_stat_row0(b, q0) + r, where
//   packed_stat_row0(b, q0) = (q0 rounded down to a multiple of 4) + b (block + 4):
//  * 16-byte aligned (the main kernel copies 4 rows of stats at a time by cp.async);
//  * a sequence's rows [0, sq + block - 1) (its last tile's rows past its end included) never
//    reach the next sequence's row0 (row0(b + 1) >= q0 + sq - 3 + (b + 1)(block + 4)), so the
//    padding rows past a sequence's end (lse2 = +inf, delta = 0: P = dS = 0) are its own and a
//    tile's dQ reductions of those rows (exact zeros) land in them;
//  * every row any kernel addresses is below `rows`, whatever cu_seqlens holds (offsets are
//    clamped into [0, T_q] first, BsaMeta::seq).
// The dK/dV accumulators of rows with several groups are [H_kv, T_kv] by the global key: only a
// block's valid keys are added, and those are the sequence's own.
// Sizes depend on shapes only, never on cu_seqlens values (graph replay).
#pragma once

#include <cstdint>

#include "common/problem.hpp"

namespace sa::portable {

SA_HD int64_t packed_stat_row0(int64_t b, int64_t q0, int32_t block) {
  return (q0 & ~int64_t{3}) + b * (block + 4);
}

SA_HD int64_t packed_stat_rows(int64_t T_q, int64_t B, int32_t block) {
  const int64_t rows = T_q + B * (block + 4);
  return (rows + 63) / 64 * 64;
}

// Sequence of a packed batch holding global token t (cu = cu_seqlens, B sequences): the largest
// b with cu[b] <= t, offsets clamped as BsaMeta::seq does. With offsets that meet the contract,
// t lies in [cu[b], cu[b + 1]). Device and host.
SA_HD int32_t packed_seq_of_token(const int32_t* cu, int64_t stride, int32_t B, int64_t T,
                                  int64_t t) {
  int32_t lo = 0, hi = B - 1;  // answer in [lo, hi]
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (clamp_to(cu[mid * stride], 0, T) <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Sequence whose buffer region holds buffer row x: the largest b with
// packed_stat_row0(b, cu[b]) <= x (0 when none is).
SA_HD int32_t packed_seq_of_stat_row(const int32_t* cu, int64_t stride, int32_t B, int64_t T,
                                     int32_t block, int64_t x) {
  int32_t lo = 0, hi = B - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (packed_stat_row0(mid, clamp_to(cu[mid * stride], 0, T), block) <= x)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace sa::portable
