// The indexer KL loss and its gradients, sparse and dense mode (the shared driver
// src/cuda/indexer_loss_driver.cu with the portable target, src/sm80/indexer_loss.cu, and with the
// Hopper target, src/sm90/indexer_loss.cu), against the fp64 reference (SPEC 5). The portable
// suites (names contain "IndexerGpu") force options.impl = SA_IMPL_PORTABLE except
// IndexerGpuAuto's (AUTO must pick the portable kernels, or the Hopper ones on sm_90); the Hopper
// suites (names contain "IndexerSm90Loss", skipped without an sm_90 device and the sm90 path)
// force SA_IMPL_SM90 on the same cases plus a few for the Hopper target's work split (three and
// five head groups: a CTA's second group absent), and check that two runs give bitwise the same
// loss, loss_per_token, dq_I and dw. Every call checks which implementation ran.
//
// Each case: bf16 q_I, k_I, q, kv, fp32 w and lse (a few heads at +inf, row 2 entirely: no target
// mass); sparse mode with top-k metadata drawn from each row's range with SPEC 2's edge cases
// planted (-1, S_kv, a repeated key, a key outside the range; lengths topk, 0, -2, past topk,
// topk - 1 in turn), dense mode over the ranges (causal, packed, empty, clamped).
// Device tensors have rows 8 elements wider and NaN guards; every output starts as NaN; the
// workspace starts as garbage. The oracle is the reference through the public API on fp64 copies
// of the same values.
// Pass: no NaN; loss within 1e-4 relative (of the sum of |per-token terms|) and per-token terms
// within 1e-4 of the largest; rel L2 of dq_I, dk_I, dw < 1e-2; exactly 0 where 0 is structural:
// dq_I and dw rows of empty rows (empty K_t or no target mass), dk_I rows of keys that no slot of
// a non-empty row's K_t selects. Deterministic cases: 3 runs, bitwise identical loss, per-token
// terms, dq_I, dk_I and dw.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
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

struct LossCase {
  std::string name;
  IndexerShape shape;  // DI 128
  IndexerRanges ranges = IndexerRanges::kNone;
  int64_t topk = 0;
  bool with_length = true;
  bool deterministic = false;
  bool grads = true;
  float coeff = 1.f;
  float scale_I = 0.f;
  bool dense = false;  // no topk_idx: K_t is the range
  sa_impl impl = SA_IMPL_PORTABLE;  // the options' impl
  double lse_shift = 0.0;  // nats added to every finite lse (the same p: the target's range)
};

// Every finite lse of c moved by d nats: A scales by e^-d and p does not change.
void shift_lse(IndexerCase& c, double d) {
  if (d == 0.0) return;
  for (int64_t i = 0; i < c.lse.numel(); ++i) {
    const double v = c.lse.get(i);
    if (std::isfinite(v)) c.lse.set(i, v + d);
  }
}

// The implementation that must serve lc: the forced one; AUTO: sm90 on an sm_90 device when the
// library has the sm90 path, else portable.
sa_impl expected_impl(const LossCase& lc) {
  if (lc.impl != SA_IMPL_AUTO) return lc.impl;
  return SA_HAVE_SM90 && device_is_sm90() ? SA_IMPL_SM90 : SA_IMPL_PORTABLE;
}

void PrintTo(const LossCase& c, std::ostream* os) { *os << c.name; }

IndexerShape loss_shape(int64_t Sq, int64_t Skv, int64_t HI, int64_t H, int64_t Dqk) {
  IndexerShape s = indexer_shape(Sq, Skv, HI);
  s.H = H;
  s.Dqk = Dqk;
  return s;
}

uint64_t loss_seed(const std::string& name) {
  uint64_t seed = 0x10552;
  for (char ch : name) seed = seed * 131 + static_cast<uint64_t>(ch);
  return seed;
}

// Top-k metadata: keys drawn from each row's range (anywhere for an empty range), then the
// edge cases (topk >= 5): slot 0 = -1, slot 1 = S_kv, slot 3 = slot 2, slot 4 outside the range.
// Lengths topk, 0, -2, topk + 4, topk - 1 in turn.
void make_meta(const IndexerCase& c, int64_t topk, uint64_t seed, HostTensor* idx,
               HostTensor* len) {
  std::mt19937_64 rng(seed);
  const IndexerShape& d = c.shape;
  *idx = HostTensor(SA_DTYPE_INT32, {d.Sq, topk});
  *len = HostTensor(SA_DTYPE_INT32, {d.Sq});
  for (int64_t t = 0; t < d.Sq; ++t) {
    const bool empty = c.end(t) <= c.begin(t);
    std::uniform_int_distribution<int64_t> key(empty ? 0 : c.begin(t),
                                               empty ? d.Skv - 1 : c.end(t) - 1);
    int32_t* row = idx->i32() + t * topk;
    for (int64_t i = 0; i < topk; ++i) row[i] = static_cast<int32_t>(key(rng));
    if (topk >= 5) {
      row[0] = -1;
      row[1] = static_cast<int32_t>(d.Skv);
      row[3] = row[2];
      row[4] = static_cast<int32_t>(c.end(t) < d.Skv ? c.end(t) : c.begin(t) - 1);
    }
    const int32_t lens[5] = {static_cast<int32_t>(topk), 0, -2, static_cast<int32_t>(topk + 4),
                             static_cast<int32_t>(topk - 1)};
    len->i32()[t] = lens[t % 5];
  }
}

