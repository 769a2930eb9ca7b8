// fp64 CPU reference of the four operations (SPEC sections 1 and 2) and of the DSA indexer
// (section 5).
//
// Simple and obviously right rather than fast: every sum is taken in double, straight from the
// formulas of SPEC.md. It is the oracle for every GPU path, and the implementation that serves
// CPU tensors. Inputs are any floating dtype (bf16, fp16, fp32, fp64); outputs are written in
// their own dtype (LSE and d_sink in fp32) with round-to-nearest-even.
//
// The problems come validated from the host API (src/api); these functions only compute.
#pragma once

#include <cmath>

#include "common/indexer_problem.hpp"
#include "common/problem.hpp"

namespace sa::reference {

// exp(s - lse) for a backward that recomputes probabilities from a stored fp32 LSE, capped at 1.
// The exact value is at most 1 (lse >= s for every key of the row); the fp32 rounding of lse,
// about |lse| * 6e-8, can put a huge lse (huge scales or scores) below the largest s by more than
// exp's range, and the cap keeps that row's gradients finite (their accuracy is bounded by the
// same rounding). NaN stays NaN.
inline double softmax_prob(double s, double lse) {
  const double p = std::exp(s - lse);
  return p > 1.0 ? 1.0 : p;
}

// BSA metadata values (SPEC 1): counts in [0, Kmax], the first count entries of each row distinct
// and in [0, Nkv), kv_block_len in [1, block]. Throws SA_ERROR_INVALID_METADATA naming the first
// bad entry, e.g. "q2k_index[b=0, h=1, m=2, slot=3] = 9: expected a KV block in [0, 4)".
void check_bsa_metadata(const BsaDims& dims, const BsaMeta& meta);

void bsa_forward(const BsaFwdProblem& p);
void bsa_backward(const BsaBwdProblem& p);
void dsa_forward(const DsaFwdProblem& p);
void dsa_backward(const DsaBwdProblem& p);

// The DSA lightning indexer (SPEC 5), src/reference/indexer_reference.cpp.
void indexer_scores(const IndexerScoresProblem& p);
void indexer_topk(const IndexerTopkProblem& p);
void indexer_loss(const IndexerLossProblem& p);

}  // namespace sa::reference
