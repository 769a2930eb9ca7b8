// The fp64 DSA reference (SPEC 2) against oracles that share none of its code:
//  * forward: dense masked attention over all S_kv keys, each key weighted by how many active
//    slots of the row hold it, the sink in the softmax denominator;
//  * backward: central finite differences of the forward's loss sum(dout * out) for q, kv, sink;
//  * NaN planted in kv rows that no active slot selects must not reach any output.
// The reference is called directly (problems built by hand, no public API), on tiny shapes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dsa_problem_builder.hpp"
#include "reference/reference.hpp"
#include "test_util.hpp"

namespace sa_test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- oracles ---------------------------------------------------------------------------------
struct DenseResult {
  std::vector<double> out;  // [Sq, H, Dv]
  std::vector<double> lse;  // [Sq, H]
};

DenseResult dense_masked_attention(const DsaHostCase& c) {
  const DsaShape& s = c.shape;
  const double scale = c.scale;
  DenseResult r;
  r.out.assign(static_cast<size_t>(s.Sq * s.H * s.Dv), 0.0);
  r.lse.assign(static_cast<size_t>(s.Sq * s.H), kInf);
  for (int64_t t = 0; t < s.Sq; ++t) {
    std::vector<double> w(static_cast<size_t>(s.Skv), 0.0);  // active occurrences of key j
    for (int64_t i = 0; i < s.topk; ++i)
      if (c.slot_active(t, i)) w[static_cast<size_t>(c.index(t, i))] += 1.0;
    for (int64_t h = 0; h < s.H; ++h) {
      std::vector<double> logit(static_cast<size_t>(s.Skv), -kInf);
      double m = -kInf;
      for (int64_t j = 0; j < s.Skv; ++j) {
        if (w[static_cast<size_t>(j)] == 0.0) continue;
        double acc = 0.0;
        for (int64_t d = 0; d < s.Dqk; ++d)
          acc += c.q.get((t * s.H + h) * s.Dqk + d) * c.kv.get(j * s.Dqk + d);
        logit[static_cast<size_t>(j)] = scale * acc;
        m = std::max(m, scale * acc);
      }
      if (m == -kInf) continue;  // empty row: out = 0, lse = +inf
      double z = 0.0;
      for (int64_t j = 0; j < s.Skv; ++j)
        if (w[static_cast<size_t>(j)] > 0.0)
          z += w[static_cast<size_t>(j)] * std::exp(logit[static_cast<size_t>(j)] - m);
      r.lse[static_cast<size_t>(t * s.H + h)] = m + std::log(z);

      const double sink = c.sink_at(h);
      if (sink == kInf) continue;  // the sink takes all of the softmax: out = 0
      const double mm = std::max(m, sink);
      double denom = std::exp(sink - mm);
      for (int64_t j = 0; j < s.Skv; ++j)
        if (w[static_cast<size_t>(j)] > 0.0)
          denom += w[static_cast<size_t>(j)] * std::exp(logit[static_cast<size_t>(j)] - mm);
      for (int64_t j = 0; j < s.Skv; ++j) {
        if (w[static_cast<size_t>(j)] == 0.0) continue;
        const double pj = w[static_cast<size_t>(j)] * std::exp(logit[static_cast<size_t>(j)] - mm) /
                          denom;
        for (int64_t d = 0; d < s.Dv; ++d)
          r.out[static_cast<size_t>((t * s.H + h) * s.Dv + d)] += pj * c.kv.get(j * s.Dqk + d);
      }
    }
  }
  return r;
}

// sum(dout * out) of a fresh forward on the case's current inputs (its own outputs untouched).
double forward_loss(DsaHostCase& c) {
  HostTensor out(c.dtype, {c.shape.Sq, c.shape.H, c.shape.Dv});
  HostTensor lse(SA_DTYPE_FP32, {c.shape.Sq, c.shape.H});
  DsaPointers p = c.pointers();
  p.out = out.data();
  p.lse = static_cast<float*>(lse.data());
  sa::reference::dsa_forward(make_dsa_fwd_problem(c.shape, c.dtype, c.scale, p));
  double loss = 0.0;
  for (int64_t i = 0; i < out.numel(); ++i) loss += c.dout.get(i) * out.get(i);
  return loss;
}