// K_t of row t (SPEC 5), written without IndexerMeta; dense mode: the range.
std::vector<int64_t> loss_keys(const IndexerCase& c, const HostTensor& idx, const HostTensor* len,
                               int64_t t, bool dense) {
  std::vector<int64_t> range;
  for (int64_t s = c.begin(t); s < c.end(t); ++s) range.push_back(s);
  if (dense) return range;
  const int64_t topk = idx.shape()[1];
  const int64_t n = len ? std::min<int64_t>(len->i32()[t], topk) : topk;
  std::vector<int64_t> keys;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = idx.i32()[t * topk + i];
    if (s >= 0 && s < c.shape.Skv && c.in_range(t, s)) keys.push_back(s);
  }
  return keys;
}

bool row_has_mass(const IndexerCase& c, int64_t t) {
  for (int64_t h = 0; h < c.shape.H; ++h)
    if (std::isfinite(c.lse.get(t * c.shape.H + h))) return true;
  return false;
}

struct LossOutputs {
  HostTensor loss, per_token, dq_I, dk_I, dw;
};

// The GPU: device copies, outputs poisoned, the queried workspace full of garbage.
struct LossDevice {
  GpuIndexerInputs in;
  DeviceTensor q, kv, lse, idx, len, loss, per_token, dq_I, dk_I, dw;
  LossDevice(const IndexerCase& c, const HostTensor& idx_h, const HostTensor& len_h,
             const LossOutputs& shapes)
      : in(c, 8), q(c.q, 8, 0), kv(c.kv, 8, 0), lse(c.lse, 0, 0), idx(idx_h, 0, 0),
        len(len_h, 0, 0), loss(HostTensor(SA_DTYPE_FP32, {1}), 0, 16),
        per_token(shapes.per_token, 0, 16),
        dq_I(shapes.dq_I, 8, 256), dk_I(shapes.dk_I, 8, 256), dw(shapes.dw, 8, 64) {}
  // The scalar loss as the rank-0 tensor the API takes (stored as [1] with a guard).
  sa_tensor loss_view() const { return view_of(loss.view().data, SA_DTYPE_FP32, {}, SA_DEVICE_CUDA); }
  bool ok() const {
    return in.ok() && q.ok() && kv.ok() && lse.ok() && idx.ok() && len.ok() && loss.ok() &&
           per_token.ok() && dq_I.ok() && dk_I.ok() && dw.ok();
  }
};

LossOutputs output_shapes(const IndexerCase& c, sa_dtype loss_dtype, sa_dtype grad_dtype) {
  const IndexerShape& s = c.shape;
  LossOutputs o{HostTensor(loss_dtype, {}), HostTensor(loss_dtype, {s.Sq}),
                HostTensor(grad_dtype, {s.Sq, s.HI, s.DI}), HostTensor(grad_dtype, {s.Skv, s.DI}),
                HostTensor(SA_DTYPE_FP32, {s.Sq, s.HI})};
  for (HostTensor* t : {&o.loss, &o.per_token, &o.dq_I, &o.dk_I, &o.dw}) t->poison();
  return o;
}

sa_indexer_options loss_options(const LossCase& lc, sa_impl impl) {
  sa_indexer_options o = sa_indexer_options_default();
  o.scale_I = lc.scale_I;
  o.coeff = lc.coeff;
  o.deterministic = lc.deterministic ? 1 : 0;
  o.impl = impl;
  return o;
}

::testing::AssertionResult run_gpu_loss(const LossCase& lc, const IndexerCase& c,
                                        LossDevice& dev, LossOutputs* out) {
  for (DeviceTensor* t : {&dev.loss, &dev.per_token, &dev.dq_I, &dev.dk_I, &dev.dw})
    if (!t->poison()) return ::testing::AssertionFailure() << "poison failed";
  sa_indexer_loss_args a = sa_indexer_loss_args_default();
  a.q_I = dev.in.q_I.view();
  a.k_I = dev.in.k_I.view();
  a.w = dev.in.w.view();
  a.q = dev.q.view();
  a.kv = dev.kv.view();
  a.lse = dev.lse.view();
  a.topk_idx = lc.dense ? sa_tensor_none() : dev.idx.view();
  a.topk_length = lc.with_length && !lc.dense ? dev.len.view() : sa_tensor_none();
  a.k_start = dev.in.start();
  a.k_end = dev.in.end();
  a.loss = dev.loss_view();
  a.loss_per_token = dev.per_token.view();
  if (lc.grads) {
    a.dq_I = dev.dq_I.view();
    a.dk_I = dev.dk_I.view();
    a.dw = dev.dw.view();
  }
  a.options = loss_options(lc, lc.impl);
  size_t bytes = 0;
  if (sa_indexer_loss_workspace_size(&a, &bytes) != SA_OK)
    return ::testing::AssertionFailure() << "workspace size: " << sa_last_error();
  DeviceBuffer ws(bytes);
  if (!ws.ok() || (bytes > 0 && cudaMemset(ws.get(), 0xff, bytes) != cudaSuccess))
    return ::testing::AssertionFailure() << "workspace allocation failed";
  sa_context ctx = sa_context_default();
  ctx.workspace = ws.get();
  ctx.workspace_bytes = bytes;
  sa_impl used = SA_IMPL_AUTO;
  ctx.impl_used = &used;
  if (sa_indexer_loss(&a, &ctx) != SA_OK)
    return ::testing::AssertionFailure() << "sa_indexer_loss: " << sa_last_error();
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess)
    return ::testing::AssertionFailure() << "kernel failed: " << cudaGetErrorString(err);
  if (used != expected_impl(lc))
    return ::testing::AssertionFailure() << "ran " << sa_impl_name(used) << ", not "
                                         << sa_impl_name(expected_impl(lc));
  *out = output_shapes(c, SA_DTYPE_FP32, SA_DTYPE_BF16);
  HostTensor loss(SA_DTYPE_FP32, {1});
  ::testing::AssertionResult r = dev.loss.download(loss);
  out->loss.set(0, loss.get(0));
  if (r) r = dev.per_token.download(out->per_token);
  if (r && lc.grads) r = dev.dq_I.download(out->dq_I);
  if (r && lc.grads) r = dev.dk_I.download(out->dk_I);
  if (r && lc.grads) r = dev.dw.download(out->dw);
  return r;
}

