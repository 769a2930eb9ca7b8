// The portable DSA backward (src/sm80/dsa_backward.cu) against the fp64 reference (SPEC 2).
//
// Each case is built on the host (dsa_problem_builder.hpp, with the sparse edge cases planted);
// kv rows that no active slot selects are overwritten with NaN. The CPU reference forward (public
// API, bf16 host tensors) gives the stored out (bf16) and lse that both backwards then use; the
// oracle is the reference backward through the public API on fp64 copies of the same values.
// The kernel runs through the public API (sa_dsa_backward, portable implementation forced,
// workspace from sa_dsa_backward_workspace_size) and, to cover both heads-per-CTA variants on any
// GPU that has them, through sa::portable::dsa_backward with block_m pinned to 32 and 64 (and,
// deterministic, with slices of 5 tokens: several slices, the last one short).
// dq, dkv and d_sink start as NaN.
// Pass: no NaN anywhere; rel L2 of dq and dkv < 1e-2; d_sink rel L2 over heads < 1e-2 (absolute
// 1e-4 where the reference is ~0); exactly 0 where 0 is structural: dq rows of empty rows or of
// heads whose sink takes the whole softmax (+inf, 2.4e38), dkv rows that no active slot of such a
// taking-part (row, head) selects, d_sink without a sink. A reference that is 0 only by
// cancellation (topk 1 without sink: P = 1, out == v, so dP - delta = 0 in fp64 but not in the
// kernel's fp32) is met per row within 1e-4 of the size of the cancelled terms instead.
// Deterministic cases also run 3 times and require bitwise-identical dq, dkv and d_sink.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "common/tuning.hpp"
#include "cuda/dsa_token_groups.hpp"
#include "dsa_problem_builder.hpp"
#include "gpu_test_util.hpp"
#include "sm80/dsa_backward.hpp"
#if SA_HAVE_SM90
#include "sm90/dsa_backward.hpp"
#endif
#include "test_util.hpp"

namespace sa_test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- cases -----------------------------------------------------------------------------------
struct GpuDsaBwdCase {
  std::string name;
  DsaShape shape;
  DsaMetaSpec spec;
  bool deterministic = false;
};

std::vector<GpuDsaBwdCase> gpu_dsa_bwd_cases() {
  using L = DsaLengths;
  using S = DsaSink;
  const bool kDet = true;
  return {
      {"H16_D576_K64_Plain", shape_of(8, 256, 16, 576, 64),
       spec_of(L::kNone, false, false, S::kNone)},
      {"H32_D512_K7_Lengths", shape_of(8, 64, 32, 512, 7),
       spec_of(L::kMixed, false, false, S::kFinite)},
      {"H64_D576_K100_LengthsInvalid", shape_of(8, 400, 64, 576, 100),
       spec_of(L::kMixed, true, false, S::kFinite)},
      {"H128_D576_K2048_Everything", shape_of(8, 5000, 128, 576, 2048),
       spec_of(L::kMixed, true, true, S::kMixed)},
      {"H128_D512_K2048_Plain", shape_of(8, 4096, 128, 512, 2048),
       spec_of(L::kNone, false, false, S::kNone)},
      {"H64_D512_K1_Lengths", shape_of(8, 50, 64, 512, 1),
       spec_of(L::kMixed, false, false, S::kFinite)},
      {"H64_D512_K1_LengthsInvalid", shape_of(8, 50, 64, 512, 1),
       spec_of(L::kMixed, true, false, S::kNone)},
      {"H16_D576_K1_Plain", shape_of(8, 10, 16, 576, 1), spec_of(L::kNone, false, false, S::kNone)},
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
      {"H128_D576_K160_SinkMixed", shape_of(8, 700, 128, 576, 160),
       spec_of(L::kMixed, true, true, S::kMixed)},
      {"H80_D576_K96_PartialHeadGroup", shape_of(8, 300, 80, 576, 96),
       spec_of(L::kMixed, true, false, S::kMixed)},
      // H 8 and 24 (multiples of 8, not 16): half-valid m16 tiles on the portable path.
      {"H8_D576_K64_Plain", shape_of(8, 256, 8, 576, 64),
       spec_of(L::kNone, false, false, S::kNone)},
      {"H8_D512_K100_LengthsInvalidSink", shape_of(300, 400, 8, 512, 100),
       spec_of(L::kMixed, true, true, S::kMixed)},
      {"H24_D576_K96_LengthsSink", shape_of(40, 300, 24, 576, 96),
       spec_of(L::kMixed, true, false, S::kFinite)},
      {"H8_D576_K64_Deterministic", shape_of(24, 200, 8, 576, 64),
       spec_of(L::kMixed, false, true, S::kFinite), kDet},
      {"H128_D576_K96_ManyTokens", shape_of(64, 1024, 128, 576, 96),
       spec_of(L::kMixed, true, false, S::kFinite)},
      {"H16_D512_K33_ManyTokens", shape_of(64, 512, 16, 512, 33),
       spec_of(L::kMixed, true, false, S::kFinite)},
      // More work items (tokens x head groups: 400) than an H200's 132 SMs: the Hopper kernel's
      // persistent CTAs walk several tokens each, some without an active slot (tokens 0, 1, 66,
      // 133: the first, second and third items of some CTAs).
      {"H128_D576_K130_PersistentItems", shape_of(200, 800, 128, 576, 130),
       spec_of(L::kMixed, true, true, S::kMixed)},
      // ~10 items per CTA of the Hopper kernel's dynamic schedule (topk_length): its two hand-off
      // slots wrap several times, and CTAs that draw short items take more of them.
      {"H64_D512_K16_LengthsDynamicManyItems", shape_of(1400, 600, 64, 512, 16),
       spec_of(L::kMixed, true, false, S::kFinite)},
      {"H128_D576_K300_Deterministic", shape_of(16, 900, 128, 576, 300),
       spec_of(L::kMixed, true, true, S::kMixed), kDet},
      {"H32_D512_K64_Deterministic", shape_of(24, 200, 32, 512, 64),
       spec_of(L::kNone, false, true, S::kFinite), kDet},
      {"H64_D576_K2048_Deterministic", shape_of(8, 3000, 64, 576, 2048),
       spec_of(L::kMixed, false, false, S::kFinite), kDet},
      {"H128_D512_K300_Deterministic", shape_of(16, 900, 128, 512, 300),
       spec_of(L::kMixed, true, true, S::kMixed), kDet},
      {"H128_D576_K96_DeterministicPersistentItems", shape_of(200, 600, 128, 576, 96),
       spec_of(L::kMixed, true, false, S::kFinite), kDet},
  };
}