// Central differences of forward_loss for up to `samples` random finite elements of input `x`
// (all of them if it is small) against the reference gradient `grad`. The step is read back
// from `x`, so fp32 inputs (the sink) get the step their dtype can hold.
::testing::AssertionResult matches_finite_differences(DsaHostCase& c, HostTensor& x,
                                                      const HostTensor& grad, const char* name,
                                                      uint64_t seed, int samples = 40) {
  double gmax = 0.0;
  for (int64_t i = 0; i < grad.numel(); ++i) gmax = std::max(gmax, std::fabs(grad.get(i)));
  std::vector<int64_t> picks;
  if (x.numel() <= samples) {
    for (int64_t i = 0; i < x.numel(); ++i) picks.push_back(i);
  } else {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int64_t> pick(0, x.numel() - 1);
    for (int k = 0; k < samples; ++k) picks.push_back(pick(rng));
  }
  const double h = std::ldexp(1.0, -20);
  int checked = 0;
  for (int64_t i : picks) {
    const double x0 = x.get(i);
    if (!std::isfinite(x0)) continue;
    const double step = h * std::max(1.0, std::fabs(x0));
    x.set(i, x0 + step);
    const double xp = x.get(i), lp = forward_loss(c);
    x.set(i, x0 - step);
    const double xm = x.get(i), lm = forward_loss(c);
    x.set(i, x0);
    const double numeric = (lp - lm) / (xp - xm);
    const double analytic = grad.get(i);
    // Tolerance: the backward reads the fp32 LSE (relative error ~1e-7 in every p), and the
    // differences carry fp64 round-off of order 1e-16 * |loss| / step.
    const double tol = 1e-5 * gmax + 1e-5 * std::fabs(numeric) + 1e-10;
    if (!(std::fabs(analytic - numeric) <= tol))
      return ::testing::AssertionFailure()
             << name << "[" << i << "]: backward " << analytic << ", finite differences "
             << numeric << " (tolerance " << tol << ", max |" << name << "| " << gmax << ")";
    ++checked;
  }
  return ::testing::AssertionSuccess() << checked << " elements of " << name << " checked";
}

bool has_nan(const HostTensor& t) { return any_nan(t.to_double()); }

// ---- parameterised cases ---------------------------------------------------------------------
struct DsaCase {
  std::string name;
  DsaShape shape;
  DsaMetaSpec spec;
};

DsaShape tiny(int64_t Sq, int64_t Skv, int64_t H, int64_t topk) {
  DsaShape s;
  s.Sq = Sq;
  s.Skv = Skv;
  s.H = H;
  s.Dqk = 12;
  s.Dv = 8;
  s.topk = topk;
  return s;
}

DsaMetaSpec spec_of(DsaLengths lengths, bool invalid, bool duplicates, DsaSink sink) {
  DsaMetaSpec m;
  m.lengths = lengths;
  m.invalid = invalid;
  m.duplicates = duplicates;
  m.sink = sink;
  return m;
}

std::vector<DsaCase> dsa_cases() {
  using L = DsaLengths;
  using S = DsaSink;
  DsaShape real;  // the production head dims, few rows and heads
  real.Sq = 4;
  real.Skv = 48;
  real.H = 16;
  real.Dqk = 576;
  real.Dv = 512;
  real.topk = 24;
  DsaShape real512 = real;
  real512.Dqk = 512;
  real512.H = 5;
  return {
      {"Plain", tiny(5, 16, 2, 6), spec_of(L::kNone, false, false, S::kNone)},
      {"InvalidIndices", tiny(6, 16, 2, 6), spec_of(L::kNone, true, false, S::kNone)},
      {"Lengths", tiny(6, 16, 2, 6), spec_of(L::kMixed, false, false, S::kNone)},
      {"Duplicates", tiny(6, 7, 2, 6), spec_of(L::kNone, false, true, S::kNone)},
      {"TopkAboveSkv", tiny(6, 5, 2, 9), spec_of(L::kMixed, false, false, S::kNone)},
      {"TopkAboveSkvDuplicates", tiny(6, 5, 2, 9), spec_of(L::kMixed, false, true, S::kFinite)},
      {"SinkFinite", tiny(6, 16, 3, 6), spec_of(L::kNone, false, false, S::kFinite)},
      {"SinkLarge", tiny(6, 16, 3, 6), spec_of(L::kNone, false, false, S::kLarge)},
      {"SinkPosInf", tiny(6, 16, 2, 6), spec_of(L::kMixed, true, false, S::kPosInf)},
      {"SinkNegInf", tiny(6, 16, 2, 6), spec_of(L::kMixed, true, false, S::kNegInf)},
      {"SinkHuge", tiny(6, 16, 2, 6), spec_of(L::kMixed, true, false, S::kHuge)},
      {"Everything", tiny(8, 12, 5, 10), spec_of(L::kMixed, true, true, S::kMixed)},
      {"RealDims576", real, spec_of(L::kMixed, true, true, S::kMixed)},
      {"RealDims512", real512, spec_of(L::kNone, true, false, S::kFinite)},
  };
}