void run_reference_loss(const LossCase& lc, IndexerCase& c, HostTensor& idx, HostTensor& len,
                        LossOutputs* out) {
  HostTensor q_I = to_fp64(c.q_I), k_I = to_fp64(c.k_I), q = to_fp64(c.q), kv = to_fp64(c.kv);
  *out = output_shapes(c, SA_DTYPE_FP64, SA_DTYPE_FP64);
  sa_indexer_loss_args a = sa_indexer_loss_args_default();
  a.q_I = q_I.view();
  a.k_I = k_I.view();
  a.w = c.w.view();
  a.q = q.view();
  a.kv = kv.view();
  a.lse = c.lse.view();
  a.topk_idx = lc.dense ? sa_tensor_none() : idx.view();
  a.topk_length = lc.with_length && !lc.dense ? len.view() : sa_tensor_none();
  a.k_start = c.has_range ? c.k_start.view() : sa_tensor_none();
  a.k_end = c.has_range ? c.k_end.view() : sa_tensor_none();
  a.loss = out->loss.view();
  a.loss_per_token = out->per_token.view();
  a.dq_I = out->dq_I.view();
  a.dk_I = out->dk_I.view();
  a.dw = out->dw.view();
  a.options = loss_options(lc, SA_IMPL_REFERENCE);
  ASSERT_EQ(sa_indexer_loss(&a, nullptr), SA_OK) << sa_last_error();
}

void expect_matches(const LossCase& lc, const IndexerCase& c, const HostTensor& idx,
                    const HostTensor& len, const LossOutputs& got, const LossOutputs& want) {
  const IndexerShape& s = c.shape;
  const std::vector<double> pt = got.per_token.to_double(), pt_ref = want.per_token.to_double();
  EXPECT_FALSE(any_nan(pt)) << "NaN in loss_per_token";
  double abs_sum = 1e-30, pt_max = 1e-30;
  for (double v : pt_ref) {
    abs_sum += std::fabs(v);
    pt_max = std::max(pt_max, std::fabs(v));
  }
  EXPECT_NEAR(got.loss.get(0), want.loss.get(0), 1e-4 * abs_sum) << "loss";
  EXPECT_TRUE(all_close(pt, pt_ref, 1e-4 * pt_max, 1e-4)) << "loss_per_token";
  if (!lc.grads) return;

  const std::vector<double> dq = got.dq_I.to_double(), dk = got.dk_I.to_double(),
                            dw = got.dw.to_double();
  EXPECT_FALSE(any_nan(dq)) << "NaN in dq_I";
  EXPECT_FALSE(any_nan(dk)) << "NaN in dk_I";
  EXPECT_FALSE(any_nan(dw)) << "NaN in dw";
  EXPECT_LT(rel_l2(dq, want.dq_I.to_double()), 1e-2) << "rel L2 of dq_I";
  EXPECT_LT(rel_l2(dk, want.dk_I.to_double()), 1e-2) << "rel L2 of dk_I";
  EXPECT_LT(rel_l2(dw, want.dw.to_double()), 1e-2) << "rel L2 of dw";

  // Structural zeros.
  std::vector<uint8_t> selected(static_cast<size_t>(s.Skv), 0);
  for (int64_t t = 0; t < s.Sq; ++t) {
    const std::vector<int64_t> keys =
        loss_keys(c, idx, lc.with_length ? &len : nullptr, t, lc.dense);
    const bool empty = keys.empty() || !row_has_mass(c, t);
    if (!empty) {
      for (int64_t k : keys) selected[static_cast<size_t>(k)] = 1;
      continue;
    }
    for (int64_t i = 0; i < s.HI * s.DI; ++i)
      ASSERT_EQ(dq[static_cast<size_t>(t * s.HI * s.DI + i)], 0.0) << "dq_I of empty row " << t;
    for (int64_t j = 0; j < s.HI; ++j)
      ASSERT_EQ(dw[static_cast<size_t>(t * s.HI + j)], 0.0) << "dw of empty row " << t;
    ASSERT_EQ(pt[static_cast<size_t>(t)], 0.0) << "loss of empty row " << t;
  }
  for (int64_t k = 0; k < s.Skv; ++k) {
    if (selected[static_cast<size_t>(k)]) continue;
    for (int64_t x = 0; x < s.DI; ++x)
      ASSERT_EQ(dk[static_cast<size_t>(k * s.DI + x)], 0.0) << "dk_I of unselected key " << k;
  }
}

