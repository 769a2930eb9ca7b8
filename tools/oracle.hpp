// The CPU demo's oracle, written independently of the library's reference: plain softmax attention
// in double under the densified mask ([S_q, S_kv], built from the block lists or the active topk
// slots), its backward from the dense softmax derivative, and a central-difference check of that
// backward against the oracle's own forward (so the gradient formulas themselves are tested).
//
// Values are the stored (bf16/fp16) inputs read as doubles, in logical order: BSA tensors as
// [B, H, S, X] whatever the layout; DSA as q [S_q, H, D_qk], kv [S_kv, D_qk], dout [S_q, H, D_v].
#pragma once

#include <cstdint>
#include <vector>

#include "problems.hpp"

namespace sa_tool {

// ---- BSA ----------------------------------------------------------------------------------------
struct BsaDenseInputs {
  std::vector<double> q, k, v, dout;
};
struct BsaDenseResult {
  std::vector<double> o, lse;      // lse = -inf for a row with no key
  std::vector<double> dq, dk, dv;  // only when the backward was asked for
};

BsaDenseInputs bsa_dense_inputs(const BsaProblem& p);
BsaDenseResult bsa_dense_attention(const BsaProblem& p, const BsaDenseInputs& x, bool backward);

// ---- DSA ----------------------------------------------------------------------------------------
struct DsaDenseInputs {
  std::vector<double> q, kv, dout;
  std::vector<double> sink;  // [H]; -inf per head when the problem has no sink
};
struct DsaDenseResult {
  std::vector<double> out, lse;         // lse = +inf for an empty row (SPEC 2)
  std::vector<double> dq, dkv, d_sink;  // only when the backward was asked for
};

DsaDenseInputs dsa_dense_inputs(const DsaProblem& p);
DsaDenseResult dsa_dense_attention(const DsaProblem& p, const DsaDenseInputs& x, bool backward);

// ---- finite differences -------------------------------------------------------------------------
// The backward's gradients are those of loss = sum(dout * o). For `per_tensor` random elements of
// each differentiable input, the central difference (loss(x + h) - loss(x - h)) / 2h of the dense
// forward, against the dense backward's value; returns the relative L2 error over all picks.
struct FiniteDifferenceCheck {
  double rel_error = 0;
  int64_t elements = 0;
};
FiniteDifferenceCheck bsa_finite_differences(const BsaProblem& p, const BsaDenseInputs& x,
                                             const BsaDenseResult& grads, int per_tensor,
                                             uint64_t seed);
FiniteDifferenceCheck dsa_finite_differences(const DsaProblem& p, const DsaDenseInputs& x,
                                             const DsaDenseResult& grads, int per_tensor,
                                             uint64_t seed);

}  // namespace sa_tool