class DsaReference : public ::testing::TestWithParam<DsaCase> {
 protected:
  DsaHostCase make(sa_dtype dtype = SA_DTYPE_FP64) {
    const DsaCase& p = GetParam();
    uint64_t seed = 0x5eed;
    for (char ch : p.name) seed = seed * 131 + static_cast<uint64_t>(ch);
    return make_dsa_host_case(p.shape, p.spec, dtype, seed);
  }
};

TEST_P(DsaReference, ForwardMatchesDenseOracle) {
  DsaHostCase c = make();
  sa::reference::dsa_forward(c.fwd_problem());
  const DenseResult want = dense_masked_attention(c);
  EXPECT_TRUE(all_close(c.out.to_double(), want.out, 1e-13, 1e-11)) << "out";
  // LSE is stored in fp32.
  EXPECT_TRUE(all_close(c.lse.to_double(), want.lse, 1e-6, 1e-6)) << "lse";
}

TEST_P(DsaReference, EmptyRowsGiveZeroOutputAndInfiniteLse) {
  DsaHostCase c = make();
  sa::reference::dsa_forward(c.fwd_problem());
  sa::reference::dsa_backward(c.bwd_problem());
  const DsaShape& s = c.shape;
  int empty_rows = 0;
  for (int64_t t = 0; t < s.Sq; ++t) {
    if (!c.row_empty(t)) continue;
    ++empty_rows;
    for (int64_t h = 0; h < s.H; ++h) {
      EXPECT_EQ(c.lse.get(t * s.H + h), kInf) << "row " << t << " head " << h;
      for (int64_t d = 0; d < s.Dv; ++d)
        ASSERT_EQ(c.out.get((t * s.H + h) * s.Dv + d), 0.0) << "out row " << t << " head " << h;
      for (int64_t d = 0; d < s.Dqk; ++d)
        ASSERT_EQ(c.dq.get((t * s.H + h) * s.Dqk + d), 0.0) << "dq row " << t << " head " << h;
    }
  }
  const DsaMetaSpec& spec = GetParam().spec;
  if (spec.lengths == DsaLengths::kMixed || (spec.invalid && s.Sq > 3)) {
    EXPECT_GE(empty_rows, 1) << "the case was meant to contain empty rows";
  }
}

TEST_P(DsaReference, BackwardMatchesFiniteDifferences) {
  DsaHostCase c = make();
  sa::reference::dsa_forward(c.fwd_problem());
  sa::reference::dsa_backward(c.bwd_problem());
  for (const HostTensor* t : {&c.out, &c.dq, &c.dkv, &c.d_sink})
    ASSERT_FALSE(has_nan(*t)) << "NaN in an output";

  EXPECT_TRUE(matches_finite_differences(c, c.q, c.dq, "dq", 1));
  EXPECT_TRUE(matches_finite_differences(c, c.kv, c.dkv, "dkv", 2));
  if (c.has_sink) {
    EXPECT_TRUE(matches_finite_differences(c, c.sink, c.d_sink, "d_sink", 3));
  }

  // Keys that no active slot selects get exactly zero; sinks with no finite derivative (none,
  // -inf: no share; +inf, huge: out = 0, so delta = 0) get exactly zero.
  const std::vector<bool> selected = c.selected_keys();
  for (int64_t j = 0; j < c.shape.Skv; ++j) {
    if (selected[static_cast<size_t>(j)]) continue;
    for (int64_t d = 0; d < c.shape.Dqk; ++d)
      ASSERT_EQ(c.dkv.get(j * c.shape.Dqk + d), 0.0) << "dkv of unselected key " << j;
  }
  for (int64_t h = 0; h < c.shape.H; ++h) {
    const double sink = c.sink_at(h);
    if (!std::isfinite(sink) || sink > 1e30) {
      EXPECT_EQ(c.d_sink.get(h), 0.0) << "head " << h;
    }
  }
}