// lc against the reference; deterministic cases (and every_run_same: the Hopper suites) also run
// twice more and compare bitwise (dk_I only in deterministic mode: fp32 reductions otherwise).
void check_loss_case(const LossCase& lc, bool every_run_same = false) {
  IndexerCase c = make_indexer_case(lc.shape, lc.ranges, SA_DTYPE_BF16, loss_seed(lc.name));
  shift_lse(c, lc.lse_shift);
  HostTensor idx, len;
  make_meta(c, std::max<int64_t>(lc.topk, 1), loss_seed(lc.name) + 1, &idx, &len);
  LossOutputs want;
  ASSERT_NO_FATAL_FAILURE(run_reference_loss(lc, c, idx, len, &want));
  LossDevice dev(c, idx, len, output_shapes(c, SA_DTYPE_FP32, SA_DTYPE_BF16));
  ASSERT_TRUE(dev.ok());
  LossOutputs got;
  ASSERT_TRUE(run_gpu_loss(lc, c, dev, &got));
  expect_matches(lc, c, idx, len, got, want);
  if (!lc.deterministic && !every_run_same) return;
  for (int run = 1; run < 3; ++run) {
    LossOutputs again;
    ASSERT_TRUE(run_gpu_loss(lc, c, dev, &again));
    EXPECT_TRUE(bitwise_equal(again.loss, got.loss)) << "loss differs on run " << run;
    EXPECT_TRUE(bitwise_equal(again.per_token, got.per_token)) << "per-token differs, run " << run;
    if (!lc.grads) continue;
    EXPECT_TRUE(bitwise_equal(again.dq_I, got.dq_I)) << "dq_I differs on run " << run;
    if (lc.deterministic) {
      EXPECT_TRUE(bitwise_equal(again.dk_I, got.dk_I)) << "dk_I differs on run " << run;
    }
    EXPECT_TRUE(bitwise_equal(again.dw, got.dw)) << "dw differs on run " << run;
  }
}

class IndexerGpuLoss : public ::testing::TestWithParam<LossCase> {};

TEST_P(IndexerGpuLoss, MatchesReference) {
  SA_SKIP_WITHOUT_GPU();
  check_loss_case(GetParam());
}

