// Split-KV forward, the combine pass (arch-neutral CUDA): merges the per-split normalised outputs
// and LSEs that a split-KV forward wrote to its workspace into the caller's o and lse.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/problem.hpp"
#include "sparse_attention/sparse_attention.h"

namespace sa::portable {

struct BsaCombineArgs {
  const float* o_part;    // [splits, B, Hq, Sq, D] fp32, each split's O normalised by its own sum
  const float* lse_part;  // [splits, B, Hq, Sq] fp32 natural-log LSE of each split (-inf: no key)
  int32_t splits, B, Hq, Sq, D;
  Bhsd o;                 // output, 16-bit (dtype), rows < Sq
  float* lse;             // output [B, Hq, Sq] with lse_stride
  int64_t lse_stride[3];
  sa_dtype dtype;         // SA_DTYPE_BF16 or SA_DTYPE_FP16
};

// For every row: m = max_s lse_s; w_s = exp(lse_s - m) / sum_s exp(lse_s - m);
// o = sum_s w_s o_s; lse = m + log(sum_s exp(lse_s - m)). A row whose splits all have LSE = -inf
// gets o = 0 and lse = -inf (SPEC's empty row). One warp per row; launches on `stream`.
void bsa_forward_combine(const BsaCombineArgs& a, cudaStream_t stream);

}  // namespace sa::portable