TEST_P(DsaReference, NanInUnselectedKeysReachesNoOutput) {
  DsaHostCase clean = make();
  DsaHostCase dirty = make();
  const std::vector<bool> selected = dirty.selected_keys();
  int poisoned = 0;
  for (int64_t j = 0; j < dirty.shape.Skv; ++j) {
    if (selected[static_cast<size_t>(j)]) continue;
    ++poisoned;
    for (int64_t d = 0; d < dirty.shape.Dqk; ++d) dirty.kv.set(j * dirty.shape.Dqk + d, NAN);
  }
  for (DsaHostCase* c : {&clean, &dirty}) {
    sa::reference::dsa_forward(c->fwd_problem());
    sa::reference::dsa_backward(c->bwd_problem());
  }
  // Bit for bit: the poisoned rows are never read, so nothing else can differ.
  EXPECT_TRUE(bitwise_equal(dirty.out, clean.out)) << "out";
  EXPECT_TRUE(bitwise_equal(dirty.lse, clean.lse)) << "lse";
  EXPECT_TRUE(bitwise_equal(dirty.dq, clean.dq)) << "dq";
  EXPECT_TRUE(bitwise_equal(dirty.dkv, clean.dkv)) << "dkv";
  EXPECT_TRUE(bitwise_equal(dirty.d_sink, clean.d_sink)) << "d_sink";
  for (const HostTensor* t : {&dirty.out, &dirty.lse, &dirty.dq, &dirty.dkv, &dirty.d_sink})
    EXPECT_FALSE(has_nan(*t));
  RecordProperty("poisoned_kv_rows", poisoned);
}

INSTANTIATE_TEST_SUITE_P(Cases, DsaReference, ::testing::ValuesIn(dsa_cases()),
                         [](const ::testing::TestParamInfo<DsaCase>& info) {
                           return info.param.name;
                         });

// ---- hand-written edge cases -----------------------------------------------------------------

