// Test-only helpers for the DSA lightning indexer (SPEC 5): the host tensors of one case, range
// patterns (causal, packed batches, empty and out-of-bounds ranges), and the public-API argument
// structs that view them. Header-only; GPU tests can copy the host tensors to the device and
// point the same structs at the copies.
//
//   IndexerShape s;  s.Sq = 6;  s.Skv = 9;
//   IndexerCase c = make_indexer_case(s, IndexerRanges::kCausal, SA_DTYPE_FP64, /*seed*/ 1);
//   sparse_attention::IndexerTopkArgs a = c.topk_args(/*k*/ 4);
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "sparse_attention/sparse_attention.hpp"
#include "test_util.hpp"

namespace sa_test {

struct IndexerShape {
  int64_t Sq = 6, Skv = 9, HI = 3, DI = 8;  // the indexer
  int64_t H = 2, Dqk = 10;                  // the attention (loss target)
};

enum class IndexerRanges {
  kNone,    // no k_start / k_end: every key
  kCausal,  // key s <= t + (Skv - Sq), bottom-right aligned
  kPacked,  // two sequences back to back (queries and keys split at about 40%), causal in each
  kOdd      // empty (k_end <= k_start), clamped (k_start < 0, k_end > Skv) and one-key ranges
};

struct IndexerCase {
  IndexerShape shape;
  sa_dtype dtype = SA_DTYPE_FP64;  // of q_I, k_I, q, kv; w is fp64 with fp64, else fp32
  bool has_range = false;
  HostTensor q_I, k_I, w, k_start, k_end;
  HostTensor q, kv, lse;

  // SPEC 5's range of query t, written here without IndexerMeta: [k_start, k_end) within
  // [0, Skv).
  int64_t begin(int64_t t) const {
    return has_range ? std::clamp<int64_t>(k_start.i32()[t], 0, shape.Skv) : 0;
  }
  int64_t end(int64_t t) const {
    return has_range ? std::clamp<int64_t>(k_end.i32()[t], 0, shape.Skv) : shape.Skv;
  }
  bool in_range(int64_t t, int64_t s) const { return s >= begin(t) && s < end(t); }

  sa_tensor opt(HostTensor& t) { return has_range ? t.view() : sa_tensor_none(); }

