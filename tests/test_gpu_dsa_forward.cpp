// The portable DSA forward (src/portable/dsa_forward.cu) against the fp64 reference (SPEC 2).
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
#include <limits>
#include <string>
#include <vector>

#include "dsa_problem_builder.hpp"
#include "gpu_test_util.hpp"
#include "portable/dsa_forward.hpp"
#include "test_util.hpp"

namespace sa_test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- cases -----------------------------------------------------------------------------------
struct GpuDsaCase {
  std::string name;
  DsaShape shape;
  DsaMetaSpec spec;
  sa_dtype dtype = SA_DTYPE_BF16;
};

std::vector<GpuDsaCase> gpu_dsa_cases() {
  using L = DsaLengths;
  using S = DsaSink;
  const sa_dtype kFp16 = SA_DTYPE_FP16;
  return {
      {"H16_D576_K64_Plain", shape_of(8, 256, 16, 576, 64),
       spec_of(L::kNone, false, false, S::kNone)},
      {"H32_D512_K7_Lengths", shape_of(8, 64, 32, 512, 7),
       spec_of(L::kMixed, false, false, S::kFinite)},
      {"H64_D576_K100_LengthsInvalid", shape_of(8, 400, 64, 576, 100),
       spec_of(L::kMixed, true, false, S::kFinite)},
      {"H128_D576_K2048_Everything", shape_of(5, 5000, 128, 576, 2048),
       spec_of(L::kMixed, true, true, S::kMixed)},
      {"H128_D512_K2048_Plain", shape_of(4, 4096, 128, 512, 2048),
       spec_of(L::kNone, false, false, S::kNone)},
      {"H64_D512_K1_LengthsInvalid", shape_of(8, 50, 64, 512, 1),
       spec_of(L::kMixed, true, false, S::kNone)},
      {"H16_D576_K1_Plain", shape_of(6, 10, 16, 576, 1), spec_of(L::kNone, false, false, S::kNone)},
      {"H32_D576_K100_TopkAboveSkv", shape_of(8, 40, 32, 576, 100),
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
      {"H80_D576_K96_PartialHeadGroup", shape_of(6, 300, 80, 576, 96),
       spec_of(L::kMixed, true, false, S::kMixed)},
      {"H128_D576_K96_ManyTokens", shape_of(40, 1024, 128, 576, 96),
       spec_of(L::kMixed, true, false, S::kFinite)},
      {"H16_D512_K33_ManyTokens", shape_of(300, 512, 16, 512, 33),
       spec_of(L::kMixed, true, false, S::kFinite)},
      {"H64_D576_K100_Fp16", shape_of(8, 400, 64, 576, 100),
       spec_of(L::kMixed, true, true, S::kFinite), kFp16},
      {"H128_D512_K600_Fp16", shape_of(4, 1500, 128, 512, 600),
       spec_of(L::kMixed, true, false, S::kMixed), kFp16},
  };
}

// ---- runs ------------------------------------------------------------------------------------
enum class Variant { kPublicApi, kBlockN32, kBlockN64 };

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::kPublicApi: return "public_api";
    case Variant::kBlockN32: return "block_n_32";
    case Variant::kBlockN64: return "block_n_64";
  }
  return "?";
}

struct Outputs {
  HostTensor out, lse;
};

