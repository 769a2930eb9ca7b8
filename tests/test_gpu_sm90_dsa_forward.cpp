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
#include <limits>
#include <string>
#include <vector>

#include "dsa_problem_builder.hpp"
#include "gpu_test_util.hpp"
#include "test_util.hpp"

#if SA_HAVE_SM90

namespace sa_test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- cases -----------------------------------------------------------------------------------
struct Sm90DsaCase {
  std::string name;
  DsaShape shape;
  DsaMetaSpec spec;
};

std::vector<Sm90DsaCase> sm90_dsa_cases() {
  using L = DsaLengths;
  using S = DsaSink;
  return {
      {"H64_D576_K64_Plain", shape_of(8, 256, 64, 576, 64),
       spec_of(L::kNone, false, false, S::kNone)},
      {"H64_D512_K7_Lengths", shape_of(8, 64, 64, 512, 7),
       spec_of(L::kMixed, false, false, S::kFinite)},
      {"H64_D576_K100_LengthsInvalid", shape_of(8, 400, 64, 576, 100),
       spec_of(L::kMixed, true, false, S::kFinite)},
      {"H128_D576_K2048_Everything", shape_of(5, 5000, 128, 576, 2048),
       spec_of(L::kMixed, true, true, S::kMixed)},
      {"H128_D512_K2048_Plain", shape_of(4, 4096, 128, 512, 2048),
       spec_of(L::kNone, false, false, S::kNone)},
      {"H64_D512_K1_LengthsInvalid", shape_of(8, 50, 64, 512, 1),
       spec_of(L::kMixed, true, false, S::kNone)},
      {"H128_D576_K1_Plain", shape_of(6, 10, 128, 576, 1),
       spec_of(L::kNone, false, false, S::kNone)},
      {"H64_D576_K100_TopkAboveSkv", shape_of(8, 40, 64, 576, 100),
       spec_of(L::kMixed, false, false, S::kFinite)},
      {"H64_D576_K70_TopkAboveSkvDuplicates", shape_of(8, 30, 64, 576, 70),
       spec_of(L::kNone, false, true, S::kNone)},
      {"H64_D576_K64_Duplicates", shape_of(8, 300, 64, 576, 64),
       spec_of(L::kNone, false, true, S::kFinite)},
      {"H64_D576_K96_SinkPosInf", shape_of(8, 300, 64, 576, 96),
       spec_of(L::kMixed, true, false, S::kPosInf)},
      {"H64_D576_K96_SinkNegInf", shape_of(8, 300, 64, 576, 96),
       spec_of(L::kMixed, true, false, S::kNegInf)},
      {"H64_D576_K96_SinkHuge", shape_of(8, 300, 64, 576, 96),
       spec_of(L::kMixed, true, false, S::kHuge)},
      {"H64_D512_K96_SinkLarge", shape_of(8, 300, 64, 512, 96),
       spec_of(L::kNone, false, false, S::kLarge)},
      {"H128_D576_K160_SinkMixed", shape_of(6, 700, 128, 576, 160),
       spec_of(L::kMixed, true, true, S::kMixed)},
      {"H128_D576_K96_ManyTokens", shape_of(40, 1024, 128, 576, 96),
       spec_of(L::kMixed, true, false, S::kFinite)},
      {"H128_D512_K600_LengthsInvalid", shape_of(4, 1500, 128, 512, 600),
       spec_of(L::kMixed, true, false, S::kMixed)},
  };
}

struct Outputs {
  HostTensor out, lse;
};

