// The Hopper BSA forward (src/sm90/bsa_forward.cu) against the fp64 reference (SPEC 1).
//
// Same method as test_gpu_bsa_forward.cpp (the portable forward), with options.impl forced to
// SA_IMPL_SM90: random inputs and sparsity pattern built on the host (bsa_problem_builder.hpp),
// device copies with padded rows and a guard region (NaN, must come back untouched), o and lse
// poisoned with NaN, the reference run through the same public API on fp64 copies. The cases
// cover both block sizes and head dims, GQA/MQA, BSHD, partial KV blocks (block_len and S_kv),
// S_q and S_kv not multiples of the block, empty rows, fixed counts, rows longer than the
// producer's 32-slot chunk, more work tiles than CTAs (the persistent loop crosses tiles with its
// pipeline state), and padded keys whose K and V hold NaN (they must not take part).
// Tests skip unless the device is sm_90.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "bsa_problem_builder.hpp"
#include "common/tuning.hpp"
#include "gpu_test_util.hpp"
#include "test_util.hpp"

#if SA_HAVE_SM90

namespace sa_test {
namespace {

// ---- cases -----------------------------------------------------------------------------------
struct Sm90BsaCase {
  std::string name;
  BsaShape shape;
  BsaPatternSpec spec;
  float scale = 0.f;         // 0: 1/sqrt(D)
  int64_t pad = 8;           // extra elements per innermost row of q, k, v, o on the device
  bool nan_padding = false;  // K and V of padded keys inside the tensor are NaN
};

void PrintTo(const Sm90BsaCase& c, std::ostream* os) { *os << c.name; }

Sm90BsaCase make_case(std::string name, BsaShape shape, BsaPatternSpec spec, float scale = 0.f,
                      int64_t pad = 8, bool nan_padding = false) {
  Sm90BsaCase c;
  c.name = std::move(name);
  c.shape = shape;
  c.spec = spec;
  c.scale = scale;
  c.pad = pad;
  c.nan_padding = nan_padding;
  return c;
}

constexpr sa_layout kBshd = SA_LAYOUT_BSHD;

const Sm90BsaCase kCases[] = {
    // block 128: two consumer warpgroups of 64 rows
    make_case("Block128D128MhaBhsd", shape_of(1, 2, 2, 256, 384, 128, 128, 3),
              spec_of(true, -1, false, false)),
    make_case("Block128D128GqaBshdPartialLenPerBatchEmptyRows",
              shape_of(2, 4, 2, 300, 333, 128, 128, 3, kBshd), spec_of(true, -1, true, true, true)),
    make_case("Block128D128MqaFixedCountSkvNotMultiple", shape_of(1, 4, 1, 128, 129, 128, 128, 2),
              spec_of(false, 2, false, false)),
    make_case("Block128D64MqaFixedCountPartialLen", shape_of(1, 3, 1, 200, 300, 64, 128, 2),
              spec_of(false, 2, false, true)),
    make_case("Block128D64GqaBshdEmptyRows", shape_of(2, 4, 2, 257, 256, 64, 128, 2, kBshd),
              spec_of(true, -1, true, false)),
    // block 64: key-split mode (two consumer warpgroups on one 64-row tile, 128-key stages)
    make_case("Block64D128GqaBshdPartialLenEmptyRows",
              shape_of(1, 4, 2, 130, 200, 128, 64, 3, kBshd), spec_of(true, -1, true, true)),
    make_case("Block64D128MhaBhsd", shape_of(2, 2, 2, 192, 256, 128, 64, 4),
              spec_of(true, -1, false, false)),
    make_case("Block64D64MqaPartialLenPerBatch", shape_of(2, 2, 1, 190, 250, 64, 64, 4),
              spec_of(true, -1, true, true, true)),
    make_case("Block64D64GqaBshdFixedCount", shape_of(1, 6, 3, 100, 320, 64, 64, 5, kBshd),
              spec_of(false, -1, false, false)),
    // contiguous tensors (no row padding)
    make_case("Block128D128Contiguous", shape_of(1, 2, 1, 200, 256, 128, 128, 2),
              spec_of(true, -1, false, true), 0.f, 0),
    make_case("Block64D64BshdContiguous", shape_of(2, 3, 1, 150, 200, 64, 64, 3, kBshd),
              spec_of(true, -1, true, true), 0.f, 0),
    // a negative scale (the softmax tracks the minimum dot product)
    make_case("Block128D128NegativeScale", shape_of(1, 2, 2, 200, 256, 128, 128, 2),
              spec_of(true, -1, false, true), -0.2f),
    make_case("Block64D128NegativeScale", shape_of(1, 2, 2, 200, 256, 128, 64, 3),
              spec_of(true, -1, true, true), -0.15f),
    // rows longer than the producer's 32-slot chunk of the block list
    make_case("Block64D64RowOf150Blocks", shape_of(1, 1, 1, 64, 64 * 150, 64, 64, 150),
              spec_of(false, 150, false, true)),
    make_case("Block128D128RowOf40Blocks", shape_of(1, 2, 1, 256, 128 * 40, 128, 128, 40),
              spec_of(true, -1, false, true)),
    // every row empty
    make_case("Block128D128CountZero", shape_of(1, 2, 2, 200, 256, 128, 128, 2),
              spec_of(false, 0, false, false)),
    make_case("Block64D64CountZero", shape_of(1, 2, 2, 200, 256, 64, 64, 2),
              spec_of(false, 0, false, false)),
    // more work tiles than CTAs: each CTA runs several tiles (mixed counts, empty rows)
    make_case("Block128D64PersistentManyTiles", shape_of(2, 4, 1, 4096, 1024, 64, 128, 2),
              spec_of(true, -1, true, true)),
    make_case("Block64D64PersistentManyTiles", shape_of(2, 4, 2, 4096, 1024, 64, 64, 2, kBshd),
              spec_of(true, -1, true, true, true)),
    // block 64 key-split mode in persistent CTAs: counts 0..7 give tiles of 0..4 stages (odd and
    // even, a missing second block, warpgroup 1 without a stage) one after another
    make_case("Block64D128PersistentMixedCounts", shape_of(1, 4, 2, 4096, 478, 128, 64, 7, kBshd),
              spec_of(true, -1, true, true)),
    // padded keys inside the tensor hold NaN in K and V: they must not take part
    make_case("Block128D128NanInPaddedKeys", shape_of(1, 2, 1, 256, 512, 128, 128, 4),
              spec_of(true, -1, false, true), 0.f, 8, true),
    make_case("Block64D64NanInPaddedKeysBshd", shape_of(2, 2, 2, 128, 320, 64, 64, 5, kBshd),
              spec_of(true, -1, true, true, true), 0.f, 8, true),
};

// One case in `dtype`, options.impl forced to sm90.
void expect_case_matches_reference(const Sm90BsaCase& c, sa_dtype dtype) {
  const BsaShape& s = c.shape;
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  BsaPattern pat = random_bsa_pattern(s, c.spec, rng);
  BsaTensors t = make_bsa_tensors(s, dtype, rng);
  if (c.spec.empty_rows) {
    ASSERT_TRUE(pat.has_empty_row(s));
  }
  if (c.nan_padding) poison_bsa_padded_keys(s, pat, t);

  sa_bsa_options options = sa_bsa_options_default();
  options.scale = c.scale;
  options.layout = s.layout;
  options.block_size = s.block;
  options.count = pat.has_count ? -1 : pat.fixed_count;
  options.impl = SA_IMPL_SM90;
  expect_bsa_forward_matches_reference(s, pat, t, options, c.pad, 1e-2);
}

class Sm90BsaForward : public ::testing::TestWithParam<Sm90BsaCase> {};

TEST_P(Sm90BsaForward, MatchesReference) {
  SA_SKIP_UNLESS_SM90();
  expect_case_matches_reference(GetParam(), SA_DTYPE_BF16);
}

INSTANTIATE_TEST_SUITE_P(Cases, Sm90BsaForward, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Sm90BsaCase>& info) {
                           return info.param.name;
                         });

// Split-KV mode (AUTO's rule splits the bf16 cases above whose tiles cannot fill the GPU): the
// bf16 cases never split (1: the long rows through one tile), with each row's block list in 3
// slices (more slices than some rows have blocks: empty splits) and in 2. The workspace is
// queried and filled with garbage.
TEST(Sm90BsaForwardSplitKv, MatchesReference) {
  SA_SKIP_UNLESS_SM90();
  for (int32_t splits : {1, 3, 2}) {
    sa::detail::Tuning t;
    t.sm90_fwd_splits = splits;
    const sa::detail::ScopedTuning tune(t);
    for (const Sm90BsaCase& c : kCases) {
      SCOPED_TRACE(c.name + " splits " + std::to_string(splits));
      expect_case_matches_reference(c, SA_DTYPE_BF16);
    }
  }
}

// fp16: the same cases.
class Sm90BsaForwardFp16 : public ::testing::TestWithParam<Sm90BsaCase> {};

TEST_P(Sm90BsaForwardFp16, MatchesReference) {
  SA_SKIP_UNLESS_SM90();
  expect_case_matches_reference(GetParam(), SA_DTYPE_FP16);
}

INSTANTIATE_TEST_SUITE_P(Cases, Sm90BsaForwardFp16, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Sm90BsaCase>& info) {
                           return info.param.name;
                         });

