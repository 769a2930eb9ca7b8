// The portable indexer's score and fused top-k kernels (src/sm80/indexer_*.cuh) against the
// fp64 reference (SPEC 5). Every call forces options.impl = SA_IMPL_PORTABLE (and checks that it
// ran) except IndexerGpuAuto's, which check that AUTO picks the same kernels; every suite's name
// contains "IndexerGpu" (the filter of these tests in scripts/gpu_suite.sh's sanitizer step).
//
// Scores: device copies with rows 8 elements wider than the tensor and NaN guards; the output
// starts as NaN. Pass: no NaN; -inf exactly outside each range; every finite value within
// 1e-4 (relative to the largest score) of the fp64 reference of the same bf16 values.
// Top-k: outputs start as a sentinel, with guards. Pass:
//  * exact: the row equals SPEC 5's selection over the GPU's own dense scores (ties to the
//    smaller key, NaN last, key order, -1), topk_length = min(k, |range|): the fused kernel ranks
//    exactly what the score kernel writes;
//  * near-optimal against the fp64 reference: every chosen key's reference score is within the
//    score tolerance of the reference's k-th best (bf16 inputs, fp32 sums: near-ties may swap);
//  * deterministic cases: 3 runs, bitwise identical.
// The workspace starts as garbage (0xff). Edge cases: empty rows, clamped and one-key ranges,
// k_end - k_start < k, k > S_kv, packed batches, causal, ties (identical, duplicated, zero keys),
// NaN scores, increasing scores (a compaction per tile), H_I 16/32/64, a negative scale_I, and
// S = 131072 at k 2048 (checked for structure and on sample rows).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "indexer_case.hpp"
#include "indexer_gpu_case.hpp"
#include "test_util.hpp"

#ifndef SA_HAVE_SM90  // set by CMake like the library's
#define SA_HAVE_SM90 0
#endif

namespace sa_test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct GpuIndexerCase {
  std::string name;
  IndexerShape shape;
  IndexerRanges ranges = IndexerRanges::kNone;
  int64_t k = 0;  // top-k only
  IndexerKeys keys = IndexerKeys::kRandom;
  bool nan_w_rows = false;
  float scale_I = 0.f;  // 0: 1/sqrt(D_I)
  bool deterministic_runs = false;  // top-k: 3 runs, bitwise identical
  bool with_length = true;          // top-k: topk_length given
};

void PrintTo(const GpuIndexerCase& c, std::ostream* os) { *os << c.name; }

// ---- scores ----------------------------------------------------------------------------------

class IndexerGpuScores : public ::testing::TestWithParam<GpuIndexerCase> {};

TEST_P(IndexerGpuScores, MatchesReference) {
  SA_SKIP_WITHOUT_GPU();
  const GpuIndexerCase& k = GetParam();
  IndexerCase c =
      make_gpu_indexer_case(k.shape, k.ranges, k.keys, false, seed_of(0x5eed, k.name));
  const sa_indexer_options options = indexer_options(SA_IMPL_PORTABLE, k.scale_I);
  std::vector<float> got;
  ASSERT_TRUE(gpu_scores(c, options, SA_IMPL_PORTABLE, &got));
  const std::vector<float> want = reference_scores(c, options);
  const double scale = max_finite(want);
  std::vector<double> g(got.begin(), got.end()), w(want.begin(), want.end());
  EXPECT_FALSE(any_nan(g)) << "NaN in scores";
  for (int64_t t = 0; t < c.shape.Sq; ++t) {
    for (int64_t s = 0; s < c.shape.Skv; ++s) {
      if (c.in_range(t, s)) continue;
      ASSERT_EQ(g[static_cast<size_t>(t * c.shape.Skv + s)], -kInf)
          << "scores[" << t << ", " << s << "] outside the range";
    }
  }
  EXPECT_TRUE(all_close(g, w, 1e-4 * scale, 0.0)) << "scores (largest |score| " << scale << ")";
}