// Metadata written out by hand: keys 7, 8, 9 are named only by inactive slots (past a length,
// in a row of length 0), keys 0, 4, 5, 6 by nobody; all of them hold NaN. Every sink kind, one
// per head.
TEST(DsaReferenceEdges, NanBehindInactiveSlotsAndInfiniteSinks) {
  DsaShape s = tiny(4, 10, 5, 4);
  DsaHostCase c = make_dsa_host_case(s, spec_of(DsaLengths::kMixed, false, false, DsaSink::kMixed),
                                     SA_DTYPE_FP64, 7);
  const int32_t imax = std::numeric_limits<int32_t>::max();
  const int32_t idx[4][4] = {{1, 3, 7, 8}, {7, 7, 9, 9}, {1, -1, 10, imax}, {3, 3, 1, 2}};
  const int32_t len[4] = {2, 0, 4, 9};
  for (int t = 0; t < 4; ++t) {
    c.topk_length.i32()[t] = len[t];
    for (int i = 0; i < 4; ++i) c.topk_idx.i32()[t * 4 + i] = idx[t][i];
  }
  for (int32_t j : {0, 4, 5, 6, 7, 8, 9})
    for (int64_t d = 0; d < s.Dqk; ++d) c.kv.set(j * s.Dqk + d, NAN);
  ASSERT_EQ(c.sink.get(1), kInf);
  ASSERT_EQ(c.sink.get(2), -kInf);
  ASSERT_EQ(c.sink.get(3), static_cast<double>(2.4e38f));

  sa::reference::dsa_forward(c.fwd_problem());
  sa::reference::dsa_backward(c.bwd_problem());
  EXPECT_FALSE(has_nan(c.out));
  EXPECT_FALSE(has_nan(c.lse));
  EXPECT_FALSE(has_nan(c.dq));
  EXPECT_FALSE(has_nan(c.d_sink));
  for (int64_t j = 0; j < s.Skv; ++j) {
    const bool sel = j == 1 || j == 2 || j == 3;
    for (int64_t d = 0; d < s.Dqk; ++d) {
      const double g = c.dkv.get(j * s.Dqk + d);
      if (sel) {
        EXPECT_TRUE(std::isfinite(g)) << "dkv[" << j << ", " << d << "]";
      } else {
        EXPECT_EQ(g, 0.0) << "dkv[" << j << ", " << d << "]";
      }
    }
  }
  // Row 1 is empty; heads with a sink of +inf or 2.4e38 give out = 0 in the other rows.
  for (int64_t h = 0; h < s.H; ++h) EXPECT_EQ(c.lse.get(1 * s.H + h), kInf);
  for (int64_t t : {0, 2, 3})
    for (int64_t h : {1, 3}) {
      EXPECT_TRUE(std::isfinite(c.lse.get(t * s.H + h)));
      for (int64_t d = 0; d < s.Dv; ++d) EXPECT_EQ(c.out.get((t * s.H + h) * s.Dv + d), 0.0);
    }
  const DenseResult want = dense_masked_attention(c);
  EXPECT_TRUE(all_close(c.out.to_double(), want.out, 1e-13, 1e-11));
  EXPECT_TRUE(all_close(c.lse.to_double(), want.lse, 1e-6, 1e-6));
}

// A NaN sink is a NaN input: that head's out is NaN on every non-empty row (lse excludes the sink
// and stays finite; empty rows stay 0); the other heads are unaffected.
TEST(DsaReferenceEdges, NanSinkPropagatesToItsHeadOnly) {
  DsaShape s = tiny(3, 8, 2, 3);
  DsaHostCase c = make_dsa_host_case(s, spec_of(DsaLengths::kMixed, false, false, DsaSink::kFinite),
                                     SA_DTYPE_FP64, 13);
  c.sink.set(0, NAN);
  for (int t = 0; t < 3; ++t) c.topk_length.i32()[t] = t == 1 ? 0 : 3;
  sa::reference::dsa_forward(c.fwd_problem());
  for (int64_t t = 0; t < s.Sq; ++t) {
    for (int64_t d = 0; d < s.Dv; ++d) {
      const double head0 = c.out.get((t * s.H + 0) * s.Dv + d);
      if (t == 1) EXPECT_EQ(head0, 0.0);
      else EXPECT_TRUE(std::isnan(head0));
      EXPECT_FALSE(std::isnan(c.out.get((t * s.H + 1) * s.Dv + d)));
    }
    EXPECT_FALSE(std::isnan(c.lse.get(t * s.H + 0)));
  }
}

// A huge scale: the recomputed probabilities are capped at 1 (the fp32 LSE's rounding would
// overflow exp), so the gradients stay finite.
TEST(DsaReferenceEdges, HugeScaleGivesFiniteGradients) {
  DsaShape s = tiny(4, 10, 2, 4);
  DsaHostCase c = make_dsa_host_case(s, spec_of(DsaLengths::kNone, false, false, DsaSink::kFinite),
                                     SA_DTYPE_FP32, 17, /*scale*/ 1e30f);
  sa::reference::dsa_forward(c.fwd_problem());
  sa::reference::dsa_backward(c.bwd_problem());
  EXPECT_FALSE(has_nan(c.out));
  EXPECT_FALSE(has_nan(c.dq));
  EXPECT_FALSE(has_nan(c.dkv));
  EXPECT_FALSE(has_nan(c.d_sink));
}

