// Validated problem descriptors of the DSA lightning indexer (SPEC section 5): scores, top-k and
// the KL loss with its gradients. src/api/validate_indexer.cpp fills them; every implementation
// (the fp64 reference now, the portable and Hopper kernels later) reads only these.
//
//   I[t, s] = sum_j w[t, j] * relu(scale_I * <q_I[t, j], k_I[s]>)   for s in range(t)
//
// Conventions resolved by validation:
//  * scale_I (ProblemHeader::scale) and the attention scale of the loss are resolved values;
//  * range(t) = [k_start[t], k_end[t]) clamped to [0, S_kv) (IndexerMeta::range_begin/end): the
//    kernels never see a key outside [0, S_kv);
//  * optional tensors are null pointers; the loss's mode is IndexerMeta::sparse().
#pragma once

#include <cstdint>
#include <sstream>
#include <string>

#include "common/host_numeric.hpp"
#include "common/problem.hpp"
#include "sparse_attention/sparse_attention.h"

namespace sa {

struct IndexerDims {
  int64_t Sq = 0, Skv = 0, HI = 0, DI = 0;
  int64_t topk = 0;       // top-k: k; loss in sparse mode: topk_idx's last dim; else 0
  int64_t H = 0, Dqk = 0;  // loss only: the attention's heads and q/kv width
};

struct IndexerMeta {
  IntView k_start;      // [Sq], or absent: 0
  IntView k_end;        // [Sq], or absent: Skv
  IntView topk_idx;     // loss: [Sq, topk], or absent: dense mode
  IntView topk_length;  // loss: [Sq], or absent

  SA_HD int64_t range_begin(int64_t t, const IndexerDims& d) const {
    const int64_t b = k_start.data ? k_start.at(t) : 0;
    return b < 0 ? 0 : (b > d.Skv ? d.Skv : b);
  }
  SA_HD int64_t range_end(int64_t t, const IndexerDims& d) const {
    const int64_t e = k_end.data ? k_end.at(t) : d.Skv;
    return e < 0 ? 0 : (e > d.Skv ? d.Skv : e);
  }
  // Keys in range(t): max(0, end - begin).
  SA_HD int64_t range_size(int64_t t, const IndexerDims& d) const {
    const int64_t n = range_end(t, d) - range_begin(t, d);
    return n > 0 ? n : 0;
  }
  SA_HD bool sparse() const { return topk_idx.data != nullptr; }
  // Sparse mode: is slot i of row t in K_t? SPEC 2's activity rule (slot before topk_length[t],
  // index in [0, Skv)) and the key inside range(t). Never dereferences a key.
  SA_HD bool slot_in_loss(int64_t t, int64_t i, const IndexerDims& d) const {
    if (topk_length.data && i >= static_cast<int64_t>(topk_length.at(t))) return false;
    return key_in_loss(t, topk_idx.at(t, i), d);
  }
  // The range test of slot_in_loss for a slot of row t that holds key s.
  SA_HD bool key_in_loss(int64_t t, int64_t s, const IndexerDims& d) const {
    return s >= range_begin(t, d) && s < range_end(t, d);
  }
};

// The indexer's inputs, shared by the three operations. dtype (ProblemHeader::dtype) is that of
// q_I and k_I; scale (ProblemHeader::scale) is scale_I.
struct IndexerInputs {
  Shd q_I;                          // [Sq, HI, DI]
  Shd k_I;                          // [Skv, DI] (2-D: sh unused)
  const void* w = nullptr;          // [Sq, HI], dtype w_dtype
  int64_t w_stride[2] = {0, 0};
  sa_dtype w_dtype = SA_DTYPE_FP32;
};

struct IndexerScoresProblem : ProblemHeader<IndexerDims, sa_indexer_options, IndexerMeta> {
  IndexerInputs in;
  float* scores = nullptr;          // [Sq, Skv]
  int64_t scores_stride[2] = {0, 0};
  // Internal (the two-pass top-k, whose row kernel reads each row's range only): a kernel may
  // leave the elements outside each row's range unwritten instead of storing -inf there.
  bool in_range_only = false;
};

struct IndexerTopkProblem : ProblemHeader<IndexerDims, sa_indexer_options, IndexerMeta> {
  IndexerInputs in;
  int32_t* topk_idx = nullptr;      // [Sq, topk]
  int64_t topk_idx_stride[2] = {0, 0};
  int32_t* topk_length = nullptr;   // [Sq], or absent
  int64_t topk_length_stride = 1;
};

struct IndexerLossProblem : ProblemHeader<IndexerDims, sa_indexer_options, IndexerMeta> {
  IndexerInputs in;
  // The attention target.
  Shd q, kv;                        // [Sq, H, Dqk], [Skv, Dqk] (2-D)
  sa_dtype attn_dtype = SA_DTYPE_BF16;
  float attn_scale = 0.f;           // resolved
  const float* lse = nullptr;       // [Sq, H]
  int64_t lse_stride[2] = {0, 0};
  // Outputs.
  void* loss = nullptr;             // scalar, dtype loss_dtype
  void* loss_per_token = nullptr;   // [Sq], or absent
  int64_t loss_per_token_stride = 1;
  sa_dtype loss_dtype = SA_DTYPE_FP32;
  Shd dq_I, dk_I;                   // [Sq, HI, DI], [Skv, DI] (2-D); null data: no gradients
  void* dw = nullptr;               // [Sq, HI], dtype in.w_dtype
  int64_t dw_stride[2] = {0, 0};
  bool has_grad() const { return dq_I.data != nullptr; }
};

// The tensor contract SPEC 5 sets for every GPU path (bf16 q_I, k_I, q and kv, fp32 w and loss,
// D_I = 128, H_I in {16, 32, 64}): "" when it holds, else what does not, naming the argument.
// Validation applies it to CUDA tensors; a GPU implementation's `unsupported` adds only its own
// limits.
inline std::string indexer_gpu_contract(const IndexerDims& d, sa_dtype dtype_I,
                                        sa_dtype w_dtype) {
  std::ostringstream why;
  if (dtype_I != SA_DTYPE_BF16)
    why << "q_I: dtype " << dtype_name(dtype_I) << " (the GPU paths take bf16)";
  else if (w_dtype != SA_DTYPE_FP32)
    why << "w: dtype " << dtype_name(w_dtype) << " (the GPU paths take fp32)";
  else if (d.DI != 128)
    why << "q_I: D_I = " << d.DI << " (the GPU paths take 128)";
  else if (d.HI != 16 && d.HI != 32 && d.HI != 64)
    why << "q_I: H_I = " << d.HI << " (the GPU paths take 16, 32 or 64)";
  return why.str();
}

inline std::string indexer_gpu_contract(const IndexerLossProblem& p) {
  std::string why = indexer_gpu_contract(p.dims, p.dtype, p.in.w_dtype);
  if (!why.empty()) return why;
  std::ostringstream os;
  if (p.attn_dtype != SA_DTYPE_BF16)
    os << "q: dtype " << dtype_name(p.attn_dtype) << " (the GPU paths take bf16)";
  else if (p.loss_dtype != SA_DTYPE_FP32)
    os << "loss: dtype " << dtype_name(p.loss_dtype) << " (the GPU paths write fp32)";
  return os.str();
}

}  // namespace sa
