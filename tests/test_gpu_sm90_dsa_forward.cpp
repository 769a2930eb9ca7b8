// The Hopper DSA forward (src/sm90/dsa_forward.cu) against the fp64 reference (SPEC 2).
//
// Same method as test_gpu_dsa_forward.cpp (the portable forward), with options.impl forced to
// SA_IMPL_SM90: each case is built on the host (dsa_problem_builder.hpp, with the sparse edge
// cases planted: invalid indices -1 / S_kv / INT32_MAX / INT32_MIN, topk_length 0, negative and
// above topk, duplicates, topk > S_kv, sinks none / finite / large / +inf / -inf / 2.4e38), kv
// rows that no active slot selects are overwritten with NaN, out/lse are poisoned with NaN, and
// the oracle is the reference run through the same public API on fp64 copies of the same values.
// Pass: no NaN anywhere; rel L2 of out < 1e-2; lse within 1e-4 and +inf at the same positions;
// exactly 0 in rows that are empty or whose head has a sink of +inf (or 2.4e38).
// Also: AUTO keeps choosing the portable forward while the sm90 one is not validated on hardware,
// and shapes the sm90 forward does not serve are refused by name when it is forced.
// Tests skip unless the device is sm_90.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dsa_problem_builder.hpp"
#include "gpu_test_util.hpp"
#include "test_util.hpp"

#if SA_HAVE_SM90

namespace sa_test {
namespace {

// ---- runs ------------------------------------------------------------------------------------
// The cases, the run, the reference and the checks are shared with the portable suite
// (gpu_test_util.hpp); here SA_IMPL_SM90 is forced and must run.
class Sm90DsaForward : public ::testing::TestWithParam<GpuDsaFwdCase> {};

void expect_sm90_case_matches(const GpuDsaFwdCase& p, float scale = 0.f, bool workspace = true) {
  DsaHostCase c =
      make_dsa_host_case(p.shape, p.spec, SA_DTYPE_BF16, seed_of(0x5390d5a, p.name), scale);

  // NaN in every kv row no active slot selects: the kernel must never read them.
  ::testing::Test::RecordProperty("poisoned_kv_rows", poison_unselected_kv_rows(c));

  DsaFwdOutputs want, got;
  ASSERT_NO_FATAL_FAILURE(run_dsa_forward_fp64_reference(c, &want));
  ASSERT_NO_FATAL_FAILURE(
      run_dsa_forward_public_api(c, SA_IMPL_SM90, SA_IMPL_SM90, &got, workspace));
  expect_dsa_forward_matches(c, got, want, nullptr);
}

TEST_P(Sm90DsaForward, MatchesReference) {
  SA_SKIP_UNLESS_SM90();
  expect_sm90_case_matches(GetParam());
}

// Large softmax scales: scores spread over tens of log2 units, so the running maximum of many rows
// moves by more than kLazyRescaleLog2 after the first chunk and O is rescaled by 0 < alpha < 1
// (with the default scale the first chunk's maximum almost never moves that far). 16 chunks.
TEST(Sm90DsaForwardLargeScale, RescalesMatchReference) {
  SA_SKIP_UNLESS_SM90();
  const GpuDsaFwdCase p{"H64_D576_K1024_LargeScale", shape_of(4, 2048, 64, 576, 1024),
                        spec_of(DsaLengths::kMixed, true, false, DsaSink::kFinite)};
  for (float scale : {1.f, 2.f}) {
    SCOPED_TRACE(scale);
    expect_sm90_case_matches(p, scale);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Sm90DsaForward,
                         ::testing::ValuesIn(gpu_dsa_forward_cases(SA_IMPL_SM90)),
                         [](const ::testing::TestParamInfo<GpuDsaFwdCase>& info) {
                           return info.param.name;
                         });

// H 16 (the transposed kernel, dsa_forward_small_h.cuh) and 32 (the 64-row kernel with head
// padding): the portable suite's H 16 and 32 bf16 cases, the same run.
std::vector<GpuDsaFwdCase> small_h_cases() {
  std::vector<GpuDsaFwdCase> out;
  for (const GpuDsaFwdCase& p : gpu_dsa_forward_cases(SA_IMPL_PORTABLE))
    if ((p.shape.H == 16 || p.shape.H == 32) && p.dtype == SA_DTYPE_BF16) out.push_back(p);
  return out;
}

INSTANTIATE_TEST_SUITE_P(SmallH, Sm90DsaForward, ::testing::ValuesIn(small_h_cases()),
                         [](const ::testing::TestParamInfo<GpuDsaFwdCase>& info) {
                           return info.param.name;
                         });

// The forward's workspace (the item counter of the dynamic schedule, with topk_length) is
// optional: without it the same cases run one CTA per item.
TEST(Sm90DsaForwardWorkspace, OptionalWithTopkLength) {
  SA_SKIP_UNLESS_SM90();
  int ran = 0;
  for (const GpuDsaFwdCase& p : gpu_dsa_forward_cases(SA_IMPL_SM90)) {
    if (p.name != "H128_D576_K130_LengthsDynamicItems" &&
        p.name != "H64_D512_K64_LengthsDynamicItems" &&
        p.name != "H32_D512_K64_LengthsDynamicItems")
      continue;
    SCOPED_TRACE(p.name);
    expect_sm90_case_matches(p, 0.f, /*workspace=*/false);
    ++ran;
  }
  EXPECT_EQ(ran, 3);
}

// On an sm_90 device AUTO picks the sm90 forward for the shapes it serves (H 8 included).
TEST(Sm90DsaForwardDispatch, AutoPicksSm90) {
  SA_SKIP_UNLESS_SM90();
  for (int64_t H : {int64_t{64}, int64_t{8}}) {
    SCOPED_TRACE(H);
    DsaHostCase c = make_dsa_host_case(shape_of(4, 300, H, 576, 96),
                                       spec_of(DsaLengths::kMixed, true, false, DsaSink::kFinite),
                                       SA_DTYPE_BF16, seed_of(0x5390d5a, "auto"));
    DsaFwdOutputs got;
    ASSERT_NO_FATAL_FAILURE(run_dsa_forward_public_api(c, SA_IMPL_AUTO, SA_IMPL_SM90, &got));
  }
}

// Shapes the sm90 forward does not serve are refused by name when it is forced.
TEST(Sm90DsaForwardRefusals, UnsupportedShapesNameTheReason) {
  SA_SKIP_UNLESS_SM90();
  struct Refusal {
    int64_t H, Dqk;
    sa_dtype dtype;
    const char* reason;
  };
  const Refusal cases[] = {
      {48, 576, SA_DTYPE_BF16, "H = 48"},
      {80, 512, SA_DTYPE_BF16, "H = 80"},
      {64, 576, SA_DTYPE_FP16, "dtype fp16"},
  };
  for (const Refusal& r : cases)
    ASSERT_NO_FATAL_FAILURE(
        expect_dsa_forward_refused(SA_IMPL_SM90, r.H, r.Dqk, 512, r.dtype, r.reason));
}

}  // namespace
}  // namespace sa_test

#endif  // SA_HAVE_SM90
