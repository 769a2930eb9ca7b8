// The Hopper indexer score kernel (src/sm90/indexer_scores_kernel.cuh) against the fp64 reference
// and against the portable kernel on the same inputs (SPEC 5). Every call forces
// options.impl = SA_IMPL_SM90 (and checks that it ran) except IndexerSm90Gate's, which checks that
// AUTO does not pick the gated kernel. Every suite's name contains "IndexerSm90"; they skip without
// an sm_90 GPU.
//
// Pass (scores): no NaN; -inf exactly outside each range (bitwise the same positions as the
// portable kernel's); every finite value within 1e-4 (relative to the largest score) of the fp64
// reference of the same bf16 values and within 1e-5 of the portable kernel's; equal keys give
// bitwise equal scores (the duplicate-key case); two runs are bitwise identical.
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

// Gated: AUTO must not run the sm90 score kernel until it is verified (it runs the portable one).
TEST(IndexerSm90Gate, AutoRunsThePortableScores) {
  SA_SKIP_UNLESS_SM90();
  IndexerCase c = make_gpu_indexer_case(indexer_shape(8, 128, 64), IndexerRanges::kCausal,
                                        IndexerKeys::kRandom, false, 7);
  std::vector<float> got;
  EXPECT_TRUE(gpu_scores(c, indexer_options(SA_IMPL_AUTO, 0.f), SA_IMPL_PORTABLE, &got));
}

}  // namespace
}  // namespace sa_test