std::vector<LossCase> loss_cases() {
  using R = IndexerRanges;
  const bool kDet = true;
  return {
      {"HI64_H128_D576_K256_Causal", loss_shape(48, 600, 64, 128, 576), R::kCausal, 256},
      {"HI32_H64_D512_K100_Packed", loss_shape(40, 500, 32, 64, 512), R::kPacked, 100},
      {"HI16_H16_D576_K7_OddRanges", loss_shape(30, 120, 16, 16, 576), R::kOdd, 7},
      {"HI64_H32_D576_K64_NoLength", loss_shape(24, 300, 64, 32, 576), R::kNone, 64, false},
      {"HI64_H128_D576_K2048_Full", loss_shape(6, 3000, 64, 128, 576), R::kNone, 2048},
      {"HI16_H8_D512_K32_Causal", loss_shape(20, 200, 16, 8, 512), R::kCausal, 32},
      {"HI32_H80_D576_K64_TwoGroups", loss_shape(20, 300, 32, 80, 576), R::kCausal, 64},
      {"HI64_H64_D576_K48_CoeffNegativeScale", loss_shape(20, 250, 64, 64, 576), R::kPacked, 48,
       true, false, true, 0.37f, -0.07f},
      {"HI32_H64_D512_K80_LossOnly", loss_shape(30, 400, 32, 64, 512), R::kCausal, 80, true,
       false, false},
      {"HI64_H64_D576_K160_Deterministic", loss_shape(40, 400, 64, 64, 576), R::kCausal, 160,
       true, kDet},
      {"HI32_H128_D512_K300_Deterministic", loss_shape(20, 700, 32, 128, 512), R::kPacked, 300,
       true, kDet},
      {"HI16_H32_D576_K9_OddDeterministic", loss_shape(36, 80, 16, 32, 576), R::kOdd, 9, true,
       kDet},
      // dense mode (topk 0: no topk_idx)
      {"Dense_HI64_H128_D576_Causal", loss_shape(40, 300, 64, 128, 576), R::kCausal, 0, false,
       false, true, 1.f, 0.f, true},
      {"Dense_HI32_H64_D512_Packed", loss_shape(36, 400, 32, 64, 512), R::kPacked, 0, false,
       false, true, 1.f, 0.f, true},
      {"Dense_HI16_H16_D576_OddRanges", loss_shape(30, 100, 16, 16, 576), R::kOdd, 0, false,
       false, true, 1.f, 0.f, true},
      {"Dense_HI64_H32_D512_Full_Skv1100", loss_shape(8, 1100, 64, 32, 512), R::kNone, 0, false,
       false, true, 1.f, 0.f, true},
      {"Dense_HI32_H80_D576_LossOnly", loss_shape(24, 250, 32, 80, 576), R::kCausal, 0, false,
       false, false, 1.f, 0.f, true},
      {"Dense_HI16_H8_D576_CoeffNegativeScale", loss_shape(20, 200, 16, 8, 576), R::kPacked, 0,
       false, false, true, 0.37f, -0.07f, true},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, IndexerGpuLoss, ::testing::ValuesIn(loss_cases()),
                         [](const auto& info) { return info.param.name; });

// AUTO serves the loss with the portable kernels, or on sm_90 (with the sm90 path built) with the
// Hopper target (run_gpu_loss fails unless the expected implementation ran): a sparse
// deterministic case and a dense one, against the reference as above.
TEST(IndexerGpuAuto, LossRunsTheExpectedKernels) {
  SA_SKIP_WITHOUT_GPU();
  for (const char* name : {"HI64_H64_D576_K160_Deterministic", "Dense_HI64_H128_D576_Causal"}) {
    SCOPED_TRACE(name);
    const std::vector<LossCase> cases = loss_cases();
    auto it = std::find_if(cases.begin(), cases.end(),
                           [&](const LossCase& x) { return x.name == name; });
    ASSERT_NE(it, cases.end());
    LossCase lc = *it;
    lc.impl = SA_IMPL_AUTO;
    check_loss_case(lc);
  }
}

// ---- the Hopper attention target (src/sm90/indexer_target_kernel.cuh) --------------------------
// Every portable case with options.impl = SA_IMPL_SM90, plus the Hopper target's own edges: a CTA
// serves a token and a pair of 64-head groups, so 3 and 5 groups (H 192, 300: the last pair's
// second group absent, the last group partial) in both modes; one key (a single partial stage);
// stage counts odd and even around the 32-key stage and the two- and six-stage rings. Each case
// runs on both Hopper targets (Q in shared memory, the default; Q in registers, tuning 2); two more
// runs of each must give bitwise the same loss, loss_per_token, dq_I and dw.
#define SA_SKIP_UNLESS_SM90_PATH()                                                            \
  do {                                                                                        \
    SA_SKIP_UNLESS_SM90();                                                                    \
    if (!SA_HAVE_SM90) GTEST_SKIP() << "the library was built without the sm90 path";         \
  } while (0)

std::vector<LossCase> sm90_loss_cases() {
  using R = IndexerRanges;
  std::vector<LossCase> cases = loss_cases();
  const std::vector<LossCase> more = {
      {"HI32_H192_D576_K96_ThreeGroups", loss_shape(18, 260, 32, 192, 576), R::kCausal, 96},
      {"HI16_H300_D512_K33_FiveGroups", loss_shape(10, 90, 16, 300, 512), R::kPacked, 33},
      {"HI16_H128_D576_K1_OneKey", loss_shape(12, 40, 16, 128, 576), R::kNone, 1, false},
      {"HI64_H128_D512_K95_ThreeStages", loss_shape(16, 400, 64, 128, 512), R::kNone, 95, false},
      {"HI64_H128_D576_K129_FiveStages", loss_shape(16, 400, 64, 128, 576), R::kCausal, 129},
      {"HI32_H128_D576_K416_ThirteenStages", loss_shape(12, 900, 32, 128, 576), R::kNone, 416,
       false},
      // The Hopper loss kernel's edges: a long list (65
      // chunks of 64 keys, the last one partial; 66 KB of per-slot list in shared memory).
      {"HI64_H64_D512_K4100_LongRows", loss_shape(4, 5000, 64, 64, 512), R::kNone, 4100},
      {"Dense_HI32_H192_D576_ThreeGroups", loss_shape(20, 150, 32, 192, 576), R::kCausal, 0,
       false, false, true, 1.f, 0.f, true},
      {"Dense_HI16_H128_D512_Packed_Skv77", loss_shape(24, 77, 16, 128, 512), R::kPacked, 0,
       false, false, true, 1.f, 0.f, true},
      // The Hopper loss kernel's dense edges (64-key chunks of contiguous rows, log A_g of a chunk
      // copied to shared memory): ranges empty, of 1 and 2 keys, and of 200 = 3 x 64 + 8 keys
      // (a partial tail chunk) at H_I 64; causal with S_q > S_kv: 30 empty rows, then every
      // range size 1..70 (64 exactly: one full chunk; 65..70: a tail of 1..6 keys); five head
      // groups of log A per key; one full chunk and nothing else (S_kv 64).
      {"Dense_HI64_H128_D576_OddRanges_Skv200", loss_shape(30, 200, 64, 128, 576), R::kOdd, 0,
       false, false, true, 1.f, 0.f, true},
      {"Dense_HI32_H64_D512_Causal_Sq100_Skv70", loss_shape(100, 70, 32, 64, 512), R::kCausal,
       0, false, false, true, 1.f, 0.f, true},
      {"Dense_HI64_H300_D512_Packed_FiveGroups", loss_shape(16, 260, 64, 300, 512), R::kPacked,
       0, false, false, true, 1.f, 0.f, true},
      {"Dense_HI16_H64_D576_Full_Skv64", loss_shape(6, 64, 16, 64, 576), R::kNone, 0, false,
       false, true, 1.f, 0.f, true},
      {"Dense_HI64_H64_D512_Causal_LossOnly", loss_shape(40, 150, 64, 64, 512), R::kCausal, 0,
       false, false, false, 1.f, 0.f, true},
      // Odd S_q (two tokens per CTA: the last CTA's second token absent; with odd ranges, the
      // last CTA has an empty row and an absent token, so nothing of it is live).
      {"Dense_HI32_H128_D576_Causal_Sq37", loss_shape(37, 180, 32, 128, 576), R::kCausal, 0,
       false, false, true, 1.f, 0.f, true},
      {"Dense_HI64_H64_D512_OddRanges_Sq31", loss_shape(31, 150, 64, 64, 512), R::kOdd, 0,
       false, false, true, 1.f, 0.f, true},
  };
  cases.insert(cases.end(), more.begin(), more.end());
  // The Hopper target sums 2^(x + 64) without a per-key maximum (docs/indexer.md, "lse"): exact
  // for an lse from 39.5 nats below to ~100 nats above the attention's; these move every finite
  // lse by +100 and -30 nats (p unchanged, so the reference's loss is the same).
  auto shifted = [](LossCase lc, double d) {
    lc.lse_shift = d;
    return lc;
  };
  cases.push_back(shifted({"HI64_H128_D576_K160_LseAbove100", loss_shape(14, 300, 64, 128, 576),
                           R::kCausal, 160},
                          100.0));
  cases.push_back(shifted({"Dense_HI32_H128_D576_LseBelow30", loss_shape(20, 150, 32, 128, 576),
                           R::kCausal, 0, false, false, true, 1.f, 0.f, true},
                          -30.0));
  for (LossCase& lc : cases) lc.impl = SA_IMPL_SM90;
  return cases;
}

class IndexerSm90Loss : public ::testing::TestWithParam<LossCase> {};

// Both Hopper targets (Tuning::sm90_indexer_target): 0 Q in registers (the default), 3 Q in
// shared memory, each with the portable loss kernel (Tuning::sm90_indexer_loss_kernel = 3); the
// Hopper (wgmma) loss kernel (sm90/indexer_loss_kernel.cuh) with the default target, one token
// per CTA (tuning 1): it serves the non-deterministic cases of H_I 16 / 32 / 64, sparse and
// dense, the portable loss kernel the deterministic ones, so every case must still match;
// tuning 2 (dense mode's two tokens per CTA; odd token counts leave the last CTA's second token
// absent; causal pairs differ by one key, packed and odd ranges give pairs with disjoint ranges
// or one empty row); and the default (tuning 0 = 4, sm90/indexer_loss_pipe_kernel.cuh: dense
// mode's pipelined pair kernel, the same pairs, log Z_A from pass 1's online sums; sparse mode's
// pipelined one-token kernel, a producer warpgroup and the consumer's GEMMs in flight).
TEST_P(IndexerSm90Loss, MatchesReference) {
  SA_SKIP_UNLESS_SM90_PATH();
  struct Variant {
    int32_t target, loss_kernel;
    const char* name;
  };
  for (const Variant& v : {Variant{0, 3, "target: Q in registers, portable loss kernel"},
                           Variant{3, 3, "target: Q in shared memory, portable loss kernel"},
                           Variant{0, 1, "target: Q in registers, Hopper loss kernel"},
                           Variant{0, 2, "Hopper loss kernel, pairs in dense mode"},
                           Variant{0, 0, "default: Hopper loss kernels, pipelined"}}) {
    SCOPED_TRACE(v.name);
    sa::detail::Tuning t;
    t.sm90_indexer_target = v.target;
    t.sm90_indexer_loss_kernel = v.loss_kernel;
    sa::detail::ScopedTuning scope(t);
    check_loss_case(GetParam(), /*every_run_same=*/true);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, IndexerSm90Loss, ::testing::ValuesIn(sm90_loss_cases()),
                         [](const auto& info) { return info.param.name; });

// Past the Hopper target's range on the high side (docs/indexer.md): with every lse 200 nats above
// the attention's, every term 2^(x + 64) falls below fp32's normal range, so every key's log A is
// -inf and every row is empty: loss 0, per-token terms 0, dq_I and dw 0, no NaN (the portable
// target and the reference, which rescale by the maximum, still see the unchanged p).
TEST(IndexerSm90LossLseContract, FarAboveTheAttentionLseGivesEmptyRows) {
  SA_SKIP_UNLESS_SM90_PATH();
  for (const bool dense : {false, true}) {
    SCOPED_TRACE(dense ? "dense" : "sparse");
    LossCase lc{"lse_far_above", loss_shape(10, 120, 32, 128, 576), IndexerRanges::kCausal,
                dense ? 0 : 64};
    lc.dense = dense;
    lc.impl = SA_IMPL_SM90;
    IndexerCase c =
        make_indexer_case(lc.shape, lc.ranges, SA_DTYPE_BF16, loss_seed(lc.name) + dense);
    shift_lse(c, 200.0);
    HostTensor idx, len;
    make_meta(c, std::max<int64_t>(lc.topk, 1), loss_seed(lc.name) + 1, &idx, &len);
    LossDevice dev(c, idx, len, output_shapes(c, SA_DTYPE_FP32, SA_DTYPE_BF16));
    ASSERT_TRUE(dev.ok());
    LossOutputs got;
    ASSERT_TRUE(run_gpu_loss(lc, c, dev, &got));
    EXPECT_EQ(got.loss.get(0), 0.0);
    for (double v : got.per_token.to_double()) ASSERT_EQ(v, 0.0) << "per-token term";
    for (double v : got.dq_I.to_double()) ASSERT_EQ(v, 0.0) << "dq_I";
    for (double v : got.dw.to_double()) ASSERT_EQ(v, 0.0) << "dw";
    EXPECT_FALSE(any_nan(got.dk_I.to_double())) << "NaN in dk_I";
  }
}

// The internal tuning Tuning::sm90_indexer_target = 1 (the bench's A/B) runs the portable target
// on the sm90 entry: impl_used says sm90, the results match the reference.
TEST(IndexerSm90LossTuning, PortableTargetOnTheSm90Entry) {
  SA_SKIP_UNLESS_SM90_PATH();
  sa::detail::Tuning t;
  t.sm90_indexer_target = 1;
  sa::detail::ScopedTuning scope(t);
  for (const char* name : {"HI64_H128_D576_K256_Causal", "Dense_HI32_H64_D512_Packed"}) {
    SCOPED_TRACE(name);
    const std::vector<LossCase> cases = sm90_loss_cases();
    auto it = std::find_if(cases.begin(), cases.end(),
                           [&](const LossCase& x) { return x.name == name; });
    ASSERT_NE(it, cases.end());
    check_loss_case(*it);
  }
}

// What the portable loss does not serve yet is refused by name (portable forced): deterministic
// dk_I in dense mode.
TEST(IndexerGpuLossRefusals, DeterministicDenseMode) {
  SA_SKIP_WITHOUT_GPU();
  LossCase lc{"refusal", loss_shape(4, 32, 16, 16, 576), IndexerRanges::kNone, 0};
  lc.deterministic = true;
  lc.dense = true;
  IndexerCase c = make_indexer_case(lc.shape, lc.ranges, SA_DTYPE_BF16, 3);
  HostTensor idx, len;
  make_meta(c, 8, 4, &idx, &len);
  LossDevice dev(c, idx, len, output_shapes(c, SA_DTYPE_FP32, SA_DTYPE_BF16));
  ASSERT_TRUE(dev.ok());
  sa_indexer_loss_args a = sa_indexer_loss_args_default();
  a.q_I = dev.in.q_I.view();
  a.k_I = dev.in.k_I.view();
  a.w = dev.in.w.view();
  a.q = dev.q.view();
  a.kv = dev.kv.view();
  a.lse = dev.lse.view();
  a.topk_idx = sa_tensor_none();  // dense mode
  a.topk_length = sa_tensor_none();
  a.k_start = sa_tensor_none();
  a.k_end = sa_tensor_none();
  a.loss = dev.loss_view();
  a.loss_per_token = sa_tensor_none();
  a.dq_I = dev.dq_I.view();
  a.dk_I = dev.dk_I.view();
  a.dw = dev.dw.view();
  a.options = loss_options(lc, SA_IMPL_PORTABLE);
  EXPECT_EQ(sa_indexer_loss(&a, nullptr), SA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(sa_last_error()).find("dense mode"), std::string::npos)
      << sa_last_error();
}

// Dense mode at S = 32768 (causal, H_I 64, attention H 16, D_qk 512): it runs with workspace far
// below [S_q, S_kv] (the log A slices are capped), every output finite; sample rows' loss terms,
// dq_I and dw match the reference run on that row alone (the same keys, so the same terms).
// impl: the options' impl (the caller sets the tuning).
void check_dense_s32768(sa_impl impl) {
  const int64_t S = 32768, HI = 64, DI = 128, H = 16, Dqk = 512;
  auto value = [](uint64_t i) {  // uniform [-1, 1) from a hash
    uint64_t z = i * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
    z ^= z >> 29;
    return (z >> 40) * (2.0 / 16777216.0) - 1.0;
  };
  HostTensor q_I(SA_DTYPE_BF16, {S, HI, DI}), k_I(SA_DTYPE_BF16, {S, DI}), w(SA_DTYPE_FP32, {S, HI}),
      q(SA_DTYPE_BF16, {S, H, Dqk}), kv(SA_DTYPE_BF16, {S, Dqk}), lse(SA_DTYPE_FP32, {S, H}),
      k_end(SA_DTYPE_INT32, {S});
  uint64_t salt = 0;
  for (HostTensor* t : {&q_I, &k_I, &w, &q, &kv, &lse}) {
    salt += uint64_t{1} << 40;
    for (int64_t i = 0; i < t->numel(); ++i) t->set(i, value(salt + static_cast<uint64_t>(i)));
  }
  for (int64_t t = 0; t < S; ++t) k_end.i32()[t] = static_cast<int32_t>(t + 1);
  DeviceTensor dq_Id(q_I, 0, 0), dk_Id(k_I, 0, 0), dwd(w, 0, 0), dqd(q, 0, 0), dkvd(kv, 0, 0),
      dlse(lse, 0, 0), dend(k_end, 0, 0);
  HostTensor pt(SA_DTYPE_FP32, {S}), gq(SA_DTYPE_BF16, {S, HI, DI}), gk(SA_DTYPE_BF16, {S, DI}),
      gw(SA_DTYPE_FP32, {S, HI});
  DeviceTensor loss(HostTensor(SA_DTYPE_FP32, {1}), 0, 0), dpt(pt, 0, 16), dgq(gq, 0, 256),
      dgk(gk, 0, 256), dgw(gw, 0, 64);
  for (const DeviceTensor* t : {&dq_Id, &dk_Id, &dwd, &dqd, &dkvd, &dlse, &dend, &loss, &dpt,
                                &dgq, &dgk, &dgw})
    ASSERT_TRUE(t->ok());
  for (DeviceTensor* t : {&loss, &dpt, &dgq, &dgk, &dgw}) ASSERT_TRUE(t->poison());
  sa_indexer_loss_args a = sa_indexer_loss_args_default();
  a.q_I = dq_Id.view();
  a.k_I = dk_Id.view();
  a.w = dwd.view();
  a.q = dqd.view();
  a.kv = dkvd.view();
  a.lse = dlse.view();
  a.topk_idx = sa_tensor_none();
  a.topk_length = sa_tensor_none();
  a.k_start = sa_tensor_none();
  a.k_end = dend.view();
  a.loss = view_of(loss.view().data, SA_DTYPE_FP32, {}, SA_DEVICE_CUDA);
  a.loss_per_token = dpt.view();
  a.dq_I = dgq.view();
  a.dk_I = dgk.view();
  a.dw = dgw.view();
  a.options = sa_indexer_options_default();
  a.options.impl = impl;
  size_t bytes = 0;
  ASSERT_EQ(sa_indexer_loss_workspace_size(&a, &bytes), SA_OK) << sa_last_error();
  EXPECT_LE(bytes, static_cast<size_t>(S * S));  // a quarter of [S_q, S_kv] fp32
  DeviceBuffer ws(bytes);
  ASSERT_TRUE(ws.ok());
  sa_context ctx = sa_context_default();
  ctx.workspace = ws.get();
  ctx.workspace_bytes = bytes;
  ASSERT_EQ(sa_indexer_loss(&a, &ctx), SA_OK) << sa_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_TRUE(dpt.download(pt));
  ASSERT_TRUE(dgq.download(gq));
  ASSERT_TRUE(dgk.download(gk));
  ASSERT_TRUE(dgw.download(gw));
  EXPECT_FALSE(any_nan(pt.to_double())) << "NaN in loss_per_token";
  EXPECT_FALSE(any_nan(gq.to_double())) << "NaN in dq_I";
  EXPECT_FALSE(any_nan(gk.to_double())) << "NaN in dk_I";
  EXPECT_FALSE(any_nan(gw.to_double())) << "NaN in dw";

  // Sample rows: the reference on a one-row problem (row t's q_I, w, q, lse and range; all keys).
  HostTensor k64 = to_fp64(k_I), kv64 = to_fp64(kv);
  for (int64_t t : {int64_t{100}, int64_t{20000}, S - 1}) {
    HostTensor rq_I(SA_DTYPE_FP64, {1, HI, DI}), rw(SA_DTYPE_FP32, {1, HI}),
        rq(SA_DTYPE_FP64, {1, H, Dqk}), rlse(SA_DTYPE_FP32, {1, H}), rend(SA_DTYPE_INT32, {1});
    for (int64_t i = 0; i < HI * DI; ++i) rq_I.set(i, q_I.get(t * HI * DI + i));
    for (int64_t i = 0; i < HI; ++i) rw.set(i, w.get(t * HI + i));
    for (int64_t i = 0; i < H * Dqk; ++i) rq.set(i, q.get(t * H * Dqk + i));
    for (int64_t i = 0; i < H; ++i) rlse.set(i, lse.get(t * H + i));
    rend.i32()[0] = static_cast<int32_t>(t + 1);
    HostTensor rloss(SA_DTYPE_FP64, {}), rpt(SA_DTYPE_FP64, {1}), rgq(SA_DTYPE_FP64, {1, HI, DI}),
        rgk(SA_DTYPE_FP64, {S, DI}), rgw(SA_DTYPE_FP32, {1, HI});
    sa_indexer_loss_args r = sa_indexer_loss_args_default();
    r.q_I = rq_I.view();
    r.k_I = k64.view();
    r.w = rw.view();
    r.q = rq.view();
    r.kv = kv64.view();
    r.lse = rlse.view();
    r.topk_idx = sa_tensor_none();
    r.topk_length = sa_tensor_none();
    r.k_start = sa_tensor_none();
    r.k_end = rend.view();
    r.loss = rloss.view();
    r.loss_per_token = rpt.view();
    r.dq_I = rgq.view();
    r.dk_I = rgk.view();
    r.dw = rgw.view();
    r.options = sa_indexer_options_default();
    r.options.impl = SA_IMPL_REFERENCE;
    ASSERT_EQ(sa_indexer_loss(&r, nullptr), SA_OK) << sa_last_error();
    // Dense mode forms a row's loss as sum p (log p - I) + log Z_I sum p, fp32 sums of ~t terms
    // of size ~log Z_I (~14 here) that cancel: a few 1e-5 of error at t ~ 32768.
    EXPECT_NEAR(pt.get(t), rpt.get(0), 5e-4 * (1.0 + std::fabs(rpt.get(0)))) << "row " << t;
    std::vector<double> got_q(static_cast<size_t>(HI * DI)), got_w(static_cast<size_t>(HI));
    for (int64_t i = 0; i < HI * DI; ++i) got_q[static_cast<size_t>(i)] = gq.get(t * HI * DI + i);
    for (int64_t i = 0; i < HI; ++i) got_w[static_cast<size_t>(i)] = gw.get(t * HI + i);
    EXPECT_LT(rel_l2(got_q, rgq.to_double()), 1e-2) << "dq_I of row " << t;
    EXPECT_LT(rel_l2(got_w, rgw.to_double()), 1e-2) << "dw of row " << t;
  }
}

TEST(IndexerGpuLossLarge, DenseS32768Causal) {
  SA_SKIP_WITHOUT_GPU();
  check_dense_s32768(SA_IMPL_PORTABLE);
}

// The same on the Hopper path with the Hopper loss kernel forced, one token per CTA (tuning 1),
// two (tuning 2) and two pipelined (tuning 4): 8 slices of 4096 tokens (the loss kernel's
// tok_begin and log A's first token past 0).
TEST(IndexerSm90LossLarge, DenseS32768CausalHopperLossKernel) {
  SA_SKIP_UNLESS_SM90_PATH();
  for (int32_t kernel : {1, 2, 4}) {
    SCOPED_TRACE(kernel == 1   ? "one token per CTA"
                 : kernel == 2 ? "two tokens per CTA"
                               : "two tokens per CTA, pipelined");
    sa::detail::Tuning t;
    t.sm90_indexer_loss_kernel = kernel;
    sa::detail::ScopedTuning scope(t);
    check_dense_s32768(SA_IMPL_SM90);
  }
}

}  // namespace
}  // namespace sa_test