// ---- runs ------------------------------------------------------------------------------------
enum class Variant {
  kPublicApi,
  kBlockM32,
  kBlockM64,
  kSlices5,
  kSm90,
  kAuto,
  kSm90Slices5,
  kSm90Padded,  // the Hopper backward with Tuning::sm90_dsa_bwd_groups = 0 (no token groups)
  // Deterministic, the Hopper backward's binned plan (Tuning::sm90_dsa_bwd_det_binned 1: the
  // binned form wherever the slot counts allow, every case here), and the same plan with its
  // int64 form forced (2)
  kSm90Binned,
  kSm90BinnedInt64
};

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::kPublicApi:
      return "public_api";
    case Variant::kBlockM32:
      return "block_m_32";
    case Variant::kBlockM64:
      return "block_m_64";
    case Variant::kSlices5:
      return "deterministic_slices_of_5_tokens";
    case Variant::kSm90:
      return "sm90_public_api";
    case Variant::kAuto:
      return "auto_public_api";
    case Variant::kSm90Slices5:
      return "sm90_slices_of_5_tokens";  // deterministic mode's, or token groups' slices
    case Variant::kSm90Padded:
      return "sm90_public_api_heads_padded";
    case Variant::kSm90Binned:
      return "sm90_public_api_binned";
    case Variant::kSm90BinnedInt64:
      return "sm90_public_api_binned_plan_int64_form";
  }
  return "?";
}

struct Inputs {
  HostTensor out, lse;  // the reference forward's (bf16 out, fp32 lse)
};

struct Grads {
  HostTensor dq, dkv, d_sink;
};

// The reference forward through the public API on the case's bf16 host tensors.
void run_reference_forward(DsaHostCase& c, Inputs* result) {
  run_dsa_reference_forward(c, c.q, c.kv, c.dtype, &result->out, &result->lse);
}

// The fp64 reference backward through the public API on fp64 copies of the same values.
void run_reference_backward(const DsaHostCase& c, const Inputs& in, Grads* result) {
  const DsaShape& s = c.shape;
  HostTensor q = to_fp64(c.q), kv = to_fp64(c.kv), out = to_fp64(in.out), dout = to_fp64(c.dout);
  HostTensor lse = in.lse, idx = c.topk_idx, len = c.topk_length, sink = c.sink;
  HostTensor dq(SA_DTYPE_FP64, {s.Sq, s.H, s.Dqk}), dkv(SA_DTYPE_FP64, {s.Skv, s.Dqk}),
      d_sink(SA_DTYPE_FP32, {s.H});
  dq.poison();
  dkv.poison();
  d_sink.poison();
  sa_dsa_bwd_args a = sa_dsa_bwd_args_default();
  a.q = q.view();
  a.kv = kv.view();
  a.topk_idx = idx.view();
  a.topk_length = c.has_length ? len.view() : sa_tensor_none();
  a.sink = c.has_sink ? sink.view() : sa_tensor_none();
  a.out = out.view();
  a.lse = lse.view();
  a.dout = dout.view();
  a.dq = dq.view();
  a.dkv = dkv.view();
  a.d_sink = d_sink.view();
  a.options = sa_dsa_options_default();
  a.options.scale = c.scale;
  a.options.d_v = static_cast<int32_t>(s.Dv);
  sa_context ctx = sa_context_default();
  sa_impl used = SA_IMPL_AUTO;
  ctx.impl_used = &used;
  ASSERT_EQ(sa_dsa_backward(&a, &ctx), SA_OK) << sa_last_error();
  ASSERT_EQ(used, SA_IMPL_REFERENCE);
  result->dq = std::move(dq);
  result->dkv = std::move(dkv);
  result->d_sink = std::move(d_sink);
}