  sparse_attention::IndexerScoresArgs scores_args(HostTensor& scores) {
    sparse_attention::IndexerScoresArgs a;
    a.q_I = q_I.view();
    a.k_I = k_I.view();
    a.w = w.view();
    a.k_start = opt(k_start);
    a.k_end = opt(k_end);
    a.scores = scores.view();
    return a;
  }
  sparse_attention::IndexerTopkArgs topk_args(HostTensor& idx, HostTensor* length) {
    sparse_attention::IndexerTopkArgs a;
    a.q_I = q_I.view();
    a.k_I = k_I.view();
    a.w = w.view();
    a.k_start = opt(k_start);
    a.k_end = opt(k_end);
    a.topk_idx = idx.view();
    a.topk_length = length ? length->view() : sa_tensor_none();
    return a;
  }
  // Loss outputs: scalar loss, per-token values, gradients (absent when `grads` is false).
  struct LossOut {
    HostTensor loss, per_token, dq_I, dk_I, dw;
  };
  LossOut loss_out(sa_dtype loss_dtype) const {
    LossOut o;
    o.loss = HostTensor(loss_dtype, {});
    o.per_token = HostTensor(loss_dtype, {shape.Sq});
    o.dq_I = HostTensor(q_I.dtype(), q_I.shape());
    o.dk_I = HostTensor(k_I.dtype(), k_I.shape());
    o.dw = HostTensor(w.dtype(), w.shape());
    for (HostTensor* t : {&o.loss, &o.per_token, &o.dq_I, &o.dk_I, &o.dw}) t->poison();
    return o;
  }
  // Sparse mode when `idx` is given (with `length` if given), dense mode otherwise.
  sparse_attention::IndexerLossArgs loss_args(LossOut& out, HostTensor* idx, HostTensor* length,
                                              bool grads = true) {
    sparse_attention::IndexerLossArgs a;
    a.q_I = q_I.view();
    a.k_I = k_I.view();
    a.w = w.view();
    a.q = q.view();
    a.kv = kv.view();
    a.lse = lse.view();
    a.topk_idx = idx ? idx->view() : sa_tensor_none();
    a.topk_length = length ? length->view() : sa_tensor_none();
    a.k_start = opt(k_start);
    a.k_end = opt(k_end);
    a.loss = out.loss.view();
    a.loss_per_token = out.per_token.view();
    if (grads) {
      a.dq_I = out.dq_I.view();
      a.dk_I = out.dk_I.view();
      a.dw = out.dw.view();
    }
    return a;
  }
};

inline void fill_ranges(IndexerCase& c, IndexerRanges ranges) {
  const IndexerShape& s = c.shape;
  c.has_range = ranges != IndexerRanges::kNone;
  c.k_start = HostTensor(SA_DTYPE_INT32, {s.Sq});
  c.k_end = HostTensor(SA_DTYPE_INT32, {s.Sq});
  const int64_t q_split = std::max<int64_t>(1, s.Sq * 2 / 5);
  const int64_t k_split = std::max<int64_t>(1, s.Skv * 2 / 5);
  for (int64_t t = 0; t < s.Sq; ++t) {
    int64_t b = 0, e = s.Skv;
    switch (ranges) {
      case IndexerRanges::kNone: break;
      case IndexerRanges::kCausal: e = t + 1 + (s.Skv - s.Sq); break;
      case IndexerRanges::kPacked:
        if (t < q_split) {
          b = 0;
          e = std::min(k_split, t + 1 + (k_split - q_split));
        } else {
          b = k_split;
          e = std::min(s.Skv, k_split + (t - q_split) + 1 + ((s.Skv - k_split) - (s.Sq - q_split)));
        }
        break;
      case IndexerRanges::kOdd: {
        const int64_t pattern[6][2] = {{3, 3}, {-5, 2}, {s.Skv - 2, s.Skv + 7}, {5, 1},
                                       {1, 2}, {-9, s.Skv + 9}};
        b = pattern[t % 6][0];
        e = pattern[t % 6][1];
        break;
      }
    }
    c.k_start.i32()[t] = static_cast<int32_t>(b);
    c.k_end.i32()[t] = static_cast<int32_t>(e);
  }
}

// Random inputs: q_I, k_I in [-1, 1] (about half of the ReLU arguments positive), w in
// [-0.5, 1.5] (some negative), q and kv in [-1, 1], lse in [-1, 2] with a few heads at +inf (no
// target term) and one row (t = 2, when Sq > 2) with every head at +inf (no target mass).
inline IndexerCase make_indexer_case(const IndexerShape& shape, IndexerRanges ranges,
                                     sa_dtype dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  IndexerCase c;
  c.shape = shape;
  c.dtype = dtype;
  const sa_dtype wdt = dtype == SA_DTYPE_FP64 ? SA_DTYPE_FP64 : SA_DTYPE_FP32;
  c.q_I = HostTensor(dtype, {shape.Sq, shape.HI, shape.DI});
  c.k_I = HostTensor(dtype, {shape.Skv, shape.DI});
  c.w = HostTensor(wdt, {shape.Sq, shape.HI});
  c.q = HostTensor(dtype, {shape.Sq, shape.H, shape.Dqk});
  c.kv = HostTensor(dtype, {shape.Skv, shape.Dqk});
  c.lse = HostTensor(SA_DTYPE_FP32, {shape.Sq, shape.H});
  c.q_I.fill_uniform(rng);
  c.k_I.fill_uniform(rng);
  c.w.fill_uniform(rng, -0.5, 1.5);
  c.q.fill_uniform(rng);
  c.kv.fill_uniform(rng);
  c.lse.fill_uniform(rng, -1.0, 2.0);
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t t = 0; t < shape.Sq; ++t)
    for (int64_t h = 0; h < shape.H; ++h)
      if ((t == 2 && shape.Sq > 2) || (shape.H > 1 && (t + h) % 5 == 4))
        c.lse.set(t * shape.H + h, inf);
  fill_ranges(c, ranges);
  return c;
}

}  // namespace sa_test
