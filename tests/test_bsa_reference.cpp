// The fp64 BSA reference (SPEC 1) and the CPU reverse map, tested directly (no public API):
//  * forward against an independent dense oracle (plain softmax under the densified mask);
//  * backward against central finite differences of the forward;
//  * metadata validation messages;
//  * reverse map against a brute-force construction.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <ostream>
#include <string>
#include <vector>

#include "bsa_problem_builder.hpp"
#include "common/error.hpp"
#include "common/reverse_map.hpp"
#include "reference/reference.hpp"
#include "test_util.hpp"

namespace {

using sa_test::BsaPattern;
using sa_test::BsaPatternSpec;
using sa_test::BsaShape;
using sa_test::BsaTensors;

BsaShape make_shape(int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Skv, int64_t D,
                    int64_t Dv, int32_t block, int64_t Kmax,
                    sa_layout layout = SA_LAYOUT_BHSD) {
  BsaShape s;
  s.B = B;
  s.Hq = Hq;
  s.Hkv = Hkv;
  s.Sq = Sq;
  s.Skv = Skv;
  s.D = D;
  s.Dv = Dv;
  s.block = block;
  s.Kmax = Kmax;
  s.layout = layout;
  return s;
}

BsaPatternSpec make_spec(bool per_row_count, bool empty_rows, int64_t unattended_block,
                         bool kv_block_len, bool per_batch_len = false, int32_t fixed_count = -1) {
  BsaPatternSpec spec;
  spec.per_row_count = per_row_count;
  spec.empty_rows = empty_rows;
  spec.unattended_block = unattended_block;
  spec.kv_block_len = kv_block_len;
  spec.kv_block_len_per_batch = per_batch_len;
  spec.fixed_count = fixed_count;
  return spec;
}

// How far a stored element of `dtype` may be from the exact double: rounding to nearest.
double dtype_atol(sa_dtype t) { return t == SA_DTYPE_FP16 ? 6e-8 : 1e-12; }  // fp16 subnormals
double dtype_rtol(sa_dtype t) {
  switch (t) {
    case SA_DTYPE_BF16: return 1.0 / 256;    // 8 mantissa bits, round to nearest
    case SA_DTYPE_FP16: return 1.0 / 2048;
    case SA_DTYPE_FP32: return 1.2e-7;
    default: return 1e-13;
  }
}

// ---------------------------------------------------------------------------------------------
// Forward vs the dense oracle.
// ---------------------------------------------------------------------------------------------
struct FwdCase {
  std::string name;
  BsaShape shape;
  BsaPatternSpec spec;
  sa_dtype dtype;
};

void PrintTo(const FwdCase& c, std::ostream* os) { *os << c.name; }

class BsaReferenceForward : public ::testing::TestWithParam<FwdCase> {};

TEST_P(BsaReferenceForward, MatchesDenseMaskedAttention) {
  const FwdCase& c = GetParam();
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  BsaPattern pat = sa_test::random_bsa_pattern(c.shape, c.spec, rng);
  BsaTensors t = sa_test::make_bsa_tensors(c.shape, c.dtype, rng);
  if (c.spec.empty_rows) {
    ASSERT_TRUE(pat.has_empty_row(c.shape));
  }

  const sa::BsaFwdProblem p = sa_test::make_bsa_fwd_problem(c.shape, c.dtype, pat, t);
  ASSERT_NO_THROW(sa::reference::check_bsa_metadata(p.dims, p.meta));
  sa::reference::bsa_forward(p);

  const sa_test::DenseAttention want = sa_test::dense_masked_attention(c.shape, pat, t, p.scale);
  const std::vector<double> o = sa_test::bhsd_doubles(t.o, c.shape.layout);
  EXPECT_TRUE(sa_test::all_close(o, want.o, dtype_atol(c.dtype), dtype_rtol(c.dtype))) << "o";
  // LSE is stored in fp32; -inf must sit exactly on the empty rows.
  EXPECT_TRUE(sa_test::all_close(t.lse.to_double(), want.lse, 1e-6, 2e-7)) << "lse";
}

const FwdCase kFwdCases[] = {
    {"MhaBhsdBlock64PerRowCountEmptyRows", make_shape(2, 2, 2, 192, 256, 16, 8, 64, 3),
     make_spec(true, true, -1, false), SA_DTYPE_FP64},
    {"GqaBshdBlock128PartialPerBatchLen",
     make_shape(2, 4, 2, 300, 333, 16, 16, 128, 2, SA_LAYOUT_BSHD),
     make_spec(true, false, -1, true, true), SA_DTYPE_FP64},
    {"MqaBhsdBlock64FixedCount", make_shape(1, 3, 1, 130, 200, 8, 16, 64, 2),
     make_spec(false, false, -1, false), SA_DTYPE_FP64},
    {"MqaBshdBlock128FixedCountPartialLen",
     make_shape(1, 4, 1, 256, 400, 8, 8, 128, 3, SA_LAYOUT_BSHD),
     make_spec(false, false, -1, true, false, 3), SA_DTYPE_FP64},
    {"GqaBhsdBlock64UnattendedBlockEmptyRows", make_shape(1, 6, 3, 200, 320, 16, 16, 64, 4),
     make_spec(true, true, 2, true), SA_DTYPE_FP64},
    {"GqaBshdBlock128SkvNotMultiple", make_shape(1, 4, 2, 128, 129, 16, 16, 128, 2,
                                                  SA_LAYOUT_BSHD),
     make_spec(true, true, -1, false), SA_DTYPE_FP64},
    {"MhaBhsdBlock64Fp32", make_shape(1, 2, 2, 128, 192, 16, 16, 64, 2),
     make_spec(true, true, -1, true), SA_DTYPE_FP32},
    {"GqaBshdBlock64Bf16", make_shape(1, 4, 2, 128, 192, 16, 16, 64, 2, SA_LAYOUT_BSHD),
     make_spec(true, false, -1, true, true), SA_DTYPE_BF16},
    {"MhaBhsdBlock128Fp16", make_shape(1, 2, 2, 256, 256, 16, 16, 128, 2),
     make_spec(false, false, -1, true, false, 1), SA_DTYPE_FP16},
};

INSTANTIATE_TEST_SUITE_P(Patterns, BsaReferenceForward, ::testing::ValuesIn(kFwdCases),
                         [](const ::testing::TestParamInfo<FwdCase>& i) { return i.param.name; });

// The dense oracle must see something to compare: a sanity check of the mask builder on a
// hand-written pattern.
TEST(BsaDenseMask, HandWrittenPattern) {
  BsaShape s = make_shape(1, 1, 1, 128, 160, 8, 8, 64, 2);  // Nq = 2, Nkv = 3, last block 32
  BsaPattern pat;
  pat.q2k_index = sa_test::HostTensor(SA_DTYPE_INT32, {1, 1, 2, 2});
  pat.fixed_count = 2;
  pat.index(0, 0, 0, 0) = 2;
  pat.index(0, 0, 0, 1) = 0;
  pat.index(0, 0, 1, 0) = 1;
  pat.index(0, 0, 1, 1) = 2;
  const std::vector<uint8_t> mask = sa_test::dense_bsa_mask(s, pat, 0, 0);
  for (int64_t i = 0; i < s.Sq; ++i) {
    for (int64_t j = 0; j < s.Skv; ++j) {
      const bool want = i < 64 ? (j < 64 || j >= 128) : j >= 64;
      ASSERT_EQ(mask[static_cast<size_t>(i * s.Skv + j)], want ? 1 : 0) << i << ", " << j;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Empty rows.
// ---------------------------------------------------------------------------------------------
TEST(BsaReferenceEmptyRows, AllRowsEmptyGiveZeroAndMinusInf) {
  for (bool per_row : {true, false}) {
    SCOPED_TRACE(per_row ? "q2k_count all zero" : "fixed count 0");
    BsaShape s = make_shape(1, 2, 1, 100, 128, 8, 8, 64, 2);
    std::mt19937_64 rng(3);
    BsaPattern pat = sa_test::random_bsa_pattern(s, make_spec(per_row, false, -1, false), rng);
    if (per_row)
      std::fill(pat.q2k_count.i32(), pat.q2k_count.i32() + pat.q2k_count.numel(), 0);
    else
      pat.fixed_count = 0;
    BsaTensors t = sa_test::make_bsa_tensors(s, SA_DTYPE_FP64, rng);
    sa::reference::bsa_forward(sa_test::make_bsa_fwd_problem(s, SA_DTYPE_FP64, pat, t));
    for (double x : t.o.to_double()) ASSERT_EQ(x, 0.0);
    for (double x : t.lse.to_double()) ASSERT_EQ(x, -INFINITY);
  }
}

TEST(BsaReferenceEmptyRows, MixedRowsOnlyEmptyOnesAreZero) {
  BsaShape s = make_shape(1, 2, 2, 192, 192, 8, 8, 64, 2);
  std::mt19937_64 rng(4);
  BsaPattern pat = sa_test::random_bsa_pattern(s, make_spec(true, false, -1, false), rng);
  pat.q2k_count.i32()[1] = 0;  // (b=0, h=0, m=1) is empty, all others list a block
  BsaTensors t = sa_test::make_bsa_tensors(s, SA_DTYPE_FP64, rng);
  sa::reference::bsa_forward(sa_test::make_bsa_fwd_problem(s, SA_DTYPE_FP64, pat, t));
  for (int64_t h = 0; h < s.Hq; ++h) {
    for (int64_t i = 0; i < s.Sq; ++i) {
      const bool empty = h == 0 && i / s.block == 1;
      const double lse = t.lse.get(h * s.Sq + i);
      if (empty)
        EXPECT_EQ(lse, -INFINITY) << h << ", " << i;
      else
        EXPECT_TRUE(std::isfinite(lse)) << h << ", " << i;
      for (int64_t x = 0; x < s.Dv; ++x) {
        const double o = t.o.get(sa_test::bsa_index(t.o, s.layout, 0, h, i, x));
        if (empty) EXPECT_EQ(o, 0.0);
        else EXPECT_NE(o, 0.0);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward vs central finite differences of the forward (fp64 tensors).
// ---------------------------------------------------------------------------------------------
struct BwdCase {
  std::string name;
  BsaShape shape;
  BsaPatternSpec spec;
};

void PrintTo(const BwdCase& c, std::ostream* os) { *os << c.name; }

class BsaReferenceBackward : public ::testing::TestWithParam<BwdCase> {};

// loss = sum(dO * O) for the current inputs (overwrites t.o and t.lse).
double bsa_loss(const BsaShape& s, const BsaPattern& pat, BsaTensors& t) {
  sa::reference::bsa_forward(sa_test::make_bsa_fwd_problem(s, SA_DTYPE_FP64, pat, t));
  double loss = 0.0;
  for (int64_t i = 0; i < t.o.numel(); ++i) loss += t.dout.get(i) * t.o.get(i);
  return loss;
}

// Compares `grad` with central differences of the loss in ~40 random elements of `input`.
void check_gradient(const char* what, const BsaShape& s, const BsaPattern& pat, BsaTensors& t,
                    sa_test::HostTensor& input, const sa_test::HostTensor& grad,
                    std::mt19937_64& rng) {
  SCOPED_TRACE(what);
  const std::vector<double> g = grad.to_double();
  ASSERT_FALSE(sa_test::any_nan(g)) << "an element was not written";
  double gmax = 0.0;
  for (double x : g) gmax = std::max(gmax, std::fabs(x));
  ASSERT_GT(gmax, 0.0);
  const double h = 1e-6;
  std::uniform_int_distribution<int64_t> pick(0, input.numel() - 1);
  for (int sample = 0; sample < 40; ++sample) {
    const int64_t i = pick(rng);
    const double x0 = input.get(i);
    input.set(i, x0 + h);
    const double up = bsa_loss(s, pat, t);
    input.set(i, x0 - h);
    const double down = bsa_loss(s, pat, t);
    input.set(i, x0);
    const double fd = (up - down) / (2 * h);
    const double an = g[static_cast<size_t>(i)];
    // The backward recomputes P from the fp32 LSE (relative error ~3e-7 per row).
    EXPECT_NEAR(an, fd, 1e-6 * gmax + 1e-6 * std::fabs(fd)) << "element " << i;
  }
}

TEST_P(BsaReferenceBackward, MatchesFiniteDifferences) {
  const BwdCase& c = GetParam();
  const BsaShape& s = c.shape;
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  BsaPattern pat = sa_test::random_bsa_pattern(s, c.spec, rng);
  BsaTensors t = sa_test::make_bsa_tensors(s, SA_DTYPE_FP64, rng);
  if (c.spec.empty_rows) {
    ASSERT_TRUE(pat.has_empty_row(s));
  }

  sa::reference::bsa_forward(sa_test::make_bsa_fwd_problem(s, SA_DTYPE_FP64, pat, t));
  sa::reference::bsa_backward(sa_test::make_bsa_bwd_problem(s, SA_DTYPE_FP64, pat, t));

  // Exact zeros where nothing contributes: empty rows (dq), padded keys and unattended blocks.
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.Hq; ++h) {
      for (int64_t i = 0; i < s.Sq; ++i) {
        if (pat.count(b, h, i / s.block) != 0) continue;
        for (int64_t x = 0; x < s.D; ++x)
          ASSERT_EQ(t.dq.get(sa_test::bsa_index(t.dq, s.layout, b, h, i, x)), 0.0);
      }
    }
    for (int64_t hk = 0; hk < s.Hkv; ++hk) {
      for (int64_t j = 0; j < s.Skv; ++j) {
        const int64_t n = j / s.block;
        const bool padded = j % s.block >= pat.block_len(s, b, n);
        if (!padded && n != c.spec.unattended_block) continue;
        for (int64_t x = 0; x < s.D; ++x)
          ASSERT_EQ(t.dk.get(sa_test::bsa_index(t.dk, s.layout, b, hk, j, x)), 0.0) << j;
        for (int64_t x = 0; x < s.Dv; ++x)
          ASSERT_EQ(t.dv.get(sa_test::bsa_index(t.dv, s.layout, b, hk, j, x)), 0.0) << j;
      }
    }
  }

  check_gradient("dq", s, pat, t, t.q, t.dq, rng);
  check_gradient("dk", s, pat, t, t.k, t.dk, rng);
  check_gradient("dv", s, pat, t, t.v, t.dv, rng);
}

const BwdCase kBwdCases[] = {
    // Nkv = 3 with block 2 unattended; KV block 0 partial; empty rows.
    {"GqaBhsdBlock64PartialEmptyUnattended", make_shape(1, 4, 2, 150, 180, 8, 8, 64, 2),
     make_spec(true, true, 2, true)},
    {"MqaBshdBlock128FixedCountPartial",
     make_shape(1, 2, 1, 200, 300, 8, 8, 128, 2, SA_LAYOUT_BSHD),
     make_spec(false, false, 1, true, false, 2)},
    {"MhaBshdBlock64PerBatchLenEmptyRows",
     make_shape(2, 2, 2, 128, 190, 8, 4, 64, 2, SA_LAYOUT_BSHD),
     make_spec(true, true, -1, true, true)},
};

INSTANTIATE_TEST_SUITE_P(Patterns, BsaReferenceBackward, ::testing::ValuesIn(kBwdCases),
                         [](const ::testing::TestParamInfo<BwdCase>& i) { return i.param.name; });

// An LSE of -inf marks a row as empty for the backward even if the metadata lists blocks.
TEST(BsaReferenceBackwardRows, MinusInfLseRowContributesNothing) {
  BsaShape s = make_shape(1, 1, 1, 64, 64, 8, 8, 64, 1);
  std::mt19937_64 rng(5);
  BsaPattern pat = sa_test::random_bsa_pattern(s, make_spec(false, false, -1, false), rng);
  BsaTensors t = sa_test::make_bsa_tensors(s, SA_DTYPE_FP64, rng);
  sa::reference::bsa_forward(sa_test::make_bsa_fwd_problem(s, SA_DTYPE_FP64, pat, t));
  for (int64_t i = 0; i < s.Sq; ++i) t.lse.set(i, -INFINITY);
  sa::reference::bsa_backward(sa_test::make_bsa_bwd_problem(s, SA_DTYPE_FP64, pat, t));
  for (const sa_test::HostTensor* g : {&t.dq, &t.dk, &t.dv})
    for (double x : g->to_double()) ASSERT_EQ(x, 0.0);
}

// A huge scale puts the fp32 LSE's rounding (about |lse| * 6e-8) beyond exp's range: the
// recomputed probabilities are capped at 1, so the gradients stay finite (issue #37: NaN in dq).
TEST(BsaReferenceBackwardRows, HugeScaleGivesFiniteGradients) {
  BsaShape s = make_shape(1, 2, 1, 128, 128, 16, 16, 64, 2);
  std::mt19937_64 rng(37);
  BsaPattern pat = sa_test::random_bsa_pattern(s, make_spec(false, false, -1, false), rng);
  BsaTensors t = sa_test::make_bsa_tensors(s, SA_DTYPE_FP32, rng);
  for (float scale : {1e30f, -1e30f, 2.3e38f}) {
    sa::reference::bsa_forward(sa_test::make_bsa_fwd_problem(s, SA_DTYPE_FP32, pat, t, scale));
    sa::reference::bsa_backward(sa_test::make_bsa_bwd_problem(s, SA_DTYPE_FP32, pat, t, scale));
    for (const sa_test::HostTensor* g : {&t.o, &t.dq, &t.dk, &t.dv})
      for (double x : g->to_double()) ASSERT_FALSE(std::isnan(x)) << "scale " << scale;
  }
}

// ---------------------------------------------------------------------------------------------
// Metadata validation.
// ---------------------------------------------------------------------------------------------
class BsaMetadataCheck : public ::testing::Test {
 protected:
  // B = 1, Hq = 2, Nq = 3, Nkv = 4, Kmax = 3; every row lists 3 distinct blocks.
  void SetUp() override {
    shape_ = make_shape(1, 2, 1, 192, 256, 8, 8, 64, 3);
    std::mt19937_64 rng(6);
    pat_ = sa_test::random_bsa_pattern(shape_, make_spec(true, false, -1, true), rng);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t m = 0; m < 3; ++m) {
        pat_.q2k_count.i32()[h * 3 + m] = 3;
        for (int64_t slot = 0; slot < 3; ++slot)
          pat_.index(0, h, m, slot) = static_cast<int32_t>((m + slot) % 4);
      }
  }
  // The error check_bsa_metadata throws; fails the test if it does not throw.
  std::string failure() {
    try {
      sa::reference::check_bsa_metadata(shape_.dims(), pat_.meta());
    } catch (const sa::Error& e) {
      EXPECT_EQ(e.code(), SA_ERROR_INVALID_METADATA);
      return e.what();
    }
    ADD_FAILURE() << "check_bsa_metadata did not throw";
    return "";
  }
  BsaShape shape_;
  BsaPattern pat_;
};

TEST_F(BsaMetadataCheck, ValidPatternPasses) {
  EXPECT_NO_THROW(sa::reference::check_bsa_metadata(shape_.dims(), pat_.meta()));
}

TEST_F(BsaMetadataCheck, SlotsPastTheCountAreNotRead) {
  pat_.q2k_count.i32()[4] = 1;  // (h=1, m=1): slots 1 and 2 are garbage now
  pat_.index(0, 1, 1, 1) = -3;
  pat_.index(0, 1, 1, 2) = pat_.index(0, 1, 1, 0);
  EXPECT_NO_THROW(sa::reference::check_bsa_metadata(shape_.dims(), pat_.meta()));
}

TEST_F(BsaMetadataCheck, IndexTooLarge) {
  pat_.index(0, 1, 2, 1) = 9;
  EXPECT_NE(failure().find("q2k_index[b=0, h=1, m=2, slot=1] = 9: expected a KV block in [0, 4)"),
            std::string::npos);
}

TEST_F(BsaMetadataCheck, IndexNegative) {
  pat_.index(0, 0, 1, 0) = -1;
  EXPECT_NE(failure().find("q2k_index[b=0, h=0, m=1, slot=0] = -1"), std::string::npos);
}

TEST_F(BsaMetadataCheck, DuplicateEntry) {
  pat_.index(0, 0, 1, 2) = pat_.index(0, 0, 1, 0);
  const std::string msg = failure();
  EXPECT_NE(msg.find("q2k_index[b=0, h=0, m=1, slot=2] = " +
                     std::to_string(pat_.index(0, 0, 1, 0)) + " repeats slot 0"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("distinct"), std::string::npos) << msg;
}

TEST_F(BsaMetadataCheck, DuplicateWithFixedCount) {
  pat_.has_count = false;
  pat_.fixed_count = 2;
  pat_.index(0, 1, 0, 2) = pat_.index(0, 1, 0, 0);  // past the count: fine
  EXPECT_NO_THROW(sa::reference::check_bsa_metadata(shape_.dims(), pat_.meta()));
  pat_.index(0, 1, 0, 1) = pat_.index(0, 1, 0, 0);
  EXPECT_NE(failure().find("q2k_index[b=0, h=1, m=0, slot=1]"), std::string::npos);
}

TEST_F(BsaMetadataCheck, CountTooLarge) {
  pat_.q2k_count.i32()[0] = 7;
  EXPECT_NE(failure().find("q2k_count[b=0, h=0, m=0] = 7: expected [0, 3]"), std::string::npos);
}

TEST_F(BsaMetadataCheck, CountNegative) {
  pat_.q2k_count.i32()[5] = -2;
  EXPECT_NE(failure().find("q2k_count[b=0, h=1, m=2] = -2"), std::string::npos);
}

TEST_F(BsaMetadataCheck, BlockLenZero) {
  pat_.kv_block_len.i32()[2] = 0;
  EXPECT_NE(failure().find("kv_block_len[b=0, n=2] = 0: expected [1, 64]"), std::string::npos);
}

TEST_F(BsaMetadataCheck, BlockLenTooLarge) {
  pat_.kv_block_len.i32()[3] = 65;
  EXPECT_NE(failure().find("kv_block_len[b=0, n=3] = 65"), std::string::npos);
}

TEST_F(BsaMetadataCheck, ReportsTheFirstBadEntry) {
  pat_.index(0, 1, 0, 2) = 4;
  pat_.index(0, 0, 2, 1) = 5;  // earlier in (b, h, m, slot) order
  pat_.kv_block_len.i32()[0] = 0;
  EXPECT_NE(failure().find("q2k_index[b=0, h=0, m=2, slot=1] = 5"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Reverse map vs brute force.
// ---------------------------------------------------------------------------------------------
struct RevCase {
  std::string name;
  BsaShape shape;
  BsaPatternSpec spec;
  int32_t bucket;
};

void PrintTo(const RevCase& c, std::ostream* os) { *os << c.name; }

class BsaReverseMap : public ::testing::TestWithParam<RevCase> {};

TEST_P(BsaReverseMap, MatchesBruteForce) {
  const RevCase& c = GetParam();
  const BsaShape& s = c.shape;
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  BsaPattern pat = sa_test::random_bsa_pattern(s, c.spec, rng);
  const sa::ReverseMap map = sa::build_reverse_map_cpu(s.dims(), pat.meta(), c.bucket);

  // Brute force: for each KV row, ask every (head in group, query block) whether it lists n.
  const int64_t G = s.group(), Nq = s.Nq(), Nkv = s.Nkv();
  std::vector<std::set<int32_t>> rows;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t hk = 0; hk < s.Hkv; ++hk)
      for (int64_t n = 0; n < Nkv; ++n) {
        std::set<int32_t> row;
        for (int64_t hl = 0; hl < G; ++hl)
          for (int64_t m = 0; m < Nq; ++m)
            for (int64_t slot = 0; slot < pat.count(b, hk * G + hl, m); ++slot)
              if (pat.index(b, hk * G + hl, m, slot) == n)
                row.insert(static_cast<int32_t>(hl * Nq + m));
        rows.push_back(row);
      }
  size_t longest = 0;
  for (const auto& r : rows) longest = std::max(longest, r.size());
  const int32_t bucket = c.bucket > 0 ? c.bucket : std::max<int32_t>(1, int32_t(longest));

  ASSERT_EQ(map.num_rows, static_cast<int64_t>(rows.size()));
  ASSERT_EQ(map.bucket, bucket);
  ASSERT_EQ(map.row_offsets.size(), rows.size() + 1);
  ASSERT_EQ(map.row_groups.size(), rows.size());
  std::vector<int32_t> want_row, want_begin, want_end;
  int32_t offset = 0;
  bool saw_empty_row = false;
  for (size_t r = 0; r < rows.size(); ++r) {
    const int32_t len = static_cast<int32_t>(rows[r].size());
    saw_empty_row |= len == 0;
    ASSERT_EQ(map.row_offsets[r], offset) << "row " << r;
    ASSERT_EQ(map.row_offsets[r + 1] - map.row_offsets[r], len) << "row " << r;
    const std::vector<int32_t> got(map.entries.begin() + map.row_offsets[r],
                                   map.entries.begin() + map.row_offsets[r + 1]);
    ASSERT_EQ(got, std::vector<int32_t>(rows[r].begin(), rows[r].end())) << "row " << r;
    const int32_t groups = std::max(1, (len + bucket - 1) / bucket);
    ASSERT_EQ(map.row_groups[r], groups) << "row " << r;
    for (int32_t g = 0; g < groups; ++g) {
      want_row.push_back(static_cast<int32_t>(r));
      want_begin.push_back(offset + g * bucket);
      want_end.push_back(offset + std::min(len, (g + 1) * bucket));
    }
    offset += len;
  }
  EXPECT_EQ(map.entries.size(), static_cast<size_t>(offset));
  EXPECT_EQ(map.item_row, want_row);
  EXPECT_EQ(map.item_begin, want_begin);
  EXPECT_EQ(map.item_end, want_end);
  if (c.spec.unattended_block >= 0) {
    EXPECT_TRUE(saw_empty_row);
  }
}

std::vector<RevCase> reverse_map_cases() {
  struct Pattern {
    std::string name;
    BsaShape shape;
    BsaPatternSpec spec;
  };
  const Pattern patterns[] = {
      {"MhaEmptyRowsUnattended", make_shape(2, 2, 2, 320, 384, 8, 8, 64, 4),
       make_spec(true, true, 3, false)},
      {"GqaPerRowCount", make_shape(2, 4, 2, 512, 512, 8, 8, 128, 3),
       make_spec(true, true, -1, false)},
      {"MqaFixedCountUnattended", make_shape(1, 4, 1, 448, 320, 8, 8, 64, 2),
       make_spec(false, false, 0, false)},
  };
  std::vector<RevCase> cases;
  for (const Pattern& p : patterns)
    for (int32_t bucket : {1, 2, 3, 0})
      cases.push_back({p.name + "Bucket" + (bucket > 0 ? std::to_string(bucket) : "Auto"),
                       p.shape, p.spec, bucket});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Patterns, BsaReverseMap, ::testing::ValuesIn(reverse_map_cases()),
                         [](const ::testing::TestParamInfo<RevCase>& i) { return i.param.name; });

// A hand-checked map: Hq = 2 over one KV head, Nq = 2, Nkv = 3, bucket 2.
TEST(BsaReverseMapByHand, GqaTwoHeads) {
  BsaShape s = make_shape(1, 2, 1, 128, 192, 8, 8, 64, 2);
  BsaPattern pat;
  pat.q2k_index = sa_test::HostTensor(SA_DTYPE_INT32, {1, 2, 2, 2});
  pat.q2k_count = sa_test::HostTensor(SA_DTYPE_INT32, {1, 2, 2});
  pat.has_count = true;
  // h=0: m=0 -> {2, 0}; m=1 -> {0}.   h=1: m=0 -> {}; m=1 -> {0, 2}.   Block 1: nobody.
  const int32_t counts[4] = {2, 1, 0, 2};
  const int32_t index[8] = {2, 0, 0, 99, 99, 99, 0, 2};
  std::copy(counts, counts + 4, pat.q2k_count.i32());
  std::copy(index, index + 8, pat.q2k_index.i32());
  const sa::ReverseMap map = sa::build_reverse_map_cpu(s.dims(), pat.meta(), 2);
  // Entries hl * Nq + m: block 0 <- (0,0), (0,1), (1,1) = {0, 1, 3}; block 2 <- {0, 3}.
  EXPECT_EQ(map.num_rows, 3);
  EXPECT_EQ(map.bucket, 2);
  EXPECT_EQ(map.row_offsets, (std::vector<int32_t>{0, 3, 3, 5}));
  EXPECT_EQ(map.entries, (std::vector<int32_t>{0, 1, 3, 0, 3}));
  EXPECT_EQ(map.row_groups, (std::vector<int32_t>{2, 1, 1}));
  EXPECT_EQ(map.item_row, (std::vector<int32_t>{0, 0, 1, 2}));
  EXPECT_EQ(map.item_begin, (std::vector<int32_t>{0, 2, 3, 3}));
  EXPECT_EQ(map.item_end, (std::vector<int32_t>{2, 3, 3, 5}));

  const sa::ReverseMap whole = sa::build_reverse_map_cpu(s.dims(), pat.meta(), 0);
  EXPECT_EQ(whole.bucket, 3);
  EXPECT_EQ(whole.row_groups, (std::vector<int32_t>{1, 1, 1}));
  EXPECT_EQ(whole.item_begin, (std::vector<int32_t>{0, 3, 3}));
  EXPECT_EQ(whole.item_end, (std::vector<int32_t>{3, 3, 5}));
}

TEST(BsaReverseMapByHand, NoEntriesAtAllGivesBucketOne) {
  BsaShape s = make_shape(1, 1, 1, 64, 128, 8, 8, 64, 1);
  BsaPattern pat;
  pat.q2k_index = sa_test::HostTensor(SA_DTYPE_INT32, {1, 1, 1, 1});
  pat.fixed_count = 0;
  const sa::ReverseMap map = sa::build_reverse_map_cpu(s.dims(), pat.meta(), 0);
  EXPECT_EQ(map.bucket, 1);
  EXPECT_EQ(map.row_groups, (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(map.item_begin, map.item_end);
  EXPECT_EQ(map.item_row, (std::vector<int32_t>{0, 1}));
}

}  // namespace