// The kernel on device copies of the case's inputs; dq, dkv and d_sink start as NaN.
void run_gpu(const DsaHostCase& c, const Inputs& in, Variant variant, bool deterministic,
             Grads* result) {
  const DsaShape& s = c.shape;
  HostTensor dq(c.dtype, {s.Sq, s.H, s.Dqk}), dkv(c.dtype, {s.Skv, s.Dqk}),
      d_sink(SA_DTYPE_FP32, {s.H});
  dq.poison();
  dkv.poison();
  d_sink.poison();
  DeviceBuffer q(c.q), kv(c.kv), idx(c.topk_idx), len(c.topk_length), sink(c.sink), out(in.out),
      lse(in.lse), dout(c.dout), d_dq(dq), d_dkv(dkv), d_ds(d_sink);
  for (const DeviceBuffer* b :
       {&q, &kv, &idx, &len, &sink, &out, &lse, &dout, &d_dq, &d_dkv, &d_ds})
    ASSERT_TRUE(b->ok()) << "device allocation or copy failed";

  const bool binned = variant == Variant::kSm90Binned || variant == Variant::kSm90BinnedInt64;
  if (variant == Variant::kPublicApi || variant == Variant::kSm90 || variant == Variant::kAuto ||
      variant == Variant::kSm90Padded || binned) {
    // The implementation asked for, and the one that must run (AUTO: the Hopper backward on an
    // sm_90 device, except in deterministic mode below 64 heads where the portable kernels serve
    // H, a multiple of 8; else the portable one).
    const sa_impl impl = variant == Variant::kSm90 || variant == Variant::kSm90Padded || binned
                             ? SA_IMPL_SM90
                         : variant == Variant::kAuto ? SA_IMPL_AUTO
                                                     : SA_IMPL_PORTABLE;
    // kSm90Padded: one token per work item, heads padded to 64 (the kernel before token groups);
    // kSm90Binned*: deterministic mode's binned plan; around both the workspace query and the
    // call.
    sa::detail::Tuning padded = sa::detail::tuning();
    if (variant == Variant::kSm90Padded) padded.sm90_dsa_bwd_groups = 0;
    if (variant == Variant::kSm90Binned) padded.sm90_dsa_bwd_det_binned = 1;
    if (variant == Variant::kSm90BinnedInt64) padded.sm90_dsa_bwd_det_binned = 2;
    const sa::detail::ScopedTuning tune(padded);
    const sa_impl expect_used = impl != SA_IMPL_AUTO                      ? impl
                                : device_is_sm90() &&
                                          (!deterministic || s.H >= 64 || s.H % 8 != 0)
                                    ? SA_IMPL_SM90
                                    : SA_IMPL_PORTABLE;
    sa_dsa_bwd_args a = sa_dsa_bwd_args_default();
    a.q = view_of(q.get(), c.dtype, {s.Sq, s.H, s.Dqk}, SA_DEVICE_CUDA);
    a.kv = view_of(kv.get(), c.dtype, {s.Skv, s.Dqk}, SA_DEVICE_CUDA);
    a.topk_idx = view_of(idx.get(), SA_DTYPE_INT32, {s.Sq, s.topk}, SA_DEVICE_CUDA);
    a.topk_length = c.has_length ? view_of(len.get(), SA_DTYPE_INT32, {s.Sq}, SA_DEVICE_CUDA)
                                 : sa_tensor_none();
    a.sink =
        c.has_sink ? view_of(sink.get(), SA_DTYPE_FP32, {s.H}, SA_DEVICE_CUDA) : sa_tensor_none();
    a.out = view_of(out.get(), c.dtype, {s.Sq, s.H, s.Dv}, SA_DEVICE_CUDA);
    a.lse = view_of(lse.get(), SA_DTYPE_FP32, {s.Sq, s.H}, SA_DEVICE_CUDA);
    a.dout = view_of(dout.get(), c.dtype, {s.Sq, s.H, s.Dv}, SA_DEVICE_CUDA);
    a.dq = view_of(d_dq.get(), c.dtype, {s.Sq, s.H, s.Dqk}, SA_DEVICE_CUDA);
    a.dkv = view_of(d_dkv.get(), c.dtype, {s.Skv, s.Dqk}, SA_DEVICE_CUDA);
    a.d_sink = view_of(d_ds.get(), SA_DTYPE_FP32, {s.H}, SA_DEVICE_CUDA);
    a.options = sa_dsa_options_default();
    a.options.scale = c.scale;
    a.options.d_v = static_cast<int32_t>(s.Dv);
    a.options.deterministic = deterministic ? 1 : 0;
    a.options.impl = impl;
    size_t bytes = 0;
    ASSERT_EQ(sa_dsa_backward_workspace_size(&a, &bytes), SA_OK) << sa_last_error();
    DeviceBuffer workspace(bytes);
    ASSERT_TRUE(workspace.ok()) << "workspace allocation of " << bytes << " bytes failed";
    // Garbage first: the backward zeroes what it needs (the fp32 dkv, the Hopper item counter).
    ASSERT_EQ(cudaMemset(workspace.get(), 0x40, bytes), cudaSuccess);
    sa_context ctx = sa_context_default();
    ctx.workspace = workspace.get();
    ctx.workspace_bytes = bytes;
    sa_impl used = SA_IMPL_AUTO;
    ctx.impl_used = &used;
    ASSERT_EQ(sa_dsa_backward(&a, &ctx), SA_OK) << sa_last_error();
    ASSERT_EQ(used, expect_used) << "ran " << sa_impl_name(used);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  } else {
    DsaPointers ptr;
    ptr.q = q.get();
    ptr.kv = kv.get();
    ptr.topk_idx = static_cast<const int32_t*>(idx.get());
    ptr.topk_length = c.has_length ? static_cast<const int32_t*>(len.get()) : nullptr;
    ptr.sink = c.has_sink ? static_cast<const float*>(sink.get()) : nullptr;
    ptr.out = out.get();
    ptr.lse = static_cast<float*>(lse.get());
    ptr.dout = dout.get();
    ptr.dq = d_dq.get();
    ptr.dkv = d_dkv.get();
    ptr.d_sink = static_cast<float*>(d_ds.get());
    sa::DsaBwdProblem p = make_dsa_bwd_problem(s, c.dtype, c.scale, ptr, SA_DEVICE_CUDA, 0);
    p.options.deterministic = deterministic ? 1 : 0;
#if SA_HAVE_SM90
    if (variant == Variant::kSm90Slices5) {
      // The Hopper main kernel with deterministic mode's slices pinned to 5 tokens (tok_begin > 0),
      // or (token groups) its slices of groups to max(1, 5 / G).
      try {
        const size_t bytes = sa::sm90::dsa_backward_workspace_bytes(p, 5);
        DeviceBuffer workspace(bytes);
        ASSERT_TRUE(workspace.ok()) << "workspace allocation of " << bytes << " bytes failed";
        ASSERT_EQ(cudaMemset(workspace.get(), 0x40, bytes), cudaSuccess);
        sa::sm90::dsa_backward(p, workspace.get(), bytes, nullptr, 5);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
      } catch (const std::exception& e) {
        FAIL() << "sm90 dsa_backward threw: " << e.what();
      }
    } else
#endif
    {
      sa::portable::DsaBackwardTuning tuning;
      tuning.block_m = variant == Variant::kBlockM64 ? 64 : 32;
      if (variant == Variant::kSlices5) tuning.deterministic_slice_tokens = 5;
      try {
        const size_t bytes = sa::portable::dsa_backward_workspace_bytes(p, tuning);
        DeviceBuffer workspace(bytes);
        ASSERT_TRUE(workspace.ok()) << "workspace allocation of " << bytes << " bytes failed";
        sa::portable::dsa_backward(p, workspace.get(), bytes, nullptr, tuning);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess)
            << cudaGetErrorString(cudaGetLastError());
      } catch (const std::exception& e) {
        FAIL() << "dsa_backward threw: " << e.what();
      }
    }
  }
  ASSERT_TRUE(d_dq.download(dq));
  ASSERT_TRUE(d_dkv.download(dkv));
  ASSERT_TRUE(d_ds.download(d_sink));
  result->dq = std::move(dq);
  result->dkv = std::move(dkv);
  result->d_sink = std::move(d_sink);
}