// ---- dispatch ----------------------------------------------------------------------------------
// Device tensors of one small problem, for the dispatch tests.
struct SmallProblem {
  BsaShape s;
  BsaPattern pat;
  BsaTensors t;
  std::unique_ptr<DeviceTensor> q, k, v, o, lse, index;
  sa_bsa_fwd_args args = sa_bsa_fwd_args_default();

  SmallProblem(int64_t D, sa_dtype dtype, int32_t index_value = -1) {
    s = shape_of(1, 2, 1, 128, 256, D, 64, 2);
    std::mt19937_64 rng(11);
    pat = random_bsa_pattern(s, spec_of(false, 2, false, false), rng);
    if (index_value >= 0) pat.index(0, 1, 1, 1) = index_value;
    t = make_bsa_tensors(s, dtype, rng);
    q = std::make_unique<DeviceTensor>(t.q, 0, 0);
    k = std::make_unique<DeviceTensor>(t.k, 0, 0);
    v = std::make_unique<DeviceTensor>(t.v, 0, 0);
    o = std::make_unique<DeviceTensor>(t.o, 0, 0);
    lse = std::make_unique<DeviceTensor>(t.lse, 0, 0);
    index = std::make_unique<DeviceTensor>(pat.q2k_index, 0, 0);
    args = bsa_fwd_args(*q, *k, *v, *o, *lse, *index);
    args.options = sa_bsa_options_default();
    args.options.block_size = s.block;
    args.options.count = 2;
  }
  bool ok() const {
    return q->ok() && k->ok() && v->ok() && o->ok() && lse->ok() && index->ok();
  }
};