std::vector<GpuIndexerCase> score_cases() {
  using R = IndexerRanges;
  using K = IndexerKeys;
  return {
      {"H64_Causal_Sq70_Skv300", indexer_shape(70, 300, 64), R::kCausal},
      {"H32_Packed_Sq90_Skv700", indexer_shape(90, 700, 32), R::kPacked},
      {"H16_Odd_Sq37_Skv150", indexer_shape(37, 150, 16), R::kOdd},
      {"H16_Causal_Sq33_Skv1500", indexer_shape(33, 1500, 16), R::kCausal},
      {"H64_Full_Sq1_Skv1", indexer_shape(1, 1, 64), R::kNone},
      {"H64_Full_Sq9_Skv1000", indexer_shape(9, 1000, 64), R::kNone},
      {"H32_Causal_NegativeScale", indexer_shape(40, 200, 32), R::kCausal, 0, K::kRandom, false,
       -0.05f},
      {"H64_Duplicates", indexer_shape(12, 300, 64), R::kNone, 0, K::kDuplicates},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, IndexerGpuScores, ::testing::ValuesIn(score_cases()),
                         [](const auto& info) { return info.param.name; });

// ---- top-k -----------------------------------------------------------------------------------
// Every chosen key of row t scores (in the reference) within `tol` of the reference's n-th best
// of the row, n = the row's length.
::testing::AssertionResult near_optimal(const IndexerCase& c, const std::vector<float>& ref,
                                        const std::vector<int32_t>& row, int64_t t, double tol) {
  std::vector<int32_t> best;
  const int64_t n = select_topk(c, ref, t, static_cast<int64_t>(row.size()), &best);
  if (n == 0) return ::testing::AssertionSuccess();
  double kth = kInf;
  for (int64_t i = 0; i < n; ++i)
    kth = std::min(kth, double(ref[static_cast<size_t>(t * c.shape.Skv + best[i])]));
  for (int64_t i = 0; i < n; ++i) {
    const double v = ref[static_cast<size_t>(t * c.shape.Skv + row[static_cast<size_t>(i)])];
    if (std::isnan(v) || std::isnan(kth)) continue;  // NaN rows: checked exactly elsewhere
    if (v < kth - tol)
      return ::testing::AssertionFailure()
             << "row " << t << " chose key " << row[static_cast<size_t>(i)] << " scoring " << v
             << " in the reference, below the k-th best " << kth << " by more than " << tol;
  }
  return ::testing::AssertionSuccess();
}

class IndexerGpuTopk : public ::testing::TestWithParam<GpuIndexerCase> {};

TEST_P(IndexerGpuTopk, MatchesItsScoresAndTheReference) {
  SA_SKIP_WITHOUT_GPU();
  const GpuIndexerCase& kc = GetParam();
  IndexerCase c =
      make_gpu_indexer_case(kc.shape, kc.ranges, kc.keys, kc.nan_w_rows,
                            seed_of(0x5eed, kc.name));
  const sa_indexer_options options = indexer_options(SA_IMPL_PORTABLE, kc.scale_I);
  const int64_t k = kc.k;
  std::vector<float> scores;
  ASSERT_TRUE(gpu_scores(c, options, SA_IMPL_PORTABLE, &scores));
  GpuIndexerInputs d(c, 8);
  ASSERT_TRUE(d.ok());
  const std::vector<float> ref = reference_scores(c, options);
  const double tol = 2e-4 * max_finite(ref);
  for (const TopkMethod& method : kTopkMethods) {  // each gives the same selection
    SCOPED_TRACE(method.name);
    const sa::detail::ScopedTuning scoped(topk_tuning(method, false));
    TopkResult first;
    ASSERT_TRUE(gpu_topk(d, c, k, kc.with_length, options, SA_IMPL_PORTABLE, &first));
    for (int64_t t = 0; t < c.shape.Sq; ++t) {
      std::vector<int32_t> want;
      const int64_t n = select_topk(c, scores, t, k, &want);
      const std::vector<int32_t> row(first.idx.begin() + t * k, first.idx.begin() + (t + 1) * k);
      ASSERT_EQ(row, want) << "row " << t << " (range [" << c.begin(t) << ", " << c.end(t)
                           << ")) differs from the selection over the GPU's scores";
      if (kc.with_length) {
        ASSERT_EQ(first.len[static_cast<size_t>(t)], n) << "topk_length of row " << t;
        ASSERT_EQ(n, std::min<int64_t>(k, c.end(t) - c.begin(t) > 0 ? c.end(t) - c.begin(t) : 0));
      }
      ASSERT_TRUE(near_optimal(c, ref, row, t, tol));
    }
    if (!kc.deterministic_runs) continue;
    for (int run = 1; run < 3; ++run) {
      TopkResult again;
      ASSERT_TRUE(gpu_topk(d, c, k, kc.with_length, options, SA_IMPL_PORTABLE, &again));
      EXPECT_EQ(again.idx, first.idx) << "topk_idx differs on run " << run;
      EXPECT_EQ(again.len, first.len) << "topk_length differs on run " << run;
    }
  }
}

std::vector<GpuIndexerCase> topk_cases() {
  using R = IndexerRanges;
  using K = IndexerKeys;
  return {
      {"H64_Causal_K32", indexer_shape(70, 300, 64), R::kCausal, 32},
      {"H32_Packed_K50", indexer_shape(90, 700, 32), R::kPacked, 50},
      {"H16_OddRanges_K7", indexer_shape(37, 150, 16), R::kOdd, 7},
      {"H64_Full_K1", indexer_shape(9, 1000, 64), R::kNone, 1},
      {"H64_Causal_K100_Compactions", indexer_shape(40, 3000, 64), R::kCausal, 100,
       K::kRandom, false, 0.f, true},
      {"H32_Full_K300_Increasing", indexer_shape(20, 5000, 32), R::kNone, 300, K::kIncreasing,
       false, 0.f, true},
      {"H16_Causal_K64_Tied", indexer_shape(50, 500, 16), R::kCausal, 64, K::kTied},
      {"H64_Full_K40_Duplicates", indexer_shape(12, 900, 64), R::kNone, 40, K::kDuplicates},
      {"H64_Causal_K2048", indexer_shape(64, 8192, 64), R::kCausal, 2048, K::kRandom, false, 0.f,
       true},
      {"H32_Packed_K20_NanScores", indexer_shape(30, 400, 32), R::kPacked, 20, K::kRandom, true},
      {"H64_Full_K500_AboveSkv", indexer_shape(5, 300, 64), R::kNone, 500},
      {"H16_Full_K16_ZeroKeys", indexer_shape(20, 200, 16), R::kNone, 16, K::kZero},
      {"H64_Causal_K24_NegativeScale", indexer_shape(30, 400, 64), R::kCausal, 24, K::kRandom,
       false, -0.05f},
      {"H32_Odd_K3_NoLength", indexer_shape(24, 90, 32), R::kOdd, 3, K::kRandom, false, 0.f,
       false, false},
      {"H16_Packed_K256_Compactions", indexer_shape(64, 2500, 16), R::kPacked, 256, K::kRandom,
       false, 0.f, true},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, IndexerGpuTopk, ::testing::ValuesIn(topk_cases()),
                         [](const auto& info) { return info.param.name; });

// ---- S = 131072, k 2048, H_I 64, causal ------------------------------------------------------
// The long-context shape: it must run with O(S_q k) extra memory (the workspace is
// checked to be at most the output's size). Every row is checked for structure (increasing keys
// inside the range, then -1, length min(k, t + 1)); sample rows against the exact selection over
// fp64 scores of the same bf16 values, within the score tolerance.
TEST(IndexerGpuTopkLarge, S131072K2048Causal) {
  SA_SKIP_WITHOUT_GPU();
  check_topk_s131072_k2048_causal(indexer_options(SA_IMPL_PORTABLE, 0.f), SA_IMPL_PORTABLE);
}

// ---- AUTO -------------------------------------------------------------------------------------
// AUTO serves CUDA indexer calls with the portable kernels except on sm_90 with the Hopper path
// built, where the scores and the top-k are the Hopper kernels' (IndexerSm90Auto checks those):
// it runs them (gpu_scores and gpu_topk fail unless sa_context.impl_used says so) and gets the same
// bits as a forced call.
TEST(IndexerGpuAuto, ScoresAndTopkRunThePortableKernelsOffHopper) {
  SA_SKIP_WITHOUT_GPU();
  if (SA_HAVE_SM90 && device_is_sm90()) GTEST_SKIP() << "AUTO serves sm_90 with the Hopper kernels";
  IndexerCase c = make_gpu_indexer_case(indexer_shape(40, 300, 64), IndexerRanges::kCausal,
                                        IndexerKeys::kRandom, false, 7);
  const sa_indexer_options automatic = sa_indexer_options_default();
  ASSERT_EQ(automatic.impl, SA_IMPL_AUTO);
  std::vector<float> got, forced;
  ASSERT_TRUE(gpu_scores(c, automatic, SA_IMPL_PORTABLE, &got));
  ASSERT_TRUE(
      gpu_scores(c, indexer_options(SA_IMPL_PORTABLE, 0.f), SA_IMPL_PORTABLE, &forced));
  ASSERT_EQ(got.size(), forced.size());
  EXPECT_EQ(std::memcmp(got.data(), forced.data(), got.size() * sizeof(float)), 0)
      << "AUTO's scores differ from the forced portable call's";
  GpuIndexerInputs d(c, 8);
  ASSERT_TRUE(d.ok());
  TopkResult a, b;
  ASSERT_TRUE(gpu_topk(d, c, 16, true, automatic, SA_IMPL_PORTABLE, &a));
  ASSERT_TRUE(
      gpu_topk(d, c, 16, true, indexer_options(SA_IMPL_PORTABLE, 0.f), SA_IMPL_PORTABLE, &b));
  EXPECT_EQ(a.idx, b.idx);
  EXPECT_EQ(a.len, b.len);
}

}  // namespace
}  // namespace sa_test