// (t, h) takes part in the softmax: a non-empty row and a sink that does not take it whole (+inf,
// or huge enough that L overflows to +inf in fp32, like 2.4e38). Otherwise P = 0 exactly: its dq
// row is 0 and it adds exactly 0 to dkv, structurally.
bool takes_part(const DsaHostCase& c, int64_t t, int64_t h) {
  const double sink = c.sink_at(h);
  return !(c.row_empty(t) || sink == kInf || sink > 1e38);
}

// The size of the terms that cancel when the reference is 0 without being structurally 0, per dq
// row (t, h) and per dkv row j. With P <= 1, |dS_i| <= scale (sum_d |dO_d v_id| + sum_d |out_d
// dO_d|) = m_i, the bound of dP_i and delta (512-term sums) the kernel evaluates in fp32 (error
// <= 512 * 2^-24 = 3e-5 relative to these sums each). dq(t, h) = sum_i dS_i k_i: sum_i m_i ||k_i||;
// dkv_j = sum dS_i q_th + P_i dO_th over the slots i holding j: sum m_i ||q_th|| + ||dO_th||.
struct CancelledMagnitudes {
  std::vector<double> dq;   // [Sq * H]
  std::vector<double> dkv;  // [Skv]
};

CancelledMagnitudes cancelled_magnitudes(const DsaHostCase& c, const Inputs& in) {
  const DsaShape& s = c.shape;
  CancelledMagnitudes r;
  r.dq.assign(static_cast<size_t>(s.Sq * s.H), 0.0);
  r.dkv.assign(static_cast<size_t>(s.Skv), 0.0);
  auto row_norm = [](const HostTensor& x, int64_t base, int64_t n) {
    double a = 0.0;
    for (int64_t d = 0; d < n; ++d) a += x.get(base + d) * x.get(base + d);
    return std::sqrt(a);
  };
  for (int64_t t = 0; t < s.Sq; ++t) {
    for (int64_t h = 0; h < s.H; ++h) {
      if (!takes_part(c, t, h)) continue;
      const int64_t o = (t * s.H + h) * s.Dv;
      double od = 0.0;
      for (int64_t d = 0; d < s.Dv; ++d) od += std::fabs(in.out.get(o + d) * c.dout.get(o + d));
      const double q_norm = row_norm(c.q, (t * s.H + h) * s.Dqk, s.Dqk);
      const double do_norm = row_norm(c.dout, o, s.Dv);
      for (int64_t i = 0; i < s.topk; ++i) {
        if (!c.slot_active(t, i)) continue;
        const int64_t j = c.index(t, i);
        double dv = 0.0;
        for (int64_t d = 0; d < s.Dv; ++d)
          dv += std::fabs(c.dout.get(o + d) * c.kv.get(j * s.Dqk + d));
        const double m = static_cast<double>(c.scale) * (dv + od);
        r.dq[static_cast<size_t>(t * s.H + h)] += m * row_norm(c.kv, j * s.Dqk, s.Dqk);
        r.dkv[static_cast<size_t>(j)] += m * q_norm + do_norm;
      }
    }
  }
  return r;
}

