// The Hopper indexer score kernel (src/sm90/indexer_scores_kernel.cuh) against the fp64 reference
// and against the portable kernel on the same inputs (SPEC 5). Every call forces
// options.impl = SA_IMPL_SM90 (and checks that it ran) except IndexerSm90Auto's, which checks that
// AUTO picks the Hopper kernels. Every suite's name contains "IndexerSm90"; they skip without
// an sm_90 GPU.
//
// Pass (scores): no NaN; -inf exactly outside each range (bitwise the same positions as the
// portable kernel's); every finite value within 1e-4 (relative to the largest score) of the fp64
// reference of the same bf16 values and within 1e-5 of the portable kernel's; equal keys give
// bitwise equal scores (the duplicate-key case); two runs are bitwise identical.
// The fused top-k's suites (IndexerSm90Topk*) are described at their tests.
// Edge cases: H_I 16 / 32 / 64; causal, packed, odd (empty, clamped, one-key) ranges; S_kv not a
// multiple of the 64-key tile nor of the 2048-key chunk; S_q not a multiple of the CTA's tokens;
// S_q = S_kv = 1; a negative scale_I; several chunks and more tiles than pipeline stages.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "indexer_case.hpp"
#include "indexer_gpu_case.hpp"
#include "test_util.hpp"

namespace sa_test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Sm90IndexerCase {
  std::string name;
  IndexerShape shape;
  IndexerRanges ranges = IndexerRanges::kNone;
  IndexerKeys keys = IndexerKeys::kRandom;
  float scale_I = 0.f;  // 0: 1/sqrt(D_I)
};

void PrintTo(const Sm90IndexerCase& c, std::ostream* os) { *os << c.name; }

class IndexerSm90Scores : public ::testing::TestWithParam<Sm90IndexerCase> {};

TEST_P(IndexerSm90Scores, MatchesReferenceAndPortable) {
  SA_SKIP_UNLESS_SM90();
  const Sm90IndexerCase& k = GetParam();
  IndexerCase c =
      make_gpu_indexer_case(k.shape, k.ranges, k.keys, false, seed_of(0x5eed90, k.name));
  std::vector<float> got, again, port;
  ASSERT_TRUE(gpu_scores(c, indexer_options(SA_IMPL_SM90, k.scale_I), SA_IMPL_SM90, &got));
  ASSERT_TRUE(gpu_scores(c, indexer_options(SA_IMPL_SM90, k.scale_I), SA_IMPL_SM90, &again));
  ASSERT_TRUE(
      gpu_scores(c, indexer_options(SA_IMPL_PORTABLE, k.scale_I), SA_IMPL_PORTABLE, &port));
  const std::vector<float> want = reference_scores(c, indexer_options(SA_IMPL_SM90, k.scale_I));
  const double scale = max_finite(want);
  std::vector<double> g(got.begin(), got.end()), w(want.begin(), want.end()),
      pt(port.begin(), port.end());
  EXPECT_FALSE(any_nan(g)) << "NaN in scores";
  EXPECT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * 4))
      << "two runs differ (not bitwise deterministic)";
  const int64_t Skv = c.shape.Skv;
  for (int64_t t = 0; t < c.shape.Sq; ++t) {
    for (int64_t s = 0; s < Skv; ++s) {
      const size_t i = static_cast<size_t>(t * Skv + s);
      if (c.in_range(t, s)) {
        ASSERT_TRUE(std::isfinite(g[i])) << "scores[" << t << ", " << s << "] = " << g[i];
        continue;
      }
      ASSERT_EQ(g[i], -kInf) << "scores[" << t << ", " << s << "] outside the range";
      ASSERT_EQ(pt[i], -kInf) << "portable scores[" << t << ", " << s << "]";
    }
  }
  EXPECT_TRUE(all_close(g, w, 1e-4 * scale, 0.0)) << "against the reference (largest |score| "
                                                  << scale << ")";
  EXPECT_TRUE(all_close(g, pt, 1e-5 * scale, 0.0)) << "against the portable kernel";
  if (k.keys == IndexerKeys::kDuplicates) {
    // Key 2i + 1 is a copy of key 2i: the same bits, whatever their positions in the tile.
    for (int64_t t = 0; t < c.shape.Sq; ++t)
      for (int64_t s = 1; s < Skv; s += 2) {
        const size_t i = static_cast<size_t>(t * Skv + s);
        if (c.in_range(t, s) && c.in_range(t, s - 1)) {
          ASSERT_EQ(0, std::memcmp(&got[i], &got[i - 1], 4))
              << "duplicate keys " << s - 1 << ", " << s << " of query " << t << " differ";
        }
      }
  }
}