// Automatic choice: sm90 for bf16 and fp16.
TEST(Sm90BsaForwardDispatch, AutoPicksSm90ForBf16AndFp16) {
  SA_SKIP_UNLESS_SM90();
  for (sa_dtype dtype : {SA_DTYPE_BF16, SA_DTYPE_FP16}) {
    SmallProblem pr(64, dtype);
    ASSERT_TRUE(pr.ok());
    sa_impl used = SA_IMPL_AUTO;
    sa_context ctx = sa_context_default();
    ctx.impl_used = &used;
    ASSERT_EQ(sa_bsa_forward(&pr.args, &ctx), SA_OK) << sa_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(used, SA_IMPL_SM90);
  }
}

// Forced sm90 on what it does not serve: refused with the reason, nothing run.
TEST(Sm90BsaForwardDispatch, RefusesHeadDim96) {
  SA_SKIP_UNLESS_SM90();
  {
    SmallProblem pr(96, SA_DTYPE_BF16);
    ASSERT_TRUE(pr.ok());
    pr.args.options.impl = SA_IMPL_SM90;
    EXPECT_EQ(sa_bsa_forward(&pr.args, nullptr), SA_ERROR_UNSUPPORTED);
    EXPECT_NE(std::string(sa_last_error()).find("D = 96, D_v = 96"), std::string::npos)
        << sa_last_error();
  }
}

// options.validate runs the GPU metadata check before the sm90 kernel.
TEST(Sm90BsaForwardDispatch, ValidateReportsBadIndex) {
  SA_SKIP_UNLESS_SM90();
  SmallProblem pr(64, SA_DTYPE_BF16, /*index_value=*/1000);
  ASSERT_TRUE(pr.ok());
  pr.args.options.impl = SA_IMPL_SM90;
  pr.args.options.validate = 1;
  EXPECT_EQ(sa_bsa_forward(&pr.args, nullptr), SA_ERROR_INVALID_METADATA);
  EXPECT_NE(std::string(sa_last_error()).find("= 1000"), std::string::npos) << sa_last_error();
}

// CPU tensors: the sm90 path declines with its reason (no GPU needed).
TEST(Sm90BsaForwardDispatch, RefusesCpuTensors) {
  BsaShape s = shape_of(1, 1, 1, 64, 64, 64, 64, 1);
  std::mt19937_64 rng(3);
  BsaPattern pat = random_bsa_pattern(s, spec_of(false, 1, false, false), rng);
  BsaTensors t = make_bsa_tensors(s, SA_DTYPE_BF16, rng);
  sa_bsa_fwd_args args = sa_bsa_fwd_args_default();
  args.q = t.q.view();
  args.k = t.k.view();
  args.v = t.v.view();
  args.o = t.o.view();
  args.lse = t.lse.view();
  args.sparsity = pat.sparsity();
  args.options = sa_bsa_options_default();
  args.options.block_size = 64;
  args.options.count = 1;
  args.options.impl = SA_IMPL_SM90;
  EXPECT_EQ(sa_bsa_forward(&args, nullptr), SA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(sa_last_error()).find("needs CUDA tensors"), std::string::npos)
      << sa_last_error();
}

}  // namespace
}  // namespace sa_test

#endif  // SA_HAVE_SM90