void expect_matches(const DsaHostCase& c, const Inputs& in, const Grads& got, const Grads& want,
                    const char* what) {
  const DsaShape& s = c.shape;
  const std::vector<double> dq = got.dq.to_double(), dkv = got.dkv.to_double(),
                            ds = got.d_sink.to_double();
  const std::vector<double> ref_dq = want.dq.to_double(), ref_dkv = want.dkv.to_double(),
                            ref_ds = want.d_sink.to_double();
  ASSERT_FALSE(any_nan(ref_dq) || any_nan(ref_dkv) || any_nan(ref_ds)) << "reference holds NaN";
  EXPECT_FALSE(any_nan(dq)) << what << ": NaN in dq";
  EXPECT_FALSE(any_nan(dkv)) << what << ": NaN in dkv";
  EXPECT_FALSE(any_nan(ds)) << what << ": NaN in d_sink";

  // rel L2 where the reference is not zero. Where it is, exactly 0 is required only where 0 is
  // structural (checked below): a reference that is 0 by cancellation (topk 1 without sink: P = 1
  // and out == v, so dP - delta = 0 in fp64) is met per row within 1e-4 of the size of the
  // cancelled terms (~3x the worst-case fp32 error of the two 512-term sums; an unsubtracted delta
  // would be ~1e-2 of it).
  struct Named {
    const char* name;
    const std::vector<double>& a;
    const std::vector<double>& b;
    int64_t rows, cols;
  };
  const Named tensors[] = {Named{"dq", dq, ref_dq, s.Sq * s.H, s.Dqk},
                           Named{"dkv", dkv, ref_dkv, s.Skv, s.Dqk}};
  std::vector<double> mags[2];
  for (int k = 0; k < 2; ++k) {
    const Named& t = tensors[k];
    if (norm(t.b) > 0.0) {
      const double err = rel_l2(t.a, t.b);
      EXPECT_LT(err, 1e-2) << what << ": rel L2 of " << t.name;
      ::testing::Test::RecordProperty(std::string("rel_l2_") + t.name + "_" + what,
                                      std::to_string(err));
      continue;
    }
    if (mags[0].empty()) {
      CancelledMagnitudes m = cancelled_magnitudes(c, in);
      mags[0] = std::move(m.dq);
      mags[1] = std::move(m.dkv);
    }
    for (int64_t r = 0; r < t.rows; ++r) {
      double err = 0.0;
      for (int64_t d = 0; d < t.cols; ++d) {
        const size_t at = static_cast<size_t>(r * t.cols + d);
        err += (t.a[at] - t.b[at]) * (t.a[at] - t.b[at]);
      }
      err = std::sqrt(err);
      const double bound = 1e-4 * mags[k][static_cast<size_t>(r)];
      if (!(err <= bound)) {
        ADD_FAILURE() << what << ": " << t.name << " row " << r << " off the reference (0 by "
                      << "cancellation) by " << err << " > " << bound
                      << " (1e-4 of the cancelled terms)";
        break;
      }
    }
  }
  if (norm(ref_ds) > 1e-3) {
    EXPECT_LT(rel_l2(ds, ref_ds), 1e-2) << what << ": rel L2 of d_sink";
  } else {
    EXPECT_TRUE(all_close(ds, ref_ds, 1e-4, 0.0)) << what << ": d_sink";
  }
  if (!c.has_sink) {
    for (int64_t h = 0; h < s.H; ++h)
      ASSERT_EQ(ds[static_cast<size_t>(h)], 0.0) << what << ": d_sink[" << h << "] without sink";
  }

  // dkv rows that no active slot of a taking-part (row, head) selects (unselected rows among them).
  std::vector<bool> fed(static_cast<size_t>(s.Skv), false);
  for (int64_t t = 0; t < s.Sq; ++t) {
    bool part = false;
    for (int64_t h = 0; h < s.H && !part; ++h) part = takes_part(c, t, h);
    if (!part) continue;
    for (int64_t i = 0; i < s.topk; ++i)
      if (c.slot_active(t, i)) fed[static_cast<size_t>(c.index(t, i))] = true;
  }
  for (int64_t j = 0; j < s.Skv; ++j) {
    if (fed[static_cast<size_t>(j)]) continue;
    for (int64_t d = 0; d < s.Dqk; ++d)
      ASSERT_EQ(dkv[static_cast<size_t>(j * s.Dqk + d)], 0.0)
          << what << ": dkv[" << j << ", " << d
          << "] must be 0 (no active slot of a taking-part row selects it)";
  }
  // dq rows of empty rows and of heads whose sink takes the whole softmax.
  for (int64_t t = 0; t < s.Sq; ++t) {
    for (int64_t h = 0; h < s.H; ++h) {
      if (takes_part(c, t, h)) continue;
      for (int64_t d = 0; d < s.Dqk; ++d)
        ASSERT_EQ(dq[static_cast<size_t>((t * s.H + h) * s.Dqk + d)], 0.0)
            << what << ": dq[" << t << ", " << h << ", " << d
            << "] must be 0 (empty row or infinite sink)";
    }
  }
}

// Changes to a built case before the reference forward (case) and after it (its out and lse).
using CaseTweak = std::function<void(DsaHostCase&)>;
using InputsTweak = std::function<void(DsaHostCase&, Inputs&)>;

// Case `p` through each of `variants` against the fp64 reference; deterministic cases also run
// each variant 3 times and must give the same bits.
void expect_case_matches(const GpuDsaBwdCase& p, const std::vector<Variant>& variants,
                         const CaseTweak& before = {}, const InputsTweak& after = {}) {
  DsaHostCase c = make_dsa_host_case(p.shape, p.spec, SA_DTYPE_BF16, seed_of(0xdb5a, p.name));
  if (before) before(c);

  // NaN in every kv row no active slot selects: the kernel must never read them.
  ::testing::Test::RecordProperty("poisoned_kv_rows", poison_unselected_kv_rows(c));

  Inputs in;
  ASSERT_NO_FATAL_FAILURE(run_reference_forward(c, &in));
  if (after) after(c, in);
  Grads want;
  ASSERT_NO_FATAL_FAILURE(run_reference_backward(c, in, &want));
  for (Variant v : variants) {
    SCOPED_TRACE(variant_name(v));
    Grads got;
    ASSERT_NO_FATAL_FAILURE(run_gpu(c, in, v, p.deterministic, &got));
    expect_matches(c, in, got, want, variant_name(v));
    if (!p.deterministic) continue;
    // Deterministic mode: the same bits on every run.
    for (int run = 1; run < 3; ++run) {
      Grads again;
      ASSERT_NO_FATAL_FAILURE(run_gpu(c, in, v, true, &again));
      EXPECT_TRUE(bitwise_equal(again.dkv, got.dkv)) << "dkv differs on run " << run + 1;
      EXPECT_TRUE(bitwise_equal(again.d_sink, got.d_sink)) << "d_sink differs on run " << run + 1;
      EXPECT_TRUE(bitwise_equal(again.dq, got.dq)) << "dq differs on run " << run + 1;
    }
  }
}

class DsaBackwardGpu : public ::testing::TestWithParam<GpuDsaBwdCase> {};

TEST_P(DsaBackwardGpu, MatchesReference) {
  SA_SKIP_WITHOUT_GPU();
  const GpuDsaBwdCase& p = GetParam();
  std::vector<Variant> variants = {Variant::kPublicApi, Variant::kBlockM32};
  if (device_smem_optin_at_least(
          sa::portable::dsa_backward_smem_bytes(static_cast<int>(p.shape.Dqk), 64)))
    variants.push_back(Variant::kBlockM64);
  if (p.deterministic) variants.push_back(Variant::kSlices5);
  expect_case_matches(p, variants);
}

INSTANTIATE_TEST_SUITE_P(Cases, DsaBackwardGpu, ::testing::ValuesIn(gpu_dsa_bwd_cases()),
                         [](const ::testing::TestParamInfo<GpuDsaBwdCase>& info) {
                           return info.param.name;
                         });

