// Host pieces that the Hopper indexer launchers share (indexer_scores.cu, indexer_topk.cu): q_I
// and k_I as TMA tensors, the checks they need, and the score kernel's parameters.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>

#include "common/indexer_problem.hpp"
#include "cuda/indexer_checks.hpp"
#include "sm90/indexer_scores_kernel.cuh"
#include "sm90/tma_descriptor.hpp"

namespace sa::sm90::indexer {

// q_I [S_q, H_I, D] seen as a BHSD tensor [1, S_q, H_I, D] (a box = one token's H_I rows of 64
// columns); k_I [S_kv, D] as [1, 1, S_kv, D] (a box = 64 keys of 64 columns).
inline Bhsd q_as_bhsd(const IndexerInputs& in) {
  Bhsd t;
  t.data = in.q_I.data;
  t.sb = 0;
  t.sh = in.q_I.ss;
  t.ss = in.q_I.sh;
  t.sd = in.q_I.sd;
  return t;
}

inline Bhsd k_as_bhsd(const IndexerInputs& in) {
  Bhsd t;
  t.data = in.k_I.data;
  t.sb = 0;
  t.sh = 0;
  t.ss = in.k_I.ss;
  t.sd = in.k_I.sd;
  return t;
}

// "" when the inputs suit the portable checks and TMA (q_I, k_I descriptors; token coordinates,
// up to S_q + 63, in int32); else the reason naming `path`.
template <class Problem>
std::string inputs_unsupported(const Problem& p, const char* path) {
  const IndexerDims& d = p.dims;
  std::string why = portable::indexer_inputs_unsupported(p, path);
  if (!why.empty()) return why;
  why = check_tma_tensor("q_I", q_as_bhsd(p.in), 1, d.Sq, d.HI);
  if (why.empty()) why = check_tma_tensor("k_I", k_as_bhsd(p.in), 1, 1, d.Skv);
  if (!why.empty()) return why + " (" + path + ")";
  if (d.Sq > INT32_MAX - 64) {
    std::ostringstream os;
    os << "S_q = " << d.Sq << " (" << path << " supports < 2^31 - 64)";
    return os.str();
  }
  return "";
}

// The score kernel's parameters of problem p (out, out_ss and key_chunks left 0).
template <int kHeads, class Problem>
ScoresParams score_params(const char* path, const Problem& p) {
  using T = ScoresTraits<kHeads>;
  const IndexerDims& d = p.dims;
  ScoresParams prm{};
  prm.tma_q = make_tensor_map(path, "q_I", q_as_bhsd(p.in), 1, d.Sq, d.HI, d.DI, kHeads);
  prm.tma_k = make_tensor_map(path, "k_I", k_as_bhsd(p.in), 1, 1, d.Skv, d.DI, T::kTileKeys);
  prm.w = static_cast<const float*>(p.in.w);
  prm.w_ss = p.in.w_stride[0];
  prm.w_sh = p.in.w_stride[1];
  prm.dims = d;
  prm.meta = p.meta;
  prm.scale = p.scale;
  prm.q_blocks = static_cast<int32_t>((d.Sq + T::kTokensPerCta - 1) / T::kTokensPerCta);
  return prm;
}

}  // namespace sa::sm90::indexer
