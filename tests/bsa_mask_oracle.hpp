// Test-only: the token masks of SPEC 4 written straight from the contract, and a brute-force
// dense masked attention (forward and backward, in double) that uses them. Independent of the
// library's resolution of the mask (validate_bsa.cpp's clamped band): the formulas here take the
// caller's int64 values as they are.
//
//   MaskSpec m;  m.kind = SA_MASK_CAUSAL;  m.offset_given = true;  m.offset = -3;
//   DenseGrads want = dense_masked_attention_grads(shape, pat, m, t, scale);
//
// Header-only; the GPU tests use it too.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bsa_problem_builder.hpp"
#include "sparse_attention/sparse_attention.h"

namespace sa_test {

struct MaskSpec {
  sa_mask kind = SA_MASK_NONE;
  bool offset_given = false;
  int64_t offset = 0;  // used when offset_given; the default is S_kv - S_q
  int64_t window_left = 0, window_right = 0;

  // The options fields of this mask.
  void apply(sa_bsa_options& o) const {
    o.mask = kind;
    o.causal_offset_given = offset_given ? 1 : 0;
    o.causal_offset = offset_given ? offset : 0;
    o.window_left = window_left;
    o.window_right = window_right;
  }

  // SPEC 4: does query token i see key token s (before the block lists)? Computed in long
  // double so that the int64 extremes (offsets near INT64_MAX) do not overflow.
  bool visible(int64_t i, int64_t s, int64_t Sq, int64_t Skv) const {
    if (kind == SA_MASK_NONE) return true;
    const long double c = offset_given ? static_cast<long double>(offset)
                                       : static_cast<long double>(Skv - Sq);
    const long double diag = static_cast<long double>(i) + c;
    const long double key = static_cast<long double>(s);
    const bool causal = kind == SA_MASK_CAUSAL || kind == SA_MASK_CAUSAL_WINDOW;
    const bool window = kind == SA_MASK_WINDOW || kind == SA_MASK_CAUSAL_WINDOW;
    if (causal && key > diag) return false;
    if (window && key < diag - static_cast<long double>(window_left)) return false;
    if (kind == SA_MASK_WINDOW && key > diag + static_cast<long double>(window_right))
      return false;
    return true;
  }
};

// mask[i * Skv + j]: the block lists (dense_bsa_mask) and the token mask together.
inline std::vector<uint8_t> dense_token_mask(const BsaShape& s, const BsaPattern& pat,
                                             const MaskSpec& m, int64_t b, int64_t h) {
  std::vector<uint8_t> mask = dense_bsa_mask(s, pat, b, h);
  for (int64_t i = 0; i < s.Sq; ++i)
    for (int64_t j = 0; j < s.Skv; ++j)
      if (!m.visible(i, j, s.Sq, s.Skv)) mask[static_cast<size_t>(i * s.Skv + j)] = 0;
  return mask;
}

struct DenseGrads {
  std::vector<double> o, lse;  // [B, Hq, Sq, Dv], [B, Hq, Sq] (lse -inf for a row with no key)
  std::vector<double> dq;      // [B, Hq, Sq, D]
  std::vector<double> dk, dv;  // [B, Hkv, Skv, D], [B, Hkv, Skv, Dv]
  std::vector<uint8_t> row_empty;  // [B, Hq, Sq]: the row sees no key
  std::vector<uint8_t> key_seen;   // [B, Hkv, Skv]: some query of the KV head's group sees it
};

// Plain softmax attention under the dense mask, and its exact gradients (loss = <dO, O>), all in
// double, in logical [B, H, S, X] order.
inline DenseGrads dense_masked_attention_grads(const BsaShape& s, const BsaPattern& pat,
                                               const MaskSpec& m, const BsaTensors& t,
                                               float scale) {
  const std::vector<double> q = bhsd_doubles(t.q, s.layout);
  const std::vector<double> k = bhsd_doubles(t.k, s.layout);
  const std::vector<double> v = bhsd_doubles(t.v, s.layout);
  const std::vector<double> dout = bhsd_doubles(t.dout, s.layout);
  const double sc = static_cast<double>(scale);
  DenseGrads g;
  g.o.assign(static_cast<size_t>(s.B * s.Hq * s.Sq * s.Dv), 0.0);
  g.lse.assign(static_cast<size_t>(s.B * s.Hq * s.Sq), -INFINITY);
  g.dq.assign(static_cast<size_t>(s.B * s.Hq * s.Sq * s.D), 0.0);
  g.dk.assign(static_cast<size_t>(s.B * s.Hkv * s.Skv * s.D), 0.0);
  g.dv.assign(static_cast<size_t>(s.B * s.Hkv * s.Skv * s.Dv), 0.0);
  g.row_empty.assign(static_cast<size_t>(s.B * s.Hq * s.Sq), 1);
  g.key_seen.assign(static_cast<size_t>(s.B * s.Hkv * s.Skv), 0);
  std::vector<double> logit(static_cast<size_t>(s.Skv)), p(static_cast<size_t>(s.Skv));
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.Hq; ++h) {
      const int64_t hk = h / s.group();
      const std::vector<uint8_t> mask = dense_token_mask(s, pat, m, b, h);
      for (int64_t i = 0; i < s.Sq; ++i) {
        const size_t row = static_cast<size_t>((b * s.Hq + h) * s.Sq + i);
        const double* qi = &q[row * static_cast<size_t>(s.D)];
        const double* doi = &dout[row * static_cast<size_t>(s.Dv)];
        double mx = -INFINITY;
        for (int64_t j = 0; j < s.Skv; ++j) {
          logit[static_cast<size_t>(j)] = -INFINITY;
          if (!mask[static_cast<size_t>(i * s.Skv + j)]) continue;
          g.key_seen[static_cast<size_t>((b * s.Hkv + hk) * s.Skv + j)] = 1;
          const double* kj = &k[static_cast<size_t>(((b * s.Hkv + hk) * s.Skv + j) * s.D)];
          double dot = 0.0;
          for (int64_t x = 0; x < s.D; ++x) dot += qi[x] * kj[x];
          logit[static_cast<size_t>(j)] = sc * dot;
          mx = std::max(mx, sc * dot);
        }
        if (mx == -INFINITY) continue;  // no key: o = 0, lse = -inf, no gradient
        g.row_empty[row] = 0;
        double sum = 0.0;
        for (double l : logit) sum += std::exp(l - mx);
        const double lse = mx + std::log(sum);
        g.lse[row] = lse;
        double* oi = &g.o[row * static_cast<size_t>(s.Dv)];
        for (int64_t j = 0; j < s.Skv; ++j) {
          p[static_cast<size_t>(j)] = std::exp(logit[static_cast<size_t>(j)] - lse);
          if (p[static_cast<size_t>(j)] == 0.0) continue;
          const double* vj = &v[static_cast<size_t>(((b * s.Hkv + hk) * s.Skv + j) * s.Dv)];
          for (int64_t x = 0; x < s.Dv; ++x) oi[x] += p[static_cast<size_t>(j)] * vj[x];
        }
        double delta = 0.0;
        for (int64_t x = 0; x < s.Dv; ++x) delta += doi[x] * oi[x];
        for (int64_t j = 0; j < s.Skv; ++j) {
          const double pj = p[static_cast<size_t>(j)];
          if (pj == 0.0) continue;
          const size_t kv = static_cast<size_t>((b * s.Hkv + hk) * s.Skv + j);
          const double* kj = &k[kv * static_cast<size_t>(s.D)];
          const double* vj = &v[kv * static_cast<size_t>(s.Dv)];
          double dp = 0.0;
          for (int64_t x = 0; x < s.Dv; ++x) dp += doi[x] * vj[x];
          const double ds = pj * (dp - delta);
          for (int64_t x = 0; x < s.D; ++x) {
            g.dq[row * static_cast<size_t>(s.D) + static_cast<size_t>(x)] += sc * ds * kj[x];
            g.dk[kv * static_cast<size_t>(s.D) + static_cast<size_t>(x)] += sc * ds * qi[x];
          }
          for (int64_t x = 0; x < s.Dv; ++x)
            g.dv[kv * static_cast<size_t>(s.Dv) + static_cast<size_t>(x)] += pj * doi[x];
        }
      }
    }
  }
  return g;
}

}  // namespace sa_test