// Weights known in closed form: all logits 0, one key listed twice and one once, a finite sink.
TEST(DsaReferenceEdges, DuplicateKeyCountsTwiceWithSink) {
  DsaShape s = tiny(1, 4, 1, 3);
  DsaHostCase c = make_dsa_host_case(s, spec_of(DsaLengths::kNone, false, false, DsaSink::kFinite),
                                     SA_DTYPE_FP64, 11, /*scale*/ 1.0f);
  c.q.fill(0.0);  // every logit 0: p_j = 1 / (3 + exp(sink)), about 1/5
  c.sink.set(0, std::log(2.0));  // rounded to fp32
  const double z = 3.0 + std::exp(c.sink.get(0));
  const int32_t idx[3] = {2, 0, 2};
  for (int i = 0; i < 3; ++i) c.topk_idx.i32()[i] = idx[i];
  sa::reference::dsa_forward(c.fwd_problem());
  for (int64_t d = 0; d < s.Dv; ++d) {
    const double want = (2.0 * c.kv.get(2 * s.Dqk + d) + c.kv.get(0 * s.Dqk + d)) / z;
    EXPECT_NEAR(c.out.get(d), want, 1e-15);
  }
  EXPECT_NEAR(c.lse.get(0), std::log(3.0), 1e-7);
}

// A key listed three times at a huge scale (fuzz, session 49): its three equal scores near 1e30
// hold the whole softmax, and m + log(3) rounds to m, so exp(s - lse) would give each copy 1 and
// out = 3 v. The probabilities are exp(s - m) / sum: one third each, out = v.
TEST(DsaReferenceEdges, TiedMaximumAtHugeScaleStaysAConvexCombination) {
  DsaShape s = tiny(1, 4, 1, 5);
  DsaHostCase c = make_dsa_host_case(s, spec_of(DsaLengths::kNone, false, false, DsaSink::kNone),
                                     SA_DTYPE_FP64, 23, /*scale*/ 1e30f);
  c.q.fill(0.0);
  c.q.set(0, 1.0);  // s_j = 1e30 kv[j, 0]
  for (int64_t j = 0; j < s.Skv; ++j) c.kv.set(j * s.Dqk, j == 1 ? 1.0 : -1.0);
  const int32_t idx[5] = {1, 0, 1, 3, 1};
  for (int i = 0; i < 5; ++i) c.topk_idx.i32()[i] = idx[i];
  sa::reference::dsa_forward(c.fwd_problem());
  for (int64_t d = 0; d < s.Dv; ++d)
    EXPECT_NEAR(c.out.get(d), c.kv.get(1 * s.Dqk + d), 1e-15 * std::fabs(c.kv.get(1 * s.Dqk + d)))
        << d;
}

// The backward without a d_sink tensor, and with a sink tensor absent: d_sink written as zeros.
TEST(DsaReferenceEdges, DSinkOptional) {
  DsaShape s = tiny(5, 16, 2, 6);
  DsaHostCase c = make_dsa_host_case(s, spec_of(DsaLengths::kMixed, true, false, DsaSink::kFinite),
                                     SA_DTYPE_FP64, 5);
  sa::reference::dsa_forward(c.fwd_problem());
  sa::reference::dsa_backward(c.bwd_problem());
  const HostTensor dq_with = c.dq;
  c.dq.poison();
  sa::DsaBwdProblem p = c.bwd_problem();
  p.d_sink = nullptr;
  sa::reference::dsa_backward(p);
  EXPECT_TRUE(bitwise_equal(c.dq, dq_with));

  c.has_sink = false;
  c.d_sink.poison();
  sa::reference::dsa_forward(c.fwd_problem());
  sa::reference::dsa_backward(c.bwd_problem());
  for (int64_t h = 0; h < s.H; ++h) EXPECT_EQ(c.d_sink.get(h), 0.0);
}

