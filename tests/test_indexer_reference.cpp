// The fp64 reference of the DSA lightning indexer (SPEC 5), through the public C++ API on CPU
// tensors, against oracles in this file that share none of its code:
//  * scores: the formula, element by element;
//  * top-k: rank counting (key s is chosen iff fewer than k keys of its range beat it: a larger
//    fp32 score, or an equal one and a smaller index), no sorting;
//  * loss: the target and the indexer softmax with plain exp and division (no log domain);
//  * gradients: central finite differences of the reference's own loss;
//  * dense mode against sparse mode listing every key of the range.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "indexer_case.hpp"
#include "test_util.hpp"

namespace sa_test {
namespace {

namespace sa_cpp = sparse_attention;
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- oracles ---------------------------------------------------------------------------------
double oracle_score(const IndexerCase& c, int64_t t, int64_t s, double scale_I) {
  const IndexerShape& d = c.shape;
  double total = 0.0;
  for (int64_t j = 0; j < d.HI; ++j) {
    double a = 0.0;
    for (int64_t x = 0; x < d.DI; ++x)
      a += c.q_I.get((t * d.HI + j) * d.DI + x) * c.k_I.get(s * d.DI + x);
    a *= scale_I;
    total += c.w.get(t * d.HI + j) * (a > 0.0 ? a : 0.0);
  }
  return total;
}

double default_scale_I(const IndexerCase& c) { return 1.0 / std::sqrt(double(c.shape.DI)); }
double default_scale(const IndexerCase& c) { return 1.0 / std::sqrt(double(c.shape.Dqk)); }

// Row t's top-k by rank counting over the fp32-rounded scores, in increasing key order.
std::vector<int32_t> oracle_topk(const IndexerCase& c, int64_t t, int64_t k) {
  std::vector<int32_t> out;
  const double scale_I = static_cast<float>(default_scale_I(c));
  for (int64_t s = c.begin(t); s < c.end(t); ++s) {
    const float fs = static_cast<float>(oracle_score(c, t, s, scale_I));
    int64_t beaten_by = 0;
    for (int64_t o = c.begin(t); o < c.end(t); ++o) {
      const float fo = static_cast<float>(oracle_score(c, t, o, scale_I));
      if (fo > fs || (fo == fs && o < s)) ++beaten_by;
    }
    if (beaten_by < k) out.push_back(static_cast<int32_t>(s));
  }
  while (static_cast<int64_t>(out.size()) < k) out.push_back(-1);
  return out;
}

// The KL terms of row t over the key list `keys` (one entry per term), straight from SPEC 5.
double oracle_row_loss(const IndexerCase& c, int64_t t, const std::vector<int64_t>& keys,
                       double coeff) {
  const IndexerShape& d = c.shape;
  const double scale = static_cast<float>(default_scale(c));
  const double scale_I = static_cast<float>(default_scale_I(c));
  std::vector<double> A, E;
  double sum_a = 0.0, max_i = -kInf;
  for (int64_t s : keys) {
    double a = 0.0;
    for (int64_t h = 0; h < d.H; ++h) {
      double dotp = 0.0;
      for (int64_t x = 0; x < d.Dqk; ++x)
        dotp += c.q.get((t * d.H + h) * d.Dqk + x) * c.kv.get(s * d.Dqk + x);
      a += std::exp(scale * dotp - c.lse.get(t * d.H + h));  // exp(-inf) = 0
    }
    A.push_back(a);
    sum_a += a;
    max_i = std::max(max_i, oracle_score(c, t, s, scale_I));
  }
  if (keys.empty() || sum_a == 0.0) return 0.0;
  double sum_e = 0.0;
  for (int64_t s : keys) {
    E.push_back(std::exp(oracle_score(c, t, s, scale_I) - max_i));
    sum_e += E.back();
  }
  double loss = 0.0;
  for (size_t k = 0; k < keys.size(); ++k) {
    const double p = A[k] / sum_a, r = E[k] / sum_e;
    if (p > 0.0) loss += p * std::log(p / r);
  }
  return coeff * loss;
}

// Sparse top-k metadata: keys drawn from each row's range, with SPEC 2's edge cases planted
// (topk >= 5): -1, S_kv, a repeated key, a key outside the range; lengths topk, 0, -2, past
// topk, topk - 1 in turn.
struct SparseMeta {
  HostTensor idx, length;
};
SparseMeta make_sparse_meta(const IndexerCase& c, int64_t topk, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const IndexerShape& d = c.shape;
  SparseMeta m{HostTensor(SA_DTYPE_INT32, {d.Sq, topk}), HostTensor(SA_DTYPE_INT32, {d.Sq})};
  for (int64_t t = 0; t < d.Sq; ++t) {
    const bool empty = c.end(t) <= c.begin(t);
    std::uniform_int_distribution<int64_t> key(empty ? 0 : c.begin(t),
                                               empty ? d.Skv - 1 : c.end(t) - 1);
    int32_t* row = m.idx.i32() + t * topk;
    for (int64_t i = 0; i < topk; ++i) row[i] = static_cast<int32_t>(key(rng));
    if (topk >= 5) {
      row[0] = -1;
      row[1] = static_cast<int32_t>(d.Skv);
      row[3] = row[2];
      row[4] = static_cast<int32_t>(c.end(t) < d.Skv ? c.end(t) : c.begin(t) - 1);
    }
    const int32_t lens[5] = {static_cast<int32_t>(topk), 0, -2, static_cast<int32_t>(topk + 4),
                             static_cast<int32_t>(topk - 1)};
    m.length.i32()[t] = lens[t % 5];
  }
  return m;
}

// K_t of sparse mode as SPEC 5 defines it, written without IndexerMeta.
std::vector<int64_t> sparse_keys(const IndexerCase& c, const SparseMeta& m, int64_t t) {
  const int64_t topk = m.idx.shape()[1];
  const int64_t len = std::min<int64_t>(m.length.i32()[t], topk);
  std::vector<int64_t> keys;
  for (int64_t i = 0; i < len; ++i) {
    const int64_t s = m.idx.i32()[t * topk + i];
    if (s >= 0 && s < c.shape.Skv && c.in_range(t, s)) keys.push_back(s);
  }
  return keys;
}
std::vector<int64_t> dense_keys(const IndexerCase& c, int64_t t) {
  std::vector<int64_t> keys;
  for (int64_t s = c.begin(t); s < c.end(t); ++s) keys.push_back(s);
  return keys;
}

// ---- cases -----------------------------------------------------------------------------------
struct RangeCase {
  std::string name;
  IndexerShape shape;
  IndexerRanges ranges;
};

IndexerShape shape_of(int64_t Sq, int64_t Skv, int64_t HI, int64_t DI) {
  IndexerShape s;
  s.Sq = Sq;
  s.Skv = Skv;
  s.HI = HI;
  s.DI = DI;
  return s;
}

std::vector<RangeCase> range_cases() {
  return {
      {"Full", shape_of(5, 9, 3, 8), IndexerRanges::kNone},
      {"Causal", shape_of(7, 7, 2, 6), IndexerRanges::kCausal},
      {"CausalPrefix", shape_of(5, 11, 4, 8), IndexerRanges::kCausal},
      {"Packed", shape_of(10, 12, 3, 5), IndexerRanges::kPacked},
      {"EmptyAndClamped", shape_of(12, 8, 2, 4), IndexerRanges::kOdd},
  };
}

class IndexerReference : public ::testing::TestWithParam<RangeCase> {
 protected:
  IndexerCase make(sa_dtype dtype = SA_DTYPE_FP64) {
    uint64_t seed = 0x1d3;
    for (char ch : GetParam().name) seed = seed * 131 + static_cast<uint64_t>(ch);
    return make_indexer_case(GetParam().shape, GetParam().ranges, dtype, seed);
  }
};

void expect_ok(const sa_cpp::Status& st) { ASSERT_TRUE(st.ok()) << st.to_string(); }

TEST_P(IndexerReference, ScoresMatchTheFormula) {
  IndexerCase c = make();
  HostTensor scores(SA_DTYPE_FP32, {c.shape.Sq, c.shape.Skv});
  scores.poison();
  expect_ok(sa_cpp::indexer_scores(c.scores_args(scores)));
  const double scale_I = static_cast<float>(default_scale_I(c));
  std::vector<double> want(static_cast<size_t>(scores.numel()));
  for (int64_t t = 0; t < c.shape.Sq; ++t)
    for (int64_t s = 0; s < c.shape.Skv; ++s)
      want[static_cast<size_t>(t * c.shape.Skv + s)] =
          c.in_range(t, s) ? oracle_score(c, t, s, scale_I) : -kInf;
  EXPECT_TRUE(all_close(scores.to_double(), want, 1e-30, 1e-7));  // one fp32 rounding
}

TEST_P(IndexerReference, TopkMatchesRankCounting) {
  IndexerCase c = make();
  for (int64_t k : {int64_t{1}, int64_t{3}, int64_t{5}, c.shape.Skv, c.shape.Skv + 3}) {
    HostTensor idx(SA_DTYPE_INT32, {c.shape.Sq, k}), len(SA_DTYPE_INT32, {c.shape.Sq});
    idx.fill(12345);
    len.fill(12345);
    expect_ok(sa_cpp::indexer_topk(c.topk_args(idx, &len)));
    for (int64_t t = 0; t < c.shape.Sq; ++t) {
      const std::vector<int32_t> want = oracle_topk(c, t, k);
      const std::vector<int32_t> got(idx.i32() + t * k, idx.i32() + (t + 1) * k);
      EXPECT_EQ(got, want) << "k " << k << " row " << t;
      const int64_t range = std::max<int64_t>(0, c.end(t) - c.begin(t));
      EXPECT_EQ(len.i32()[t], std::min(k, range)) << "k " << k << " row " << t;
    }
    // Bitwise identical on a second run, and without topk_length.
    HostTensor again(SA_DTYPE_INT32, {c.shape.Sq, k});
    expect_ok(sa_cpp::indexer_topk(c.topk_args(again, nullptr)));
    EXPECT_TRUE(bitwise_equal(again, idx)) << "k " << k;
  }
}

TEST_P(IndexerReference, SparseLossMatchesOracle) {
  IndexerCase c = make();
  SparseMeta m = make_sparse_meta(c, 8, 3);
  IndexerCase::LossOut out = c.loss_out(SA_DTYPE_FP64);
  sa_cpp::IndexerLossArgs a = c.loss_args(out, &m.idx, &m.length);
  a.options.coeff = 0.75f;
  expect_ok(sa_cpp::indexer_loss(a));
  double total = 0.0;
  for (int64_t t = 0; t < c.shape.Sq; ++t) {
    const double want = oracle_row_loss(c, t, sparse_keys(c, m, t), 0.75);
    EXPECT_NEAR(out.per_token.get(t), want, 1e-12 * (1 + std::fabs(want))) << "row " << t;
    total += want;
  }
  EXPECT_NEAR(out.loss.get(0), total, 1e-12 * (1 + std::fabs(total)));
}

TEST_P(IndexerReference, DenseLossMatchesOracleAndSparseOverTheRange) {
  IndexerCase c = make();
  IndexerCase::LossOut dense = c.loss_out(SA_DTYPE_FP64);
  expect_ok(sa_cpp::indexer_loss(c.loss_args(dense, nullptr, nullptr)));
  for (int64_t t = 0; t < c.shape.Sq; ++t) {
    const double want = oracle_row_loss(c, t, dense_keys(c, t), 1.0);
    EXPECT_NEAR(dense.per_token.get(t), want, 1e-12 * (1 + std::fabs(want))) << "row " << t;
  }
  // Sparse mode with every key of the range listed (then -1) is the same computation.
  SparseMeta all{HostTensor(SA_DTYPE_INT32, {c.shape.Sq, c.shape.Skv + 1}), HostTensor()};
  all.idx.fill(-1);
  for (int64_t t = 0; t < c.shape.Sq; ++t)
    for (int64_t s = c.begin(t); s < c.end(t); ++s)
      all.idx.i32()[t * (c.shape.Skv + 1) + (s - c.begin(t))] = static_cast<int32_t>(s);
  IndexerCase::LossOut sparse = c.loss_out(SA_DTYPE_FP64);
  expect_ok(sa_cpp::indexer_loss(c.loss_args(sparse, &all.idx, nullptr)));
  EXPECT_TRUE(all_close(sparse.per_token.to_double(), dense.per_token.to_double(), 1e-14, 1e-12));
  EXPECT_TRUE(all_close(sparse.dq_I.to_double(), dense.dq_I.to_double(), 1e-14, 1e-12));
  EXPECT_TRUE(all_close(sparse.dk_I.to_double(), dense.dk_I.to_double(), 1e-14, 1e-12));
  EXPECT_TRUE(all_close(sparse.dw.to_double(), dense.dw.to_double(), 1e-14, 1e-12));
}

// Central differences of the reference loss in q_I, k_I and w (every element: the shapes are
// tiny), in sparse and dense mode.
TEST_P(IndexerReference, GradientsMatchFiniteDifferences) {
  for (bool sparse : {true, false}) {
    IndexerCase c = make();
    SparseMeta m = make_sparse_meta(c, 8, 4);
    HostTensor* idx = sparse ? &m.idx : nullptr;
    HostTensor* len = sparse ? &m.length : nullptr;
    IndexerCase::LossOut out = c.loss_out(SA_DTYPE_FP64);
    sa_cpp::IndexerLossArgs a = c.loss_args(out, idx, len);
    a.options.coeff = 1.25f;
    expect_ok(sa_cpp::indexer_loss(a));
    ASSERT_FALSE(any_nan(out.dq_I.to_double()) || any_nan(out.dk_I.to_double()) ||
                 any_nan(out.dw.to_double()));

    auto loss_at = [&]() {
      IndexerCase::LossOut o = c.loss_out(SA_DTYPE_FP64);
      sa_cpp::IndexerLossArgs b = c.loss_args(o, idx, len, /*grads*/ false);
      b.options.coeff = 1.25f;
      EXPECT_TRUE(sa_cpp::indexer_loss(b).ok());
      return o.loss.get(0);
    };
    struct Wrt {
      HostTensor* x;
      const HostTensor* grad;
      const char* name;
    };
    for (Wrt wrt : {Wrt{&c.q_I, &out.dq_I, "dq_I"}, Wrt{&c.k_I, &out.dk_I, "dk_I"},
                    Wrt{&c.w, &out.dw, "dw"}}) {
      double gmax = 0.0;
      for (int64_t i = 0; i < wrt.grad->numel(); ++i)
        gmax = std::max(gmax, std::fabs(wrt.grad->get(i)));
      ASSERT_GT(gmax, 1e-3) << wrt.name << (sparse ? " sparse" : " dense");
      for (int64_t i = 0; i < wrt.x->numel(); ++i) {
        const double x0 = wrt.x->get(i), h = 1e-6;
        wrt.x->set(i, x0 + h);
        const double lp = loss_at();
        wrt.x->set(i, x0 - h);
        const double lm = loss_at();
        wrt.x->set(i, x0);
        const double numeric = (lp - lm) / (2 * h);
        ASSERT_NEAR(wrt.grad->get(i), numeric, 1e-7 * gmax + 1e-6 * std::fabs(numeric) + 1e-9)
            << wrt.name << "[" << i << "]" << (sparse ? " sparse" : " dense");
      }
    }
  }
}

// Rows with an empty K_t or no target mass: zero loss, zero dq_I and dw rows; keys no row
// reaches: zero dk_I. The loss without gradients is bitwise the same.
TEST_P(IndexerReference, EmptyRowsAndUnreachedKeysGetNothing) {
  IndexerCase c = make();
  for (bool sparse : {true, false}) {
    SparseMeta m = make_sparse_meta(c, 7, 9);
    HostTensor* idx = sparse ? &m.idx : nullptr;
    HostTensor* len = sparse ? &m.length : nullptr;
    IndexerCase::LossOut out = c.loss_out(SA_DTYPE_FP64);
    expect_ok(sa_cpp::indexer_loss(c.loss_args(out, idx, len)));
    const IndexerShape& d = c.shape;
    std::vector<bool> reached(static_cast<size_t>(d.Skv), false);
    int empty_rows = 0;
    for (int64_t t = 0; t < d.Sq; ++t) {
      const std::vector<int64_t> keys = sparse ? sparse_keys(c, m, t) : dense_keys(c, t);
      bool no_mass = true;
      for (int64_t h = 0; h < d.H; ++h) no_mass &= c.lse.get(t * d.H + h) == kInf;
      if (keys.empty() || no_mass) {
        ++empty_rows;
        EXPECT_EQ(out.per_token.get(t), 0.0) << "row " << t;
        for (int64_t i = 0; i < d.HI * d.DI; ++i)
          ASSERT_EQ(out.dq_I.get(t * d.HI * d.DI + i), 0.0) << "dq_I row " << t;
        for (int64_t j = 0; j < d.HI; ++j) ASSERT_EQ(out.dw.get(t * d.HI + j), 0.0);
      } else {
        for (int64_t s : keys) reached[static_cast<size_t>(s)] = true;
      }
    }
    EXPECT_GE(empty_rows, 1);  // row 2 has no target mass
    for (int64_t s = 0; s < d.Skv; ++s) {
      if (reached[static_cast<size_t>(s)]) continue;
      for (int64_t x = 0; x < d.DI; ++x) ASSERT_EQ(out.dk_I.get(s * d.DI + x), 0.0) << s;
    }

    IndexerCase::LossOut alone = c.loss_out(SA_DTYPE_FP64);
    expect_ok(sa_cpp::indexer_loss(c.loss_args(alone, idx, len, /*grads*/ false)));
    EXPECT_TRUE(bitwise_equal(alone.loss, out.loss));
    EXPECT_TRUE(bitwise_equal(alone.per_token, out.per_token));
    EXPECT_TRUE(any_nan(alone.dq_I.to_double()));  // not written: the gradients were absent
  }
}

INSTANTIATE_TEST_SUITE_P(Ranges, IndexerReference, ::testing::ValuesIn(range_cases()),
                         [](const ::testing::TestParamInfo<RangeCase>& info) {
                           return info.param.name;
                         });

// ---- hand-written edge cases -----------------------------------------------------------------

// Exact ties: keys repeat every 3 rows, so equal scores come in threes; the smaller key wins.
// With q_I = 0 every score is 0 and the top-k is the first k keys of each range.
TEST(IndexerReferenceEdges, TiesGoToTheSmallerKey) {
  IndexerCase c = make_indexer_case(shape_of(6, 10, 2, 4), IndexerRanges::kOdd, SA_DTYPE_FP64, 5);
  for (int64_t s = 3; s < 10; ++s)
    for (int64_t x = 0; x < 4; ++x) c.k_I.set(s * 4 + x, c.k_I.get((s % 3) * 4 + x));
  c.k_start.i32()[5] = 0;  // one row over every key: ties across the whole row
  c.k_end.i32()[5] = 10;
  for (int64_t k : {1, 2, 4, 7}) {
    HostTensor idx(SA_DTYPE_INT32, {6, k}), len(SA_DTYPE_INT32, {6});
    expect_ok(sa_cpp::indexer_topk(c.topk_args(idx, &len)));
    for (int64_t t = 0; t < 6; ++t) {
      const std::vector<int32_t> got(idx.i32() + t * k, idx.i32() + (t + 1) * k);
      EXPECT_EQ(got, oracle_topk(c, t, k)) << "k " << k << " row " << t;
    }
  }
  // Every score 0: the first k keys of each range.
  c.q_I.fill(0.0);
  HostTensor idx(SA_DTYPE_INT32, {6, 3}), len(SA_DTYPE_INT32, {6});
  expect_ok(sa_cpp::indexer_topk(c.topk_args(idx, &len)));
  for (int64_t t = 0; t < 6; ++t) {
    for (int64_t i = 0; i < 3; ++i) {
      const int64_t want = i < len.i32()[t] ? c.begin(t) + i : -1;
      EXPECT_EQ(idx.i32()[t * 3 + i], want) << "row " << t << " slot " << i;
    }
  }
}

// bf16 inputs (the GPU dtype) run the same arithmetic on the values bf16 holds.
TEST(IndexerReferenceEdges, Bf16MatchesFp64OnTheSameValues) {
  const IndexerShape s = shape_of(6, 16, 4, 32);
  IndexerCase b = make_indexer_case(s, IndexerRanges::kCausal, SA_DTYPE_BF16, 21);
  IndexerCase d = make_indexer_case(s, IndexerRanges::kCausal, SA_DTYPE_FP64, 21);
  for (auto pair : {std::make_pair(&b.q_I, &d.q_I), std::make_pair(&b.k_I, &d.k_I),
                    std::make_pair(&b.w, &d.w), std::make_pair(&b.q, &d.q),
                    std::make_pair(&b.kv, &d.kv), std::make_pair(&b.lse, &d.lse)})
    for (int64_t i = 0; i < pair.first->numel(); ++i) pair.second->set(i, pair.first->get(i));
  HostTensor sb(SA_DTYPE_FP32, {s.Sq, s.Skv}), sd(SA_DTYPE_FP32, {s.Sq, s.Skv});
  expect_ok(sa_cpp::indexer_scores(b.scores_args(sb)));
  expect_ok(sa_cpp::indexer_scores(d.scores_args(sd)));
  EXPECT_TRUE(bitwise_equal(sb, sd));
  IndexerCase::LossOut ob = b.loss_out(SA_DTYPE_FP32), od = d.loss_out(SA_DTYPE_FP64);
  expect_ok(sa_cpp::indexer_loss(b.loss_args(ob, nullptr, nullptr)));
  expect_ok(sa_cpp::indexer_loss(d.loss_args(od, nullptr, nullptr)));
  EXPECT_NEAR(ob.loss.get(0), od.loss.get(0), 1e-6 * std::fabs(od.loss.get(0)));
  EXPECT_TRUE(all_close(ob.dq_I.to_double(), od.dq_I.to_double(), 1e-12, 1.0 / 256));
  EXPECT_TRUE(all_close(ob.dk_I.to_double(), od.dk_I.to_double(), 1e-12, 1.0 / 256));
  EXPECT_TRUE(all_close(ob.dw.to_double(), od.dw.to_double(), 1e-12, 1e-6));
}

// Strided views (padded rows) for every input and output: the same values as contiguous, and
// nothing written outside the logical elements.
TEST(IndexerReferenceEdges, HonoursStrides) {
  IndexerCase c = make_indexer_case(shape_of(5, 7, 2, 4), IndexerRanges::kCausal, SA_DTYPE_FP64, 8);
  HostTensor scores(SA_DTYPE_FP32, {5, 7});
  expect_ok(sa_cpp::indexer_scores(c.scores_args(scores)));
  HostTensor idx(SA_DTYPE_INT32, {5, 3}), len(SA_DTYPE_INT32, {5});
  expect_ok(sa_cpp::indexer_topk(c.topk_args(idx, &len)));

  // Padded copies: every row of every tensor gets 3 extra elements; scores and topk_idx outputs
  // are written into padded buffers with sentinels.
  auto padded = [](const HostTensor& t, int64_t pad) {
    const int64_t inner = t.shape().back(), rows = t.numel() / inner;
    HostTensor p(t.dtype(), {rows * (inner + pad)});
    p.fill(t.dtype() == SA_DTYPE_INT32 ? 777 : 777.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < inner; ++i) p.set(r * (inner + pad) + i, t.get(r * inner + i));
    return p;
  };
  auto view = [](HostTensor& buf, const HostTensor& like, int64_t pad) {
    sa_tensor v = buf.view();
    v.rank = static_cast<int32_t>(like.shape().size());
    int64_t stride = 1;
    for (int i = v.rank - 1; i >= 0; --i) {
      v.shape[i] = like.shape()[static_cast<size_t>(i)];
      v.strides[i] = stride;
      stride *= v.shape[i] + (i == v.rank - 1 ? pad : 0);
    }
    return v;
  };
  HostTensor pq = padded(c.q_I, 3), pk = padded(c.k_I, 3), pw = padded(c.w, 3);
  HostTensor ps(SA_DTYPE_FP32, {5 * 10}), pidx(SA_DTYPE_INT32, {5 * 6});
  ps.fill(777.0);
  pidx.fill(777);
  sa_cpp::IndexerScoresArgs sa = c.scores_args(scores);
  sa.q_I = view(pq, c.q_I, 3);
  sa.k_I = view(pk, c.k_I, 3);
  sa.w = view(pw, c.w, 3);
  sa.scores = view(ps, scores, 3);
  expect_ok(sa_cpp::indexer_scores(sa));
  sa_cpp::IndexerTopkArgs ta = c.topk_args(idx, nullptr);
  ta.q_I = sa.q_I;
  ta.k_I = sa.k_I;
  ta.w = sa.w;
  ta.topk_idx = view(pidx, idx, 3);
  expect_ok(sa_cpp::indexer_topk(ta));
  for (int64_t t = 0; t < 5; ++t) {
    for (int64_t s = 0; s < 10; ++s) {
      const double got = ps.get(t * 10 + s);
      if (s < 7) {
        EXPECT_EQ(got, scores.get(t * 7 + s));
      } else {
        EXPECT_EQ(got, 777.0) << "scores written outside the view";
      }
    }
    for (int64_t i = 0; i < 6; ++i)
      EXPECT_EQ(pidx.i32()[t * 6 + i], i < 3 ? idx.i32()[t * 3 + i] : 777);
  }
}

}  // namespace
}  // namespace sa_test
