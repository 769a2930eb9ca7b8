// The portable DSA forward (src/sm80/dsa_forward.cu) against the fp64 reference (SPEC 2).
//
// Each case is built on the host (dsa_problem_builder.hpp, with the sparse edge cases planted),
// kv rows that no active slot selects are overwritten with NaN, and the tensors are copied to the
// device with out/lse poisoned with NaN. The kernel runs through the public API (sa_dsa_forward,
// portable implementation forced) and, to cover both chunk sizes on any GPU that has them,
// through sa::portable::dsa_forward with block_n pinned to 32 and 64. The oracle is the reference
// run through the same public API on fp64 copies of the same host values.
// Pass: no NaN anywhere; rel L2 of out < 1e-2; lse within 1e-4 and +inf at the same positions;
// exactly 0 in rows that are empty or whose head has a sink of +inf (or 2.4e38).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "dsa_problem_builder.hpp"
#include "gpu_test_util.hpp"
#include "sm80/dsa_forward.hpp"
#include "test_util.hpp"

namespace sa_test {
namespace {

// ---- runs ------------------------------------------------------------------------------------
// The cases, the public-API run, the reference and the checks are shared with the sm90 suite
// (gpu_test_util.hpp); here the portable implementation is forced, and its kernel also runs with
// block_n pinned.
enum class Variant { kPublicApi, kBlockN32, kBlockN64 };

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::kPublicApi: return "public_api";
    case Variant::kBlockN32: return "block_n_32";
    case Variant::kBlockN64: return "block_n_64";
  }
  return "?";
}

// The kernel on device copies of the case's inputs; out and lse start as NaN.
void run_gpu(const DsaHostCase& c, Variant variant, DsaFwdOutputs* result) {
  if (variant == Variant::kPublicApi) {
    run_dsa_forward_public_api(c, SA_IMPL_PORTABLE, SA_IMPL_PORTABLE, result);
    return;
  }
  run_dsa_forward_on_device(
      c,
      [&](const DsaFwdDeviceBuffers& d) {
        const DsaShape& s = c.shape;
        DsaPointers ptr;
        ptr.q = d.q.get();
        ptr.kv = d.kv.get();
        ptr.topk_idx = static_cast<const int32_t*>(d.idx.get());
        ptr.topk_length = c.has_length ? static_cast<const int32_t*>(d.len.get()) : nullptr;
        ptr.sink = c.has_sink ? static_cast<const float*>(d.sink.get()) : nullptr;
        ptr.out = d.out.get();
        ptr.lse = static_cast<float*>(d.lse.get());
        const sa::DsaFwdProblem p =
            make_dsa_fwd_problem(s, c.dtype, c.scale, ptr, SA_DEVICE_CUDA, 0);
        sa::portable::DsaForwardTuning tuning;
        tuning.block_n = variant == Variant::kBlockN32 ? 32 : 64;
        try {
          sa::portable::dsa_forward(p, nullptr, tuning);
        } catch (const std::exception& e) {
          FAIL() << "dsa_forward threw: " << e.what();
        }
      },
      result);
}

class DsaForwardGpu : public ::testing::TestWithParam<GpuDsaFwdCase> {};

TEST_P(DsaForwardGpu, MatchesReference) {
  SA_SKIP_WITHOUT_GPU();
  const GpuDsaFwdCase& p = GetParam();
  DsaHostCase c = make_dsa_host_case(p.shape, p.spec, p.dtype, seed_of(0xd5a, p.name));

  // NaN in every kv row no active slot selects: the kernel must never read them.
  RecordProperty("poisoned_kv_rows", poison_unselected_kv_rows(c));

  DsaFwdOutputs want;
  ASSERT_NO_FATAL_FAILURE(run_dsa_forward_fp64_reference(c, &want));
  std::vector<Variant> variants = {Variant::kPublicApi, Variant::kBlockN32};
  if (device_smem_optin_at_least(sa::portable::dsa_forward_smem_bytes(64)))
    variants.push_back(Variant::kBlockN64);
  for (Variant v : variants) {
    SCOPED_TRACE(variant_name(v));
    DsaFwdOutputs got;
    ASSERT_NO_FATAL_FAILURE(run_gpu(c, v, &got));
    expect_dsa_forward_matches(c, got, want, variant_name(v));
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, DsaForwardGpu,
                         ::testing::ValuesIn(gpu_dsa_forward_cases(SA_IMPL_PORTABLE)),
                         [](const ::testing::TestParamInfo<GpuDsaFwdCase>& info) {
                           return info.param.name;
                         });

// Shapes the portable forward does not serve are refused by name when it is forced.
TEST(DsaForwardGpuRefusals, UnsupportedShapesNameTheReason) {
  SA_SKIP_WITHOUT_GPU();
  struct Refusal {
    int64_t H, Dqk, Dv;
    sa_dtype dtype;
    const char* reason;
  };
  const Refusal cases[] = {
      {16, 128, 128, SA_DTYPE_BF16, "D_qk = 128"},
      {12, 576, 512, SA_DTYPE_BF16, "H = 12"},
      {16, 576, 256, SA_DTYPE_BF16, "d_v = 256"},
      {16, 576, 512, SA_DTYPE_FP32, "dtype fp32"},
  };
  for (const Refusal& r : cases)
    ASSERT_NO_FATAL_FAILURE(
        expect_dsa_forward_refused(SA_IMPL_PORTABLE, r.H, r.Dqk, r.Dv, r.dtype, r.reason));
}

}  // namespace
}  // namespace sa_test