// The public API on device copies of the case's inputs (out and lse start as NaN); `impl` is
// the implementation forced, `expect_used` the one that must have run.
void run_gpu(const DsaHostCase& c, sa_impl impl, sa_impl expect_used, Outputs* result) {
  const DsaShape& s = c.shape;
  HostTensor out(c.dtype, {s.Sq, s.H, s.Dv}), lse(SA_DTYPE_FP32, {s.Sq, s.H});
  out.poison();
  lse.poison();
  DeviceBuffer q(c.q), kv(c.kv), idx(c.topk_idx), len(c.topk_length), sink(c.sink), d_out(out),
      d_lse(lse);
  for (const DeviceBuffer* b : {&q, &kv, &idx, &len, &sink, &d_out, &d_lse})
    ASSERT_TRUE(b->ok()) << "device allocation or copy failed";

  sa_dsa_fwd_args a{};
  a.q = view_of(q.get(), c.dtype, {s.Sq, s.H, s.Dqk}, SA_DEVICE_CUDA);
  a.kv = view_of(kv.get(), c.dtype, {s.Skv, s.Dqk}, SA_DEVICE_CUDA);
  a.topk_idx = view_of(idx.get(), SA_DTYPE_INT32, {s.Sq, s.topk}, SA_DEVICE_CUDA);
  a.topk_length = c.has_length ? view_of(len.get(), SA_DTYPE_INT32, {s.Sq}, SA_DEVICE_CUDA)
                               : sa_tensor_none();
  a.sink =
      c.has_sink ? view_of(sink.get(), SA_DTYPE_FP32, {s.H}, SA_DEVICE_CUDA) : sa_tensor_none();
  a.out = view_of(d_out.get(), c.dtype, {s.Sq, s.H, s.Dv}, SA_DEVICE_CUDA);
  a.lse = view_of(d_lse.get(), SA_DTYPE_FP32, {s.Sq, s.H}, SA_DEVICE_CUDA);
  a.options = sa_dsa_options_default();
  a.options.scale = c.scale;
  a.options.d_v = static_cast<int32_t>(s.Dv);
  a.options.impl = impl;
  sa_context ctx = sa_context_default();
  sa_impl used = SA_IMPL_AUTO;
  ctx.impl_used = &used;
  ASSERT_EQ(sa_dsa_forward(&a, &ctx), SA_OK) << sa_last_error();
  ASSERT_EQ(used, expect_used);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  ASSERT_TRUE(d_out.download(out));
  ASSERT_TRUE(d_lse.download(lse));
  result->out = std::move(out);
  result->lse = std::move(lse);
}

// The fp64 reference through the public API on fp64 copies of the case's (16-bit) host values.
void run_reference(const DsaHostCase& c, Outputs* result) {
  HostTensor q = to_fp64(c.q), kv = to_fp64(c.kv);
  run_dsa_reference_forward(c, q, kv, SA_DTYPE_FP64, &result->out, &result->lse);
}

void expect_matches(const DsaHostCase& c, const Outputs& got, const Outputs& want) {
  const DsaShape& s = c.shape;
  const std::vector<double> out = got.out.to_double(), lse = got.lse.to_double();
  const std::vector<double> ref_out = want.out.to_double(), ref_lse = want.lse.to_double();
  ASSERT_FALSE(any_nan(ref_out)) << "reference out holds NaN";
  EXPECT_FALSE(any_nan(out)) << "NaN in out";
  EXPECT_FALSE(any_nan(lse)) << "NaN in lse";

  double ref_norm = 0.0;
  for (double v : ref_out) ref_norm += v * v;
  if (ref_norm > 0.0) {
    const double err = rel_l2(out, ref_out);
    EXPECT_LT(err, 1e-2) << "rel L2 of out";
    ::testing::Test::RecordProperty("rel_l2", std::to_string(err));
  }
  EXPECT_TRUE(all_close(lse, ref_lse, 1e-4, 0.0)) << "lse";

  // Rows that must be exactly zero: empty rows, heads whose sink takes the whole softmax.
  for (int64_t t = 0; t < s.Sq; ++t) {
    for (int64_t h = 0; h < s.H; ++h) {
      const double sink = c.sink_at(h);
      if (!(c.row_empty(t) || sink == kInf || sink > 1e38)) continue;
      for (int64_t d = 0; d < s.Dv; ++d) {
        const double v = out[static_cast<size_t>((t * s.H + h) * s.Dv + d)];
        ASSERT_EQ(v, 0.0) << "out[" << t << ", " << h << ", " << d
                          << "] must be 0 (empty row or infinite sink)";
      }
    }
  }
}