std::vector<Sm90IndexerCase> sm90_score_cases() {
  using R = IndexerRanges;
  using K = IndexerKeys;
  return {
      {"H64_Causal_Sq70_Skv300", indexer_shape(70, 300, 64), R::kCausal},
      {"H32_Causal_Sq70_Skv300", indexer_shape(70, 300, 32), R::kCausal},
      {"H16_Causal_Sq70_Skv300", indexer_shape(70, 300, 16), R::kCausal},
      {"H64_Packed_Sq90_Skv700", indexer_shape(90, 700, 64), R::kPacked},
      {"H32_Packed_Sq90_Skv700", indexer_shape(90, 700, 32), R::kPacked},
      {"H16_Odd_Sq37_Skv150", indexer_shape(37, 150, 16), R::kOdd},
      {"H64_Odd_Sq37_Skv150", indexer_shape(37, 150, 64), R::kOdd},
      {"H16_Causal_Sq33_Skv1500", indexer_shape(33, 1500, 16), R::kCausal},
      {"H64_Full_Sq1_Skv1", indexer_shape(1, 1, 64), R::kNone},
      {"H32_Full_Sq1_Skv1", indexer_shape(1, 1, 32), R::kNone},
      {"H64_Full_Sq9_Skv1000", indexer_shape(9, 1000, 64), R::kNone},
      // Two chunks (2048 keys each), the second partial; more tiles than stages.
      {"H64_Causal_Sq200_Skv4500", indexer_shape(200, 4500, 64), R::kCausal},
      {"H32_Full_Sq21_Skv2111", indexer_shape(21, 2111, 32), R::kNone},
      {"H16_Packed_Sq130_Skv2500", indexer_shape(130, 2500, 16), R::kPacked},
      {"H32_Causal_NegativeScale", indexer_shape(40, 200, 32), R::kCausal, K::kRandom, -0.05f},
      {"H64_Duplicates", indexer_shape(12, 300, 64), R::kNone, K::kDuplicates},
      {"H16_Duplicates", indexer_shape(40, 333, 16), R::kCausal, K::kDuplicates},
      {"H64_ZeroKeys", indexer_shape(10, 100, 64), R::kNone, K::kZero},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, IndexerSm90Scores, ::testing::ValuesIn(sm90_score_cases()),
                         [](const auto& info) { return info.param.name; });

// AUTO serves sm_90 with the Hopper scores and top-k: it runs them (gpu_scores and gpu_topk fail
// unless sa_context.impl_used says sm90) and gets the same bits as a forced sm90 call.
TEST(IndexerSm90Auto, RunsTheHopperScoresAndTopk) {
  SA_SKIP_UNLESS_SM90();
  IndexerCase c = make_gpu_indexer_case(indexer_shape(8, 128, 64), IndexerRanges::kCausal,
                                        IndexerKeys::kRandom, false, 7);
  std::vector<float> got, forced;
  ASSERT_TRUE(gpu_scores(c, indexer_options(SA_IMPL_AUTO, 0.f), SA_IMPL_SM90, &got));
  ASSERT_TRUE(gpu_scores(c, indexer_options(SA_IMPL_SM90, 0.f), SA_IMPL_SM90, &forced));
  ASSERT_EQ(got.size(), forced.size());
  EXPECT_EQ(std::memcmp(got.data(), forced.data(), got.size() * sizeof(float)), 0);
  GpuIndexerInputs d(c, 8);
  ASSERT_TRUE(d.ok());
  TopkResult a, b;
  ASSERT_TRUE(gpu_topk(d, c, 16, true, indexer_options(SA_IMPL_AUTO, 0.f), SA_IMPL_SM90, &a));
  ASSERT_TRUE(gpu_topk(d, c, 16, true, indexer_options(SA_IMPL_SM90, 0.f), SA_IMPL_SM90, &b));
  EXPECT_EQ(a.idx, b.idx);
  EXPECT_EQ(a.len, b.len);
}

// ---- fused top-k (sm90/indexer_topk_kernel.cuh) -----------------------------------------------
// Pass: every row equals SPEC 5's selection (ties to the smaller key, NaN last, key order, -1
// padding) over the sm90 score kernel's dense scores of the same inputs, exactly (the two kernels
// share the score pieces, so they see the same bits); topk_length = min(k, |range|); three runs
// bitwise identical. The sm90 scores themselves are checked against the fp64 reference above.
// Edge cases: H_I 16 / 32 / 64; causal, packed, odd ranges; k 1, k > S_kv, k 2048; compactions
// (many keys per row), increasing and tied scores, duplicate and zero keys, NaN rows (NaN in w),
// a negative scale_I, no topk_length; more query blocks than SMs (a CTA takes several blocks).
struct Sm90TopkCase {
  std::string name;
  IndexerShape shape;
  IndexerRanges ranges = IndexerRanges::kNone;
  int64_t k = 0;
  IndexerKeys keys = IndexerKeys::kRandom;
  bool nan_w_rows = false;
  float scale_I = 0.f;
  bool with_length = true;
};

void PrintTo(const Sm90TopkCase& c, std::ostream* os) { *os << c.name; }

class IndexerSm90Topk : public ::testing::TestWithParam<Sm90TopkCase> {};

TEST_P(IndexerSm90Topk, MatchesTheSelectionOverSm90Scores) {
  SA_SKIP_UNLESS_SM90();
  const Sm90TopkCase& kc = GetParam();
  IndexerCase c = make_gpu_indexer_case(kc.shape, kc.ranges, kc.keys, kc.nan_w_rows,
                                        seed_of(0x5eed90, kc.name));
  const sa_indexer_options options = indexer_options(SA_IMPL_SM90, kc.scale_I);
  std::vector<float> scores;
  ASSERT_TRUE(gpu_scores(c, options, SA_IMPL_SM90, &scores));
  GpuIndexerInputs d(c, 8);
  ASSERT_TRUE(d.ok());
  const int64_t k = kc.k;
  for (const TopkMethod& method : kTopkMethods) {  // each gives the same selection
    SCOPED_TRACE(method.name);
    const sa::detail::ScopedTuning scoped(topk_tuning(method, true));
    TopkResult first;
    ASSERT_TRUE(gpu_topk(d, c, k, kc.with_length, options, SA_IMPL_SM90, &first));
    for (int64_t t = 0; t < c.shape.Sq; ++t) {
      std::vector<int32_t> want;
      const int64_t n = select_topk(c, scores, t, k, &want);
      const std::vector<int32_t> row(first.idx.begin() + t * k, first.idx.begin() + (t + 1) * k);
      ASSERT_EQ(row, want) << "row " << t << " (range [" << c.begin(t) << ", " << c.end(t)
                           << ")) differs from the selection over the sm90 scores";
      if (kc.with_length) {
        ASSERT_EQ(first.len[static_cast<size_t>(t)], n) << "topk_length of row " << t;
      }
    }
    for (int run = 1; run < 3; ++run) {
      TopkResult again;
      ASSERT_TRUE(gpu_topk(d, c, k, kc.with_length, options, SA_IMPL_SM90, &again));
      EXPECT_EQ(again.idx, first.idx) << "topk_idx differs on run " << run;
      EXPECT_EQ(again.len, first.len) << "topk_length differs on run " << run;
    }
  }
}

std::vector<Sm90TopkCase> sm90_topk_cases() {
  using R = IndexerRanges;
  using K = IndexerKeys;
  return {
      {"H64_Causal_K32", indexer_shape(70, 300, 64), R::kCausal, 32},
      {"H32_Packed_K50", indexer_shape(90, 700, 32), R::kPacked, 50},
      {"H16_OddRanges_K7", indexer_shape(37, 150, 16), R::kOdd, 7},
      {"H64_Full_K1", indexer_shape(9, 1000, 64), R::kNone, 1},
      {"H64_Full_Sq1_Skv1_K4", indexer_shape(1, 1, 64), R::kNone, 4},
      {"H64_Causal_K100_Compactions", indexer_shape(40, 3000, 64), R::kCausal, 100},
      {"H32_Full_K300_Increasing", indexer_shape(20, 5000, 32), R::kNone, 300, K::kIncreasing},
      {"H16_Causal_K64_Tied", indexer_shape(50, 500, 16), R::kCausal, 64, K::kTied},
      {"H64_Full_K40_Duplicates", indexer_shape(12, 900, 64), R::kNone, 40, K::kDuplicates},
      {"H64_Causal_K2048", indexer_shape(64, 8192, 64), R::kCausal, 2048},
      {"H32_Packed_K20_NanScores", indexer_shape(30, 400, 32), R::kPacked, 20, K::kRandom, true},
      {"H64_Full_K500_AboveSkv", indexer_shape(5, 300, 64), R::kNone, 500},
      {"H16_Full_K16_ZeroKeys", indexer_shape(20, 200, 16), R::kNone, 16, K::kZero},
      {"H64_Causal_K24_NegativeScale", indexer_shape(30, 400, 64), R::kCausal, 24, K::kRandom,
       false, -0.05f},
      {"H32_Odd_K3_NoLength", indexer_shape(24, 90, 32), R::kOdd, 3, K::kRandom, false, 0.f,
       false},
      {"H16_Packed_K256_Compactions", indexer_shape(64, 2500, 16), R::kPacked, 256},
      // More query blocks than SMs: 2000 / 8 = 250 (H_I 64), 5000 / 32 = 157 (H_I 16).
      {"H64_Causal_Sq2000_K64_Persistent", indexer_shape(2000, 2000, 64), R::kCausal, 64},
      {"H16_Packed_Sq5000_K33_Persistent", indexer_shape(5000, 600, 16), R::kPacked, 33},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, IndexerSm90Topk, ::testing::ValuesIn(sm90_topk_cases()),
                         [](const auto& info) { return info.param.name; });

// S = 131072, k 2048, H_I 64, causal: O(S_q k) extra memory, every row's structure, sample rows
// against fp64 scores (the portable top-k's large check, through the sm90 path).
TEST(IndexerSm90TopkLarge, S131072K2048Causal) {
  SA_SKIP_UNLESS_SM90();
  const sa::detail::ScopedTuning scoped(topk_tuning(kTopkMethods[0], true));  // fused
  check_topk_s131072_k2048_causal(indexer_options(SA_IMPL_SM90, 0.f), SA_IMPL_SM90);
}

// The same through the two passes: 64 chunks of 2048 query rows (1 GiB of scores each).
TEST(IndexerSm90TopkLarge, S131072K2048CausalTwoPasses) {
  SA_SKIP_UNLESS_SM90();
  const sa::detail::ScopedTuning scoped(topk_tuning(kTopkMethods[1], true));  // two passes
  check_topk_s131072_k2048_causal(indexer_options(SA_IMPL_SM90, 0.f), SA_IMPL_SM90,
                                  (size_t{1} << 30) + 4096);
}

// The same with the candidates row kernel (64 KB of shared memory per row at S_kv 131072).
TEST(IndexerSm90TopkLarge, S131072K2048CausalTwoPassesCandidates) {
  SA_SKIP_UNLESS_SM90();
  const sa::detail::ScopedTuning scoped(topk_tuning(kTopkMethods[4], true));  // candidates
  check_topk_s131072_k2048_causal(indexer_options(SA_IMPL_SM90, 0.f), SA_IMPL_SM90,
                                  (size_t{1} << 30) + 4096);
}

}  // namespace
}  // namespace sa_test