// bf16 tensors: the same arithmetic on the values bf16 holds, outputs rounded once.
TEST(DsaReferenceEdges, Bf16MatchesFp64OnTheSameValues) {
  DsaShape s;
  s.Sq = 3;
  s.Skv = 40;
  s.H = 16;
  s.Dqk = 576;
  s.Dv = 512;
  s.topk = 20;
  const DsaMetaSpec spec = spec_of(DsaLengths::kMixed, true, true, DsaSink::kFinite);
  DsaHostCase b = make_dsa_host_case(s, spec, SA_DTYPE_BF16, 21);
  sa::reference::dsa_forward(b.fwd_problem());
  const DenseResult want = dense_masked_attention(b);  // reads the bf16 values
  EXPECT_TRUE(all_close(b.out.to_double(), want.out, 1e-12, 1.0 / 256)) << "out";
  EXPECT_TRUE(all_close(b.lse.to_double(), want.lse, 1e-6, 1e-6)) << "lse";

  // fp64 copy of every input the backward reads, out and lse included.
  DsaHostCase d = make_dsa_host_case(s, spec, SA_DTYPE_FP64, 21);
  d.topk_idx = b.topk_idx;
  d.topk_length = b.topk_length;
  d.sink = b.sink;
  d.lse = b.lse;
  for (auto pair : {std::make_pair(&b.q, &d.q), std::make_pair(&b.kv, &d.kv),
                    std::make_pair(&b.out, &d.out), std::make_pair(&b.dout, &d.dout)})
    for (int64_t i = 0; i < pair.first->numel(); ++i) pair.second->set(i, pair.first->get(i));
  sa::reference::dsa_backward(b.bwd_problem());
  sa::reference::dsa_backward(d.bwd_problem());
  EXPECT_TRUE(all_close(b.dq.to_double(), d.dq.to_double(), 1e-12, 1.0 / 256)) << "dq";
  EXPECT_TRUE(all_close(b.dkv.to_double(), d.dkv.to_double(), 1e-12, 1.0 / 256)) << "dkv";
  EXPECT_TRUE(bitwise_equal(b.d_sink, d.d_sink)) << "d_sink";
}