// The Hopper backward (src/sm90/dsa_backward.cu), options.impl forced, on every case (any H: the
// last group of 64 heads is padded) and on token-group cases; same inputs, oracle and checks;
// deterministic cases also run 3 times and must give the same bits. H 8, 16 and 32 run with
// token groups (the default: G = 64 / H tokens per work item over the union of their keys) and
// without (Tuning::sm90_dsa_bwd_groups = 0: heads padded). Skips unless the device is sm_90.
class Sm90DsaBackward : public ::testing::TestWithParam<GpuDsaBwdCase> {};

TEST_P(Sm90DsaBackward, MatchesReference) {
  SA_SKIP_WITHOUT_GPU();
  SA_SKIP_UNLESS_SM90();
  const GpuDsaBwdCase& p = GetParam();
  std::vector<Variant> variants = {Variant::kSm90};
  if (p.deterministic) {
    variants.push_back(Variant::kSm90Slices5);
    variants.push_back(Variant::kSm90Binned);
    variants.push_back(Variant::kSm90BinnedInt64);
  }
  if (!p.deterministic && sa::portable::dsa_bwd::group_tokens(p.shape.H) > 0) {
    variants.push_back(Variant::kSm90Padded);
    variants.push_back(Variant::kSm90Slices5);  // token groups in slices of max(1, 5 / G) groups
  }
  expect_case_matches(p, variants);
}

std::vector<GpuDsaBwdCase> sm90_dsa_bwd_cases() {
  using L = DsaLengths;
  using S = DsaSink;
  std::vector<GpuDsaBwdCase> out = gpu_dsa_bwd_cases();
  // Token groups (H 8 / 16 / 32: G = 8 / 4 / 2 tokens per work item). S_q not a multiple of G
  // (the last group partial), empty rows and a first group of empty rows only (topk_length 0
  // and -3 on rows 0, 1), topk_length past topk, invalid indices, a last row of invalid indices
  // only, duplicates; high overlap (S_kv near topk: most keys shared by the group's tokens) and
  // low overlap (S_kv 50,000: the builder's windows, unions near G topk).
  out.push_back({"H32_D576_K64_GroupsOddTokensEverything", shape_of(7, 300, 32, 576, 64),
                 spec_of(L::kMixed, true, true, S::kMixed)});
  out.push_back({"H16_D576_K96_GroupsPartialLastGroup", shape_of(13, 400, 16, 576, 96),
                 spec_of(L::kMixed, true, true, S::kFinite)});
  out.push_back({"H8_D512_K40_GroupsHighOverlap", shape_of(21, 48, 8, 512, 40),
                 spec_of(L::kMixed, false, false, S::kFinite)});
  out.push_back({"H16_D512_K64_GroupsHighOverlapDuplicates", shape_of(30, 70, 16, 512, 64),
                 spec_of(L::kNone, false, true, S::kNone)});
  // Keys repeated 16 times and more in a row (S_kv 4, topk 96, drawn with replacement): a
  // multiplicity past a 4-bit field splits over several entries of the union.
  out.push_back({"H8_D576_K96_GroupsMultiplicityOver15", shape_of(11, 4, 8, 576, 96),
                 spec_of(L::kNone, false, true, S::kFinite)});
  out.push_back({"H32_D576_K96_GroupsMultiplicityOver15", shape_of(5, 3, 32, 576, 96),
                 spec_of(L::kMixed, true, true, S::kMixed)});
  out.push_back({"H16_D576_K2048_GroupsLowOverlap", shape_of(10, 50000, 16, 576, 2048),
                 spec_of(L::kNone, false, false, S::kFinite)});
  out.push_back({"H32_D576_K2048_GroupsHalfDensity", shape_of(9, 4096, 32, 576, 2048),
                 spec_of(L::kMixed, true, false, S::kFinite)});
  // More groups (500) than SMs, of different union lengths: the dynamic item counter.
  out.push_back({"H32_D512_K48_GroupsManyItems", shape_of(1000, 600, 32, 512, 48),
                 spec_of(L::kMixed, true, false, S::kMixed)});
  out.push_back({"H8_D576_K33_GroupsManyItems", shape_of(2001, 900, 8, 576, 33),
                 spec_of(L::kNone, true, true, S::kFinite)});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cases, Sm90DsaBackward, ::testing::ValuesIn(sm90_dsa_bwd_cases()),
                         [](const ::testing::TestParamInfo<GpuDsaBwdCase>& info) {
                           return info.param.name;
                         });

// The Hopper kernel's variants (Tuning::sm90_dsa_bwd_bits, bench/notes-archive: 1 late K release,
// 2 per-row index loads), on four cases (one with several work items per persistent CTA): the
// same results. The cases are picked by name; a renamed case fails the count (on any machine).
const char* const kTunedCaseNames[] = {"H64_D576_K100_LengthsInvalid", "H128_D512_K2048_Plain",
                                       "H128_D576_K160_SinkMixed",
                                       "H128_D576_K130_PersistentItems"};

std::vector<GpuDsaBwdCase> tuned_variant_cases() {
  std::vector<GpuDsaBwdCase> out;
  for (const GpuDsaBwdCase& p : gpu_dsa_bwd_cases())
    for (const char* name : kTunedCaseNames)
      if (p.name == name) out.push_back(p);
  return out;
}

TEST(Sm90DsaBackwardTunedCases, EveryNamedCaseExists) {
  EXPECT_EQ(tuned_variant_cases().size(), std::size(kTunedCaseNames));
}

TEST(Sm90DsaBackwardTuned, MatchesReference) {
  SA_SKIP_WITHOUT_GPU();
  SA_SKIP_UNLESS_SM90();
  const std::vector<GpuDsaBwdCase> cases = tuned_variant_cases();
  ASSERT_EQ(cases.size(), std::size(kTunedCaseNames));
  sa::detail::Tuning t;
  t.sm90_dsa_bwd_bits = 3;  // bits 1 and 2 together
  const sa::detail::ScopedTuning tune(t);
  for (const GpuDsaBwdCase& p : cases) {
    SCOPED_TRACE(p.name + " tune 3");
    ASSERT_NO_FATAL_FAILURE(expect_case_matches(p, {Variant::kSm90}));
  }
}

