// The portable BSA forward (src/sm80/bsa_forward.cu) against the fp64 reference (SPEC 1).
//
// Each case builds random inputs and a random sparsity pattern on the host
// (bsa_problem_builder.hpp), copies them to the device with o and lse poisoned with NaN, and runs
// sa_bsa_forward on the CUDA tensors (automatic implementation choice, which must be the portable
// one). The oracle is the reference run through the same public API on fp64 copies of the same
// host values. Device tensors have padded rows (their last-dim stride pattern is that of a wider
// tensor) and a guard region after the data, both NaN, which must come back untouched: nothing is
// written outside the output, in particular no query row past S_q.
// Pass: no NaN in o or lse; rel L2 of o below what the dtype allows (P and o are rounded to it);
// lse within 1e-4 and -inf exactly on the rows without keys.

#include <cstdint>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "bsa_problem_builder.hpp"
#include "gpu_test_util.hpp"
#include "test_util.hpp"

namespace sa_test {
namespace {

// ---- cases -----------------------------------------------------------------------------------
struct GpuBsaCase {
  std::string name;
  BsaShape shape;
  BsaPatternSpec spec;
  sa_dtype dtype = SA_DTYPE_BF16;
  float scale = 0.f;    // 0: 1/sqrt(D)
  int64_t pad = 8;      // extra elements per innermost row of q, k, v, o on the device
};

void PrintTo(const GpuBsaCase& c, std::ostream* os) { *os << c.name; }

GpuBsaCase make_case(std::string name, BsaShape shape, BsaPatternSpec spec, sa_dtype dtype,
                     float scale = 0.f, int64_t pad = 8) {
  GpuBsaCase c;
  c.name = std::move(name);
  c.shape = shape;
  c.spec = spec;
  c.dtype = dtype;
  c.scale = scale;
  c.pad = pad;
  return c;
}

constexpr sa_dtype kBf16 = SA_DTYPE_BF16;
constexpr sa_dtype kFp16 = SA_DTYPE_FP16;
constexpr sa_layout kBshd = SA_LAYOUT_BSHD;

const GpuBsaCase kCases[] = {
    // block 128 (128-row CTAs, 32 rows per warp)
    make_case("Block128D128Bf16MhaBhsd", shape_of(1, 2, 2, 256, 384, 128, 128, 3),
              spec_of(true, -1, false, false), kBf16),
    make_case("Block128D128Bf16GqaBshdPartialLenPerBatchEmptyRows",
              shape_of(2, 4, 2, 300, 333, 128, 128, 3, kBshd), spec_of(true, -1, true, true, true),
              kBf16),
    make_case("Block128D128Fp16MqaFixedCountSkvNotMultiple",
              shape_of(1, 4, 1, 128, 129, 128, 128, 2), spec_of(false, 2, false, false), kFp16),
    make_case("Block128D64Fp16MqaFixedCountPartialLen", shape_of(1, 3, 1, 200, 300, 64, 128, 2),
              spec_of(false, 2, false, true), kFp16),
    make_case("Block128D64Bf16GqaBshdEmptyRows", shape_of(2, 4, 2, 257, 256, 64, 128, 2, kBshd),
              spec_of(true, -1, true, false), kBf16),
    // block 64 (64-row CTAs, 16 rows per warp)
    make_case("Block64D128Bf16GqaBshdPartialLenEmptyRows",
              shape_of(1, 4, 2, 130, 200, 128, 64, 3, kBshd), spec_of(true, -1, true, true),
              kBf16),
    make_case("Block64D128Fp16MhaBhsd", shape_of(2, 2, 2, 192, 256, 128, 64, 4),
              spec_of(true, -1, false, false), kFp16),
    make_case("Block64D64Fp16MqaPartialLenPerBatch", shape_of(2, 2, 1, 190, 250, 64, 64, 4),
              spec_of(true, -1, true, true, true), kFp16),
    make_case("Block64D64Bf16GqaBshdFixedCount", shape_of(1, 6, 3, 100, 320, 64, 64, 5, kBshd),
              spec_of(false, -1, false, false), kBf16),
    // contiguous tensors (no row padding)
    make_case("Block128D128Bf16Contiguous", shape_of(1, 2, 1, 200, 256, 128, 128, 2),
              spec_of(true, -1, false, true), kBf16, 0.f, 0),
    // a negative scale (the softmax tracks the minimum dot product)
    make_case("Block128D128Bf16NegativeScale", shape_of(1, 2, 2, 200, 256, 128, 128, 2),
              spec_of(true, -1, false, true), kBf16, -0.2f),
    // more than 128 blocks in a row (the kernel stages the block list 128 slots at a time)
    make_case("Block64D64Bf16RowOf150Blocks", shape_of(1, 1, 1, 64, 64 * 150, 64, 64, 150),
              spec_of(false, 150, false, true), kBf16),
    // every row empty
    make_case("Block128D128Bf16CountZero", shape_of(1, 2, 2, 200, 256, 128, 128, 2),
              spec_of(false, 0, false, false), kBf16),
};

class GpuBsaForward : public ::testing::TestWithParam<GpuBsaCase> {};

TEST_P(GpuBsaForward, MatchesReference) {
  SA_SKIP_WITHOUT_GPU();
  const GpuBsaCase& c = GetParam();
  const BsaShape& s = c.shape;
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  BsaPattern pat = random_bsa_pattern(s, c.spec, rng);
  BsaTensors t = make_bsa_tensors(s, c.dtype, rng);
  if (c.spec.empty_rows) {
    ASSERT_TRUE(pat.has_empty_row(s));
  }

  sa_bsa_options options = sa_bsa_options_default();
  options.scale = c.scale;
  options.layout = s.layout;
  options.block_size = s.block;
  options.count = pat.has_count ? -1 : pat.fixed_count;
  // This suite tests the portable path on every GPU (on sm_90, AUTO would pick the Hopper path,
  // which has its own suite).
  options.impl = SA_IMPL_PORTABLE;
  const double tol = c.dtype == SA_DTYPE_FP16 ? 2e-3 : 1e-2;
  expect_bsa_forward_matches_reference(s, pat, t, options, c.pad, tol);
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuBsaForward, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<GpuBsaCase>& info) {
                           return info.param.name;
                         });

// A head dim the portable forward does not serve is refused with its reason, not run.
TEST(GpuBsaForwardSupport, RefusesUnsupportedHeadDim) {
  SA_SKIP_WITHOUT_GPU();
  const BsaShape s = shape_of(1, 1, 1, 64, 64, 96, 64, 1);
  std::mt19937_64 rng(7);
  BsaPattern pat = random_bsa_pattern(s, spec_of(false, 1, false, false), rng);
  BsaTensors t = make_bsa_tensors(s, SA_DTYPE_BF16, rng);
  DeviceTensor q(t.q, 0, 0), k(t.k, 0, 0), v(t.v, 0, 0), o(t.o, 0, 0), lse(t.lse, 0, 0);
  DeviceTensor index(pat.q2k_index, 0, 0);
  ASSERT_TRUE(q.ok() && k.ok() && v.ok() && o.ok() && lse.ok() && index.ok());
  sa_bsa_fwd_args args = bsa_fwd_args(q, k, v, o, lse, index);
  args.options = sa_bsa_options_default();
  args.options.block_size = 64;
  args.options.impl = SA_IMPL_PORTABLE;
  EXPECT_EQ(sa_bsa_forward(&args, nullptr), SA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(sa_last_error()).find("D = 96, D_v = 96"), std::string::npos)
      << sa_last_error();
}

}  // namespace
}  // namespace sa_test