// Padded strides everywhere: the same values as the contiguous run, and no write outside the
// logical elements.
TEST(DsaReferenceEdges, HonoursStrides) {
  const DsaShape s = tiny(6, 16, 3, 6);
  DsaHostCase c = make_dsa_host_case(s, spec_of(DsaLengths::kMixed, true, true, DsaSink::kMixed),
                                     SA_DTYPE_FP64, 31);
  sa::reference::dsa_forward(c.fwd_problem());
  sa::reference::dsa_backward(c.bwd_problem());

  const double sentinel = 12345.0;
  // A [S, H, D] tensor inside a buffer with row stride ss and head stride sh.
  struct Padded {
    std::vector<double> buf;
    sa::Shd view;
    std::vector<bool> logical;
    Padded(int64_t S, int64_t H, int64_t D, int64_t ss, int64_t sh, double fill)
        : buf(static_cast<size_t>(S * ss), fill), logical(buf.size(), false) {
      view.data = buf.data();
      view.ss = ss;
      view.sh = sh;
      view.sd = 1;
      for (int64_t a = 0; a < S; ++a)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d) logical[static_cast<size_t>(view.offset(a, h, d))] = true;
    }
    void load(const HostTensor& t, int64_t H, int64_t D) {
      const int64_t S = t.numel() / (H * D);
      for (int64_t a = 0; a < S; ++a)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d)
            buf[static_cast<size_t>(view.offset(a, h, d))] = t.get((a * H + h) * D + d);
    }
    double at(int64_t a, int64_t h, int64_t d) const {
      return buf[static_cast<size_t>(view.offset(a, h, d))];
    }
  };
  Padded q(s.Sq, s.H, s.Dqk, s.H * (s.Dqk + 3) + 5, s.Dqk + 3, sentinel);
  Padded kv(s.Skv, 1, s.Dqk, s.Dqk + 7, 0, sentinel);
  Padded out(s.Sq, s.H, s.Dv, s.H * (s.Dv + 2) + 1, s.Dv + 2, sentinel);
  Padded dout(s.Sq, s.H, s.Dv, s.H * (s.Dv + 1), s.Dv + 1, sentinel);
  Padded dq(s.Sq, s.H, s.Dqk, s.H * s.Dqk + 4, s.Dqk, sentinel);
  Padded dkv(s.Skv, 1, s.Dqk, s.Dqk + 2, 0, sentinel);
  q.load(c.q, s.H, s.Dqk);
  kv.load(c.kv, 1, s.Dqk);
  dout.load(c.dout, s.H, s.Dv);
  std::vector<int32_t> idx(static_cast<size_t>(s.Sq * (s.topk + 3)), -7);
  std::vector<int32_t> len(static_cast<size_t>(s.Sq * 2), -7);
  for (int64_t t = 0; t < s.Sq; ++t) {
    len[static_cast<size_t>(t * 2)] = c.topk_length.i32()[t];
    for (int64_t i = 0; i < s.topk; ++i)
      idx[static_cast<size_t>(t * (s.topk + 3) + i)] = c.index(t, i);
  }
  std::vector<float> sink(static_cast<size_t>(s.H * 3), 0.f);
  for (int64_t h = 0; h < s.H; ++h) sink[static_cast<size_t>(h * 3)] = static_cast<float>(c.sink.get(h));
  std::vector<float> lse(static_cast<size_t>(s.Sq * (2 * s.H + 1)), static_cast<float>(sentinel));
  std::vector<float> d_sink(static_cast<size_t>(s.H * 2), static_cast<float>(sentinel));

  sa::DsaMeta meta;
  meta.topk_idx.data = idx.data();
  meta.topk_idx.stride[0] = s.topk + 3;
  meta.topk_idx.stride[1] = 1;
  meta.topk_length.data = len.data();
  meta.topk_length.stride[0] = 2;
  meta.sink = sink.data();
  meta.sink_stride = 3;

  sa::DsaFwdProblem f = c.fwd_problem();
  f.meta = meta;
  f.q = q.view;
  f.kv = kv.view;
  f.out = out.view;
  f.lse = lse.data();
  f.lse_stride[0] = 2 * s.H + 1;
  f.lse_stride[1] = 2;
  sa::reference::dsa_forward(f);

  sa::DsaBwdProblem b = c.bwd_problem();
  b.meta = meta;
  b.q = q.view;
  b.kv = kv.view;
  b.out = out.view;
  b.dout = dout.view;
  b.dq = dq.view;
  b.dkv = dkv.view;
  b.lse = lse.data();
  b.lse_stride[0] = 2 * s.H + 1;
  b.lse_stride[1] = 2;
  b.d_sink = d_sink.data();
  b.d_sink_stride = 2;
  sa::reference::dsa_backward(b);

  auto same = [](double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); };
  for (int64_t t = 0; t < s.Sq; ++t)
    for (int64_t h = 0; h < s.H; ++h) {
      ASSERT_TRUE(same(lse[static_cast<size_t>(t * (2 * s.H + 1) + h * 2)],
                       c.lse.get(t * s.H + h)));
      for (int64_t d = 0; d < s.Dv; ++d)
        ASSERT_TRUE(same(out.at(t, h, d), c.out.get((t * s.H + h) * s.Dv + d)));
      for (int64_t d = 0; d < s.Dqk; ++d)
        ASSERT_TRUE(same(dq.at(t, h, d), c.dq.get((t * s.H + h) * s.Dqk + d)));
    }
  for (int64_t j = 0; j < s.Skv; ++j)
    for (int64_t d = 0; d < s.Dqk; ++d)
      ASSERT_TRUE(same(dkv.at(j, 0, d), c.dkv.get(j * s.Dqk + d)));
  for (int64_t h = 0; h < s.H; ++h)
    ASSERT_TRUE(same(d_sink[static_cast<size_t>(h * 2)], c.d_sink.get(h)));

  for (const Padded* p : {&out, &dq, &dkv})
    for (size_t i = 0; i < p->buf.size(); ++i)
      if (!p->logical[i]) {
        ASSERT_EQ(p->buf[i], sentinel) << "write outside the tensor at " << i;
      }
  for (size_t i = 0; i < lse.size(); ++i) {
    const int64_t in_row = static_cast<int64_t>(i) % (2 * s.H + 1);  // logical: 0, 2, .., 2H-2
    if (in_row % 2 == 1 || in_row == 2 * s.H) {
      ASSERT_EQ(lse[i], static_cast<float>(sentinel)) << "lse written outside at " << i;
    }
  }
  for (int64_t h = 0; h < s.H; ++h)
    ASSERT_EQ(d_sink[static_cast<size_t>(h * 2 + 1)], static_cast<float>(sentinel));
}

}  // namespace
}  // namespace sa_test