// Token groups with Tuning::sm90_dsa_bwd_bits 5 (4: every item walks its union from the first
// key instead of a rotated start; 1: the late K release): the same results on three group cases.
TEST(Sm90DsaBackwardTuned, TokenGroupsInOrderMatchReference) {
  SA_SKIP_WITHOUT_GPU();
  SA_SKIP_UNLESS_SM90();
  const char* const names[] = {"H32_D576_K64_GroupsOddTokensEverything",
                               "H8_D576_K96_GroupsMultiplicityOver15",
                               "H32_D512_K48_GroupsManyItems"};
  sa::detail::Tuning t;
  t.sm90_dsa_bwd_bits = 5;
  const sa::detail::ScopedTuning tune(t);
  int found = 0;
  for (const GpuDsaBwdCase& p : sm90_dsa_bwd_cases()) {
    for (const char* name : names) {
      if (p.name != name) continue;
      ++found;
      SCOPED_TRACE(p.name + " tune 5");
      ASSERT_NO_FATAL_FAILURE(expect_case_matches(p, {Variant::kSm90}));
    }
  }
  EXPECT_EQ(found, static_cast<int>(std::size(names)));
}

// Deterministic mode's fixed point (cuda/dsa_fixed_point.cuh) where the scale's estimate misses
// its window, so that the second pass runs: (a) a huge dout on an empty row (the estimate sees
// it, no value does: s0 far too small for the values), (b) an out of 10^6 times kv's size on one
// token (delta, hence dS', beyond the estimate's premise: the values overflow s0's range); and
// gradients scaled by 2^-120 and 2^60 (s near both ends of its clamp). Each against the fp64
// reference, three runs bitwise equal. The same in the binned plan (cuda/dsa_binned_fixed.cuh),
// whose bound retries on both: (a) max_x below the last bin's lower edge B 2^-48, (b) max_x >= B;
// and with its int64 form forced; plus dout scaled per token, so that a key's segments fall in
// many bins.
const std::vector<Variant> kFixedPointVariants = {Variant::kSm90, Variant::kSm90Binned,
                                                  Variant::kSm90BinnedInt64};

TEST(Sm90DsaBackwardFixedPoint, ScaleExtremesAndRetriesMatchReference) {
  SA_SKIP_WITHOUT_GPU();
  SA_SKIP_UNLESS_SM90();
  const GpuDsaBwdCase p{"FixedPoint", shape_of(9, 300, 64, 576, 80),
                        spec_of(DsaLengths::kMixed, true, true, DsaSink::kFinite), true};
  const std::vector<Variant>& variants = kFixedPointVariants;
  const int64_t H = p.shape.H, Dv = p.shape.Dv;
  auto scale_dout = [](double f) {
    return [f](DsaHostCase& c) {
      for (int64_t e = 0; e < c.dout.numel(); ++e) c.dout.set(e, c.dout.get(e) * f);
    };
  };
  {
    SCOPED_TRACE("huge dout on an empty row");
    expect_case_matches(p, variants, [&](DsaHostCase& c) {
      c.topk_length.i32()[0] = 0;
      for (int64_t e = 0; e < H * Dv; ++e) c.dout.set(e, 1e30);
    });
  }
  {
    SCOPED_TRACE("out 1e6 times larger on token 1");
    expect_case_matches(p, variants, {}, [&](DsaHostCase&, Inputs& in) {
      for (int64_t e = H * Dv; e < 2 * H * Dv; ++e) in.out.set(e, in.out.get(e) * 1e6);
    });
  }
  for (double f : {std::ldexp(1.0, -120), std::ldexp(1.0, 60)}) {
    SCOPED_TRACE("dout times " + std::to_string(f));
    expect_case_matches(p, variants, scale_dout(f));
  }
  {
    // Token t's dout times 2^-5t: a key's segments spread over most of the bins.
    SCOPED_TRACE("dout times 2^-5t");
    expect_case_matches(p, variants, [&](DsaHostCase& c) {
      for (int64_t e = 0; e < c.dout.numel(); ++e)
        c.dout.set(e, std::ldexp(c.dout.get(e), -5 * static_cast<int>(e / (H * Dv))));
    });
  }
}

// The NaN-rows check below for one variant: two runs, bitwise equal, NaN exactly where the
// reference has it.
void expect_nan_rows_match(const DsaHostCase& c, const Inputs& in, const Grads& want,
                           Variant variant) {
  const DsaShape& shape = c.shape;
  Grads got, again;
  ASSERT_NO_FATAL_FAILURE(run_gpu(c, in, variant, true, &got));
  ASSERT_NO_FATAL_FAILURE(run_gpu(c, in, variant, true, &again));
  EXPECT_TRUE(bitwise_equal(again.dkv, got.dkv));
  const std::vector<double> a = got.dkv.to_double(), b = want.dkv.to_double();
  int64_t nan_rows = 0;
  std::vector<double> fa, fb;
  for (int64_t j = 0; j < shape.Skv; ++j) {
    bool ref_nan_row = true;
    for (int64_t d = 0; d < shape.Dqk; ++d) ref_nan_row &= std::isnan(b[j * shape.Dqk + d]);
    nan_rows += ref_nan_row ? 1 : 0;
    for (int64_t d = 0; d < shape.Dqk; ++d) {
      const size_t at = static_cast<size_t>(j * shape.Dqk + d);
      ASSERT_EQ(std::isnan(a[at]), std::isnan(b[at])) << "dkv[" << j << ", " << d << "]";
      if (!std::isnan(a[at])) {
        fa.push_back(a[at]);
        fb.push_back(b[at]);
      }
    }
  }
  EXPECT_GT(nan_rows, 0);
  EXPECT_LT(rel_l2(fa, fb), 1e-2);
}