class Sm90DsaForward : public ::testing::TestWithParam<Sm90DsaCase> {};

TEST_P(Sm90DsaForward, MatchesReference) {
  SA_SKIP_UNLESS_SM90();
  const Sm90DsaCase& p = GetParam();
  DsaHostCase c = make_dsa_host_case(p.shape, p.spec, SA_DTYPE_BF16, seed_of(0x5390d5a, p.name));
  // NaN in every kv row no active slot selects: the kernel must never read them.
  RecordProperty("poisoned_kv_rows", poison_unselected_kv_rows(c));

  Outputs want, got;
  ASSERT_NO_FATAL_FAILURE(run_reference(c, &want));
  ASSERT_NO_FATAL_FAILURE(run_gpu(c, SA_IMPL_SM90, SA_IMPL_SM90, &got));
  expect_matches(c, got, want);
}

INSTANTIATE_TEST_SUITE_P(Cases, Sm90DsaForward, ::testing::ValuesIn(sm90_dsa_cases()),
                         [](const ::testing::TestParamInfo<Sm90DsaCase>& info) {
                           return info.param.name;
                         });

// Until it has run on hardware, AUTO does not pick the sm90 forward.
TEST(Sm90DsaForwardDispatch, AutoKeepsThePortableForward) {
  SA_SKIP_UNLESS_SM90();
  DsaHostCase c = make_dsa_host_case(shape_of(4, 300, 64, 576, 96),
                                     spec_of(DsaLengths::kMixed, true, false, DsaSink::kFinite),
                                     SA_DTYPE_BF16, seed_of(0x5390d5a, "auto"));
  Outputs got;
  ASSERT_NO_FATAL_FAILURE(run_gpu(c, SA_IMPL_AUTO, SA_IMPL_PORTABLE, &got));
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
      {16, 576, SA_DTYPE_BF16, "H = 16"},
      {32, 512, SA_DTYPE_BF16, "H = 32"},
      {64, 576, SA_DTYPE_FP16, "dtype fp16"},
  };
  for (const Refusal& r : cases) {
    const int64_t Sq = 2, Skv = 4, topk = 2, Dv = 512;
    void *q = nullptr, *kv = nullptr, *idx = nullptr, *out = nullptr, *lse = nullptr;
    ASSERT_EQ(cudaMalloc(&q, Sq * r.H * r.Dqk * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&kv, Skv * r.Dqk * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&idx, Sq * topk * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&out, Sq * r.H * Dv * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&lse, Sq * r.H * 4), cudaSuccess);
    sa_dsa_fwd_args a{};
    a.q = view_of(q, r.dtype, {Sq, r.H, r.Dqk}, SA_DEVICE_CUDA);
    a.kv = view_of(kv, r.dtype, {Skv, r.Dqk}, SA_DEVICE_CUDA);
    a.topk_idx = view_of(idx, SA_DTYPE_INT32, {Sq, topk}, SA_DEVICE_CUDA);
    a.topk_length = sa_tensor_none();
    a.sink = sa_tensor_none();
    a.out = view_of(out, r.dtype, {Sq, r.H, Dv}, SA_DEVICE_CUDA);
    a.lse = view_of(lse, SA_DTYPE_FP32, {Sq, r.H}, SA_DEVICE_CUDA);
    a.options = sa_dsa_options_default();
    a.options.d_v = static_cast<int32_t>(Dv);
    a.options.impl = SA_IMPL_SM90;
    const sa_status st = sa_dsa_forward(&a, nullptr);
    const std::string message = sa_last_error();
    EXPECT_EQ(st, SA_ERROR_UNSUPPORTED) << message;
    EXPECT_NE(message.find(r.reason), std::string::npos)
        << "expected \"" << r.reason << "\" in: " << message;
    for (void* ptr : {q, kv, idx, out, lse}) (void)cudaFree(ptr);
  }
}

}  // namespace
}  // namespace sa_test

#endif  // SA_HAVE_SM90