// The kernel on device copies of the case's inputs; out and lse start as NaN.
void run_gpu(const DsaHostCase& c, Variant variant, Outputs* result) {
  const DsaShape& s = c.shape;
  HostTensor out(c.dtype, {s.Sq, s.H, s.Dv}), lse(SA_DTYPE_FP32, {s.Sq, s.H});
  out.poison();
  lse.poison();
  DeviceBuffer q(c.q), kv(c.kv), idx(c.topk_idx), len(c.topk_length), sink(c.sink), d_out(out),
      d_lse(lse);
  for (const DeviceBuffer* b : {&q, &kv, &idx, &len, &sink, &d_out, &d_lse})
    ASSERT_TRUE(b->ok()) << "device allocation or copy failed";

  if (variant == Variant::kPublicApi) {
    sa_dsa_fwd_args a{};
    a.q = view_of(q.get(), c.dtype, {s.Sq, s.H, s.Dqk}, SA_DEVICE_CUDA);
    a.kv = view_of(kv.get(), c.dtype, {s.Skv, s.Dqk}, SA_DEVICE_CUDA);
    a.topk_idx = view_of(idx.get(), SA_DTYPE_INT32, {s.Sq, s.topk}, SA_DEVICE_CUDA);
    a.topk_length = c.has_length ? view_of(len.get(), SA_DTYPE_INT32, {s.Sq}, SA_DEVICE_CUDA)
                                 : sa_tensor_none();
    a.sink = c.has_sink ? view_of(sink.get(), SA_DTYPE_FP32, {s.H}, SA_DEVICE_CUDA)
                        : sa_tensor_none();
    a.out = view_of(d_out.get(), c.dtype, {s.Sq, s.H, s.Dv}, SA_DEVICE_CUDA);
    a.lse = view_of(d_lse.get(), SA_DTYPE_FP32, {s.Sq, s.H}, SA_DEVICE_CUDA);
    a.options = sa_dsa_options_default();
    a.options.scale = c.scale;
    a.options.d_v = static_cast<int32_t>(s.Dv);
    a.options.impl = SA_IMPL_PORTABLE;
    sa_context ctx = sa_context_default();
    sa_impl used = SA_IMPL_AUTO;
    ctx.impl_used = &used;
    ASSERT_EQ(sa_dsa_forward(&a, &ctx), SA_OK) << sa_last_error();
    ASSERT_EQ(used, SA_IMPL_PORTABLE);
  } else {
    DsaPointers ptr;
    ptr.q = q.get();
    ptr.kv = kv.get();
    ptr.topk_idx = static_cast<const int32_t*>(idx.get());
    ptr.topk_length = c.has_length ? static_cast<const int32_t*>(len.get()) : nullptr;
    ptr.sink = c.has_sink ? static_cast<const float*>(sink.get()) : nullptr;
    ptr.out = d_out.get();
    ptr.lse = static_cast<float*>(d_lse.get());
    const sa::DsaFwdProblem p = make_dsa_fwd_problem(s, c.dtype, c.scale, ptr, SA_DEVICE_CUDA, 0);
    sa::portable::DsaForwardTuning tuning;
    tuning.block_n = variant == Variant::kBlockN32 ? 32 : 64;
    try {
      sa::portable::dsa_forward(p, nullptr, tuning);
    } catch (const std::exception& e) {
      FAIL() << "dsa_forward threw: " << e.what();
    }
  }
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

void expect_matches(const DsaHostCase& c, const Outputs& got, const Outputs& want,
                    const char* what) {
  const DsaShape& s = c.shape;
  const std::vector<double> out = got.out.to_double(), lse = got.lse.to_double();
  const std::vector<double> ref_out = want.out.to_double(), ref_lse = want.lse.to_double();
  ASSERT_FALSE(any_nan(ref_out)) << "reference out holds NaN";
  EXPECT_FALSE(any_nan(out)) << what << ": NaN in out";
  EXPECT_FALSE(any_nan(lse)) << what << ": NaN in lse";

  double ref_norm = 0.0;
  for (double v : ref_out) ref_norm += v * v;
  if (ref_norm > 0.0) {
    const double err = rel_l2(out, ref_out);
    EXPECT_LT(err, 1e-2) << what << ": rel L2 of out";
    ::testing::Test::RecordProperty(std::string("rel_l2_") + what, std::to_string(err));
  }
  EXPECT_TRUE(all_close(lse, ref_lse, 1e-4, 0.0)) << what << ": lse";

  // Rows that must be exactly zero: empty rows, heads whose sink takes the whole softmax.
  for (int64_t t = 0; t < s.Sq; ++t) {
    for (int64_t h = 0; h < s.H; ++h) {
      const double sink = c.sink_at(h);
      if (!(c.row_empty(t) || sink == kInf || sink > 1e38)) continue;
      for (int64_t d = 0; d < s.Dv; ++d) {
        const double v = out[static_cast<size_t>((t * s.H + h) * s.Dv + d)];
        ASSERT_EQ(v, 0.0) << what << ": out[" << t << ", " << h << ", " << d
                          << "] must be 0 (empty row or infinite sink)";
      }
    }
  }
}

class DsaForwardGpu : public ::testing::TestWithParam<GpuDsaCase> {};

TEST_P(DsaForwardGpu, MatchesReference) {
  SA_SKIP_WITHOUT_GPU();
  const GpuDsaCase& p = GetParam();
  DsaHostCase c = make_dsa_host_case(p.shape, p.spec, p.dtype, seed_of(0xd5a, p.name));

  // NaN in every kv row no active slot selects: the kernel must never read them.
  RecordProperty("poisoned_kv_rows", poison_unselected_kv_rows(c));

  Outputs want;
  ASSERT_NO_FATAL_FAILURE(run_reference(c, &want));
  std::vector<Variant> variants = {Variant::kPublicApi, Variant::kBlockN32};
  if (device_smem_optin_at_least(sa::portable::dsa_forward_smem_bytes(64)))
    variants.push_back(Variant::kBlockN64);
  for (Variant v : variants) {
    SCOPED_TRACE(variant_name(v));
    Outputs got;
    ASSERT_NO_FATAL_FAILURE(run_gpu(c, v, &got));
    expect_matches(c, got, want, variant_name(v));
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, DsaForwardGpu, ::testing::ValuesIn(gpu_dsa_cases()),
                         [](const ::testing::TestParamInfo<GpuDsaCase>& info) {
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
      {8, 576, 512, SA_DTYPE_BF16, "H = 8"},
      {16, 576, 256, SA_DTYPE_BF16, "d_v = 256"},
      {16, 576, 512, SA_DTYPE_FP32, "dtype fp32"},
  };
  for (const Refusal& r : cases) {
    const int64_t Sq = 2, Skv = 4, topk = 2;
    const int64_t esize = r.dtype == SA_DTYPE_FP32 ? 4 : 2;
    void *q = nullptr, *kv = nullptr, *idx = nullptr, *out = nullptr, *lse = nullptr;
    ASSERT_EQ(cudaMalloc(&q, Sq * r.H * r.Dqk * esize), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&kv, Skv * r.Dqk * esize), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&idx, Sq * topk * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&out, Sq * r.H * r.Dv * esize), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&lse, Sq * r.H * 4), cudaSuccess);
    sa_dsa_fwd_args a{};
    a.q = view_of(q, r.dtype, {Sq, r.H, r.Dqk}, SA_DEVICE_CUDA);
    a.kv = view_of(kv, r.dtype, {Skv, r.Dqk}, SA_DEVICE_CUDA);
    a.topk_idx = view_of(idx, SA_DTYPE_INT32, {Sq, topk}, SA_DEVICE_CUDA);
    a.topk_length = sa_tensor_none();
    a.sink = sa_tensor_none();
    a.out = view_of(out, r.dtype, {Sq, r.H, r.Dv}, SA_DEVICE_CUDA);
    a.lse = view_of(lse, SA_DTYPE_FP32, {Sq, r.H}, SA_DEVICE_CUDA);
    a.options = sa_dsa_options_default();
    a.options.d_v = static_cast<int32_t>(r.Dv);
    a.options.impl = SA_IMPL_PORTABLE;
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