// Deterministic mode's NaN rows: a NaN in q (token 1, head 3) reaches every dkv row that token
// selected, and those rows are NaN in every column in the reference as in the fixed-point mode
// (and in both forms of the binned plan); every other element is finite and matches; two runs
// bitwise equal (NaN bits included).
TEST(Sm90DsaBackwardFixedPoint, NaNInQMarksExactlyTheReferenceRows) {
  SA_SKIP_WITHOUT_GPU();
  SA_SKIP_UNLESS_SM90();
  const DsaShape shape = shape_of(6, 200, 64, 576, 48);
  DsaHostCase c = make_dsa_host_case(shape, spec_of(DsaLengths::kNone, false, false, DsaSink::kNone),
                                     SA_DTYPE_BF16, seed_of(0xdb5a, "FixedPointNaN"));
  poison_unselected_kv_rows(c);
  Inputs in;
  ASSERT_NO_FATAL_FAILURE(run_reference_forward(c, &in));
  c.q.set((1 * shape.H + 3) * shape.Dqk + 17, std::numeric_limits<double>::quiet_NaN());
  Grads want;
  ASSERT_NO_FATAL_FAILURE(run_reference_backward(c, in, &want));
  for (Variant v : kFixedPointVariants) {
    SCOPED_TRACE(variant_name(v));
    ASSERT_NO_FATAL_FAILURE(expect_nan_rows_match(c, in, want, v));
  }
}

// AUTO picks the Hopper backward on an sm_90 device, and the portable one in deterministic mode
// below 64 heads (expect_case_matches checks impl_used).
TEST(Sm90DsaBackwardDispatch, AutoPicksTheHopperBackwardExceptDeterministicBelow64Heads) {
  SA_SKIP_WITHOUT_GPU();
  SA_SKIP_UNLESS_SM90();
  for (int64_t H : {int64_t{64}, int64_t{32}, int64_t{8}}) {
    for (bool deterministic : {false, true}) {
      const GpuDsaBwdCase p{"Auto", shape_of(4, 300, H, 576, 64),
                            spec_of(DsaLengths::kMixed, true, false, DsaSink::kFinite),
                            deterministic};
      SCOPED_TRACE(std::string(deterministic ? "deterministic" : "default") + ", H " +
                   std::to_string(H));
      expect_case_matches(p, {Variant::kAuto});
    }
  }
}

// Shapes the portable backward does not serve are refused by name when it is forced.
// The same for the Hopper backward (on an sm_90 device): the shapes and modes it leaves to the
// portable one.
TEST(DsaBackwardGpuRefusals, UnsupportedShapesNameTheReason) {
  SA_SKIP_WITHOUT_GPU();
  struct Refusal {
    int64_t H, Dqk, Dv;
    sa_dtype dtype;
    const char* reason;
    sa_impl impl = SA_IMPL_PORTABLE;
    bool deterministic = false;
  };
  const Refusal cases[] = {
      {16, 128, 128, SA_DTYPE_BF16, "D_qk = 128"},
      {12, 576, 512, SA_DTYPE_BF16, "H = 12"},
      {16, 576, 256, SA_DTYPE_BF16, "d_v = 256"},
      {16, 576, 512, SA_DTYPE_FP16, "dtype fp16"},
      {16, 128, 128, SA_DTYPE_BF16, "D_qk = 128", SA_IMPL_SM90},
      {8, 576, 512, SA_DTYPE_FP16, "dtype fp16", SA_IMPL_SM90, true},
  };
  for (const Refusal& r : cases) {
    if (r.impl == SA_IMPL_SM90 && !device_is_sm90()) continue;
    const int64_t Sq = 2, Skv = 4, topk = 2, esize = 2;
    void *q = nullptr, *kv = nullptr, *idx = nullptr, *out = nullptr, *lse = nullptr,
         *dout = nullptr, *dq = nullptr, *dkv = nullptr;
    ASSERT_EQ(cudaMalloc(&q, Sq * r.H * r.Dqk * esize), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&kv, Skv * r.Dqk * esize), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&idx, Sq * topk * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&out, Sq * r.H * r.Dv * esize), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&lse, Sq * r.H * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dout, Sq * r.H * r.Dv * esize), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dq, Sq * r.H * r.Dqk * esize), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dkv, Skv * r.Dqk * esize), cudaSuccess);
    sa_dsa_bwd_args a = sa_dsa_bwd_args_default();
    a.q = view_of(q, r.dtype, {Sq, r.H, r.Dqk}, SA_DEVICE_CUDA);
    a.kv = view_of(kv, r.dtype, {Skv, r.Dqk}, SA_DEVICE_CUDA);
    a.topk_idx = view_of(idx, SA_DTYPE_INT32, {Sq, topk}, SA_DEVICE_CUDA);
    a.topk_length = sa_tensor_none();
    a.sink = sa_tensor_none();
    a.out = view_of(out, r.dtype, {Sq, r.H, r.Dv}, SA_DEVICE_CUDA);
    a.lse = view_of(lse, SA_DTYPE_FP32, {Sq, r.H}, SA_DEVICE_CUDA);
    a.dout = view_of(dout, r.dtype, {Sq, r.H, r.Dv}, SA_DEVICE_CUDA);
    a.dq = view_of(dq, r.dtype, {Sq, r.H, r.Dqk}, SA_DEVICE_CUDA);
    a.dkv = view_of(dkv, r.dtype, {Skv, r.Dqk}, SA_DEVICE_CUDA);
    a.d_sink = sa_tensor_none();
    a.options = sa_dsa_options_default();
    a.options.d_v = static_cast<int32_t>(r.Dv);
    a.options.impl = r.impl;
    a.options.deterministic = r.deterministic ? 1 : 0;
    const sa_status st = sa_dsa_backward(&a, nullptr);
    const std::string message = sa_last_error();
    EXPECT_EQ(st, SA_ERROR_UNSUPPORTED) << message;
    EXPECT_NE(message.find(r.reason), std::string::npos)
        << "expected \"" << r.reason << "\" in: " << message;
    for (void* ptr : {q, kv, idx, out, lse, dout, dq, dkv}) (void)cudaFree(ptr);
  }
}

}  // namespace
}  // namespace sa_test
