// GPU tests of BSA packed batches (SPEC 4; skip without a GPU).
//
// The portable and Hopper (sm90) forwards and backwards take packed batches (AUTO prefers the
// sm90 ones on an sm_90 device; options.validate with packed batches is refused by name by both
// sm90 entries). Cases compare them against the fp64 reference on the same packed problem (fp64 copies
// of the inputs): empty and one-token sequences, sequences shorter than a block, partial blocks,
// S_q != S_kv per sequence, queries without keys (lse -inf: dq exactly 0), keys without queries
// (dk = dv exactly 0), MHA / GQA / MQA, every mask, block 64 and 128, D 64 and 128, rows of
// N_q_max past every sequence, rows listing more than 32 blocks, NaN-poisoned outputs with NaN
// padding and guards that must come back untouched. Every forward and backward case runs on both
// implementations (the sm90 ones named + "Sm90", skipped unless the device is sm_90 and the
// Hopper path is built). The backward runs each case with the automatic bucket, one owner per
// row, rows split in groups of 2 (the fp32 dK/dV accumulators) and deterministic mode (bitwise
// equal over three runs), plus the Hopper kernel's hazards at a sequence's end: query tiles and
// KV blocks that cross into a neighbour whose inputs are NaN, single-owner dK/dV boxes that
// cross into the next sequence's keys, second halves of a 128-key block wholly past the
// sequence. Captured graphs replay with new cu_seqlens and metadata values (grids and workspace
// depend on shapes only), on both forwards and both backwards. The sm90 forward's tile order:
// dynamic tiles (from the workspace's counter, longest first) give the static order's bytes on
// batches with empty and one-token sequences, match the reference, and replay in a graph.
//
// Filters: GpuBsaVarlen.*, GpuBsaVarlen/GpuBsaVarlenForward.*, GpuBsaVarlen/GpuBsaVarlenGraph.*,
// GpuBsaVarlen/GpuBsaVarlenBackward.* and GpuBsaVarlen/GpuBsaVarlenBackwardGraph.* (all match
// *GpuBsaVarlen*); the sm90 cases alone: '*GpuBsaVarlen*Sm90*' (plus
// GpuBsaVarlen.AutoRunsSm90ForwardAndBackward and GpuBsaVarlen.Sm90BackwardIgnoresTuningVariants).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bsa_varlen_case.hpp"
#include "common/tuning.hpp"
#include "gpu_test_util.hpp"
#include "sparse_attention/sparse_attention.h"
#include "sparse_attention/sparse_attention.hpp"

#ifndef SA_HAVE_SM90  // set by CMake like the library's
#define SA_HAVE_SM90 0
#endif

namespace {

namespace sa_cpp = sparse_attention;
using sa_test::DeviceBuffer;
using sa_test::DeviceTensor;
using sa_test::HostTensor;
using sa_test::Packed;
using sa_test::VarlenCase;

bool sm90_runs() { return SA_HAVE_SM90 && sa_test::device_is_sm90(); }

// The device copies of a packed problem's forward tensors: q, k, v, o with `pad` NaN elements
// past every row, o and lse followed by NaN guards.
struct DeviceForward {
  DeviceTensor q, k, v, o, lse, cu_q, cu_k, index, count;
  DeviceForward(const Packed& p, int64_t pad)
      : q(p.q, pad, 0), k(p.k, pad, 0), v(p.v, pad, 0), o(p.o, pad, 64 * p.o.shape()[2]),
        lse(p.lse, 0, 64), cu_q(p.cu_q, 0, 0), cu_k(p.cu_k, 0, 0), index(p.index, 0, 0),
        count(p.count, 0, 0) {}
  bool ok() const {
    return q.ok() && k.ok() && v.ok() && o.ok() && lse.ok() && cu_q.ok() && cu_k.ok() &&
           index.ok() && count.ok();
  }
  // New input values of the same shapes (outputs are poisoned separately).
  bool upload(const Packed& p) {
    return q.upload(p.q) && k.upload(p.k) && v.upload(p.v) && cu_q.upload(p.cu_q) &&
           cu_k.upload(p.cu_k) && index.upload(p.index) && count.upload(p.count);
  }
  bool poison(cudaStream_t stream) { return o.poison(stream) && lse.poison(stream); }
  void args(sa_bsa_fwd_args& a, Packed& p, const VarlenCase& c) const {
    p.fwd_args(a, c);
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.o = o.view();
    a.lse = lse.view();
    a.sparsity.q2k_index = index.view();
    a.sparsity.q2k_count = count.view();
    a.options.cu_seqlens_q = cu_q.view();
    a.options.cu_seqlens_k = cu_k.view();
  }
};

// The fp64 reference's o and lse for a packed problem, on fp64 copies of its inputs.
void reference_forward(Packed& p, const VarlenCase& c, HostTensor* o, HostTensor* lse) {
  HostTensor q64 = sa_test::to_fp64(p.q), k64 = sa_test::to_fp64(p.k), v64 = sa_test::to_fp64(p.v);
  *o = HostTensor(SA_DTYPE_FP64, p.o.shape());
  *lse = HostTensor(SA_DTYPE_FP32, p.lse.shape());
  sa_cpp::BsaForwardArgs a;
  p.fwd_args(a, c);
  a.q = q64.view();
  a.k = k64.view();
  a.v = v64.view();
  a.o = o->view();
  a.lse = lse->view();
  a.options.impl = SA_IMPL_REFERENCE;
  ASSERT_EQ(sa_bsa_forward(&a, nullptr), SA_OK) << sa_last_error();
}

// Downloads o and lse (failing when padding or guards were written) and compares them with the
// reference: o within bf16/fp16 rounding (rel L2), no NaN, rows of sequences without keys exactly
// 0; lse within 1e-4 with -inf at the same places.
void expect_forward_matches(const DeviceForward& d, Packed& p, const VarlenCase& c) {
  HostTensor o_gpu(p.o.dtype(), p.o.shape()), lse_gpu(SA_DTYPE_FP32, p.lse.shape());
  ASSERT_TRUE(d.o.download(o_gpu)) << "o";
  ASSERT_TRUE(d.lse.download(lse_gpu)) << "lse";
  HostTensor o_ref, lse_ref;
  reference_forward(p, c, &o_ref, &lse_ref);
  const std::vector<double> got = o_gpu.to_double(), want = o_ref.to_double();
  EXPECT_FALSE(sa_test::any_nan(got)) << "NaN in o";
  const double tol = c.dtype == SA_DTYPE_FP16 ? 2e-3 : 1e-2;
  EXPECT_LT(sa_test::rel_l2(got, want), tol) << "rel L2 of o";
  const int64_t row = c.Hq * c.Dv;  // elements per token of o
  for (int64_t b = 0; b < p.B; ++b) {
    if (c.skv[static_cast<size_t>(b)] != 0) continue;
    for (int64_t i = p.q0[b] * row; i < (p.q0[b] + c.sq[static_cast<size_t>(b)]) * row; ++i)
      ASSERT_EQ(got[static_cast<size_t>(i)], 0.0) << "o of a sequence without keys, b=" << b;
  }
  EXPECT_TRUE(sa_test::all_close(lse_gpu.to_double(), lse_ref.to_double(), 1e-4, 0.0)) << "lse";
}

VarlenCase gpu_case(std::string name, std::vector<int64_t> sq, std::vector<int64_t> skv,
                    int64_t Hq, int64_t Hkv, int64_t D, int32_t block, sa_mask mask) {
  VarlenCase c;
  c.name = std::move(name);
  c.sq = std::move(sq);
  c.skv = std::move(skv);
  c.Hq = Hq;
  c.Hkv = Hkv;
  c.D = c.Dv = D;
  c.block = block;
  c.mask = mask;
  c.dtype = SA_DTYPE_BF16;
  return c;
}

std::vector<VarlenCase> forward_cases() {
  std::vector<VarlenCase> v;
  // Empty sequences, one token, a block minus / exactly / plus one, a long one (MHA).
  v.push_back(gpu_case("mha_mixed_none_b64_d64", {0, 1, 63, 64, 65, 200}, {0, 1, 63, 64, 65, 200},
                       2, 2, 64, 64, SA_MASK_NONE));
  // S_q != S_kv per sequence, queries without keys, keys without queries (GQA, causal).
  v.push_back(gpu_case("gqa_sq_ne_skv_causal_b64_d128", {5, 130, 0, 70, 20},
                       {200, 40, 64, 0, 20}, 4, 2, 128, 64, SA_MASK_CAUSAL));
  // MQA, a window on both sides, block 128 with partial blocks.
  VarlenCase w = gpu_case("mqa_window_b128_d64", {300, 17, 129}, {129, 260, 0}, 4, 1, 64, 128,
                          SA_MASK_WINDOW);
  w.window_left = 50;
  w.window_right = 20;
  v.push_back(w);
  // A given causal offset with a left window (the same band in every sequence), two extra rows
  // of N_q_max past every sequence.
  VarlenCase cw = gpu_case("gqa_causal_window_offset_given_b128_d128", {150, 90, 3},
                           {150, 256, 300}, 4, 2, 128, 128, SA_MASK_CAUSAL_WINDOW);
  cw.offset_given = true;
  cw.offset = 3;
  cw.window_left = 40;
  cw.extra_nq = 2;
  v.push_back(cw);
  // Default causal: each sequence's own offset S_kv - S_q, shorter-than-a-block sequences.
  v.push_back(gpu_case("mha_causal_short_b64_d64", {7, 33, 1, 64}, {40, 33, 9, 1}, 2, 2, 64, 64,
                       SA_MASK_CAUSAL));
  // fp16.
  VarlenCase h = gpu_case("gqa_fp16_window_b64_d64", {70, 190}, {130, 64}, 4, 2, 64, 64,
                          SA_MASK_WINDOW);
  h.dtype = SA_DTYPE_FP16;
  h.window_left = 30;
  h.window_right = 30;
  v.push_back(h);
  // Block 128: empty and one-token sequences between long ones, causal (each sequence's own
  // offset), GQA, and partial last blocks whose next rows belong to the next sequence.
  v.push_back(gpu_case("gqa_mixed_causal_b128_d128", {1, 0, 300, 129, 1, 0, 255},
                       {1, 5, 300, 129, 200, 0, 256}, 4, 2, 128, 128, SA_MASK_CAUSAL));
  // Block 128 without a mask (the band [-sq, skv]), D 64, fp16, an empty last sequence.
  VarlenCase n = gpu_case("mha_fp16_none_b128_d64", {130, 1, 256, 0}, {250, 3, 128, 0}, 2, 2, 64,
                          128, SA_MASK_NONE);
  n.dtype = SA_DTYPE_FP16;
  v.push_back(n);
  // Rows listing more than 32 KV blocks (the walkers' second chunk), block 64, causal, with an
  // empty sequence before it and one token after it.
  v.push_back(gpu_case("gqa_long_rows_causal_b64_d128", {0, 70, 1}, {64, 64 * 40 + 17, 1}, 4, 1,
                       128, 64, SA_MASK_CAUSAL));
  return v;
}

// A forward case on one implementation: the portable forward, or the sm90 one (name + "Sm90").
struct ImplCase {
  VarlenCase c;
  sa_impl impl;
  std::string name;
};
void PrintTo(const ImplCase& c, std::ostream* os) { *os << c.name; }

std::vector<ImplCase> impl_cases() {
  std::vector<ImplCase> out;
  for (const VarlenCase& c : forward_cases()) out.push_back({c, SA_IMPL_PORTABLE, c.name});
  for (const VarlenCase& c : forward_cases()) out.push_back({c, SA_IMPL_SM90, c.name + "Sm90"});
  return out;
}

class GpuBsaVarlenForward : public ::testing::TestWithParam<ImplCase> {};

TEST_P(GpuBsaVarlenForward, MatchesReference) {
  SA_SKIP_WITHOUT_GPU();
  const sa_impl impl = GetParam().impl;
  if (impl == SA_IMPL_SM90 && !sm90_runs())
    GTEST_SKIP() << "needs an sm_90 device and the sm90 path";
  const VarlenCase& c = GetParam().c;
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  Packed p(c, rng);
  DeviceForward d(p, 8);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(d.poison(nullptr));
  sa_cpp::BsaForwardArgs a;
  d.args(a, p, c);
  a.options.impl = impl;
  sa_impl used = SA_IMPL_AUTO;
  sa_context ctx = sa_context_default();
  ctx.impl_used = &used;
  ASSERT_EQ(sa_bsa_forward(&a, &ctx), SA_OK) << sa_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(used, impl);
  expect_forward_matches(d, p, c);
}

INSTANTIATE_TEST_SUITE_P(GpuBsaVarlen, GpuBsaVarlenForward, ::testing::ValuesIn(impl_cases()),
                         [](const ::testing::TestParamInfo<ImplCase>& i) { return i.param.name; });

// AUTO runs the sm90 forward and backward on an sm_90 device (else the portable ones); forced
// sm90 with options.validate is refused by name by both, writing nothing.
TEST(GpuBsaVarlen, AutoRunsSm90ForwardAndBackward) {
  SA_SKIP_WITHOUT_GPU();
  const VarlenCase c = gpu_case("gate", {70, 60}, {70, 60}, 2, 2, 64, 64, SA_MASK_NONE);
  std::mt19937_64 rng(1);
  Packed p(c, rng);
  DeviceForward d(p, 0);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(d.poison(nullptr));
  {
    sa_cpp::BsaForwardArgs a;
    d.args(a, p, c);
    a.options.impl = SA_IMPL_SM90;
    a.options.validate = 1;
    const sa_cpp::Status st = sa_cpp::bsa_forward(a);
    EXPECT_EQ(st.code(), SA_ERROR_UNSUPPORTED) << st.to_string();
    // Checked before the device: the same reason on every machine with the sm90 path built.
    const char* why = SA_HAVE_SM90 ? "options.validate with packed batches" : "sm90";
    EXPECT_NE(st.message().find(why), std::string::npos) << st.message();
  }
  HostTensor o(p.o.dtype(), p.o.shape());
  ASSERT_TRUE(d.o.download(o));
  for (double x : o.to_double()) ASSERT_TRUE(std::isnan(x)) << "an output was touched";
  {
    sa_cpp::BsaForwardArgs a;
    d.args(a, p, c);
    a.options.impl = SA_IMPL_AUTO;
    sa_impl used = SA_IMPL_AUTO;
    sa_context ctx = sa_context_default();
    ctx.impl_used = &used;
    ASSERT_EQ(sa_bsa_forward(&a, &ctx), SA_OK) << sa_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(used, sm90_runs() ? SA_IMPL_SM90 : SA_IMPL_PORTABLE);
    expect_forward_matches(d, p, c);
  }

  // The backward: AUTO runs sm90 on an sm_90 device, forced portable the portable kernels; forced
  // sm90 with options.validate refuses by name before touching dq, dk, dv; forced sm90 runs.
  DeviceTensor dout(p.dout, 0, 0), dq(p.dq, 0, 0), dk(p.dk, 0, 0), dv(p.dv, 0, 0);
  ASSERT_TRUE(dout.ok() && dq.ok() && dk.ok() && dv.ok());
  // The forward's packed problem with the gradient tensors.
  auto bwd_args = [&] {
    sa_cpp::BsaForwardArgs f;
    d.args(f, p, c);
    sa_cpp::BsaBackwardArgs a;
    a.q = f.q;
    a.k = f.k;
    a.v = f.v;
    a.o = f.o;
    a.lse = f.lse;
    a.dout = dout.view();
    a.dq = dq.view();
    a.dk = dk.view();
    a.dv = dv.view();
    a.sparsity = f.sparsity;
    a.options = f.options;
    return a;
  };
  {
    ASSERT_TRUE(dq.poison(nullptr) && dk.poison(nullptr) && dv.poison(nullptr));
    sa_cpp::BsaBackwardArgs a = bwd_args();
    a.options.impl = SA_IMPL_SM90;
    a.options.validate = 1;
    const sa_cpp::Status st = sa_cpp::bsa_backward(a);
    EXPECT_EQ(st.code(), SA_ERROR_UNSUPPORTED) << st.to_string();
    const char* why = SA_HAVE_SM90 ? "options.validate with packed batches" : "sm90";
    EXPECT_NE(st.message().find(why), std::string::npos) << st.message();
    for (const DeviceTensor* t : {&dq, &dk, &dv}) {
      HostTensor h(p.dq.dtype(), t == &dq ? p.dq.shape() : p.dk.shape());
      ASSERT_TRUE(t->download(h));
      for (double x : h.to_double()) ASSERT_TRUE(std::isnan(x)) << "an output was touched";
    }
  }
  std::vector<sa_impl> impls = {SA_IMPL_AUTO, SA_IMPL_PORTABLE};
  if (sm90_runs()) impls.push_back(SA_IMPL_SM90);
  for (sa_impl impl : impls) {
    SCOPED_TRACE(sa_impl_name(impl));
    sa_cpp::BsaBackwardArgs a = bwd_args();
    a.options.impl = impl;
    size_t bytes = 0;
    ASSERT_EQ(sa_bsa_backward_workspace_size(&a, &bytes), SA_OK) << sa_last_error();
    DeviceBuffer workspace(bytes);
    ASSERT_TRUE(bytes == 0 || workspace.ok());
    sa_impl used = SA_IMPL_AUTO;
    sa_context ctx = sa_context_default();
    ctx.workspace = workspace.get();
    ctx.workspace_bytes = bytes;
    ctx.impl_used = &used;
    ASSERT_EQ(sa_bsa_backward(&a, &ctx), SA_OK) << sa_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(used, impl == SA_IMPL_PORTABLE || !sm90_runs() ? SA_IMPL_PORTABLE : SA_IMPL_SM90);
  }
}

// A graph captured on one set of offsets replays correctly with others of the same shapes: the
// launch reads cu_seqlens on the device only (the portable forward and the sm90 one, whose TMA
// descriptors describe the packed tensors by shape).
class GpuBsaVarlenGraph : public ::testing::TestWithParam<sa_impl> {};

TEST_P(GpuBsaVarlenGraph, ReplaysWithNewOffsets) {
  SA_SKIP_WITHOUT_GPU();
  const sa_impl impl = GetParam();
  if (impl == SA_IMPL_SM90 && !sm90_runs())
    GTEST_SKIP() << "needs an sm_90 device and the sm90 path";
  VarlenCase c = gpu_case("replay_a", {100, 60}, {80, 90}, 4, 2, 64, 64, SA_MASK_CAUSAL);
  std::mt19937_64 rng(5);
  Packed p(c, rng);
  DeviceForward d(p, 8);
  ASSERT_TRUE(d.ok());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  sa_cpp::BsaForwardArgs a;
  d.args(a, p, c);
  a.options.impl = impl;
  sa_context ctx = sa_context_default();
  ctx.stream = stream;
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const sa_status status = sa_bsa_forward(&a, &ctx);
  const std::string error = status == SA_OK ? "" : sa_last_error();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(status, SA_OK) << error;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    if (replay == 1) {
      // Same T_q = 160, T_kv = 170, N_q_max = 2 and K_max = 3; other offsets and metadata.
      c.name = "replay_b";
      c.sq = {120, 40};
      c.skv = {110, 60};
      std::mt19937_64 rng_b(6);
      p = Packed(c, rng_b);
      ASSERT_TRUE(d.upload(p));
    }
    ASSERT_TRUE(d.poison(stream));
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    expect_forward_matches(d, p, c);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(GpuBsaVarlen, GpuBsaVarlenGraph,
                         ::testing::Values(SA_IMPL_PORTABLE, SA_IMPL_SM90),
                         [](const ::testing::TestParamInfo<sa_impl>& i) {
                           return std::string(i.param == SA_IMPL_SM90 ? "Sm90" : "Portable");
                         });

// ---- the sm90 forward's tile order -------------------------------------------------------------
// Packed batches with empty and one-token sequences between long causal ones: B x H_q x N_q_max =
// 672 and 336 tiles (several per CTA; most of the short sequences' lie past their end and load
// nothing), block 64 (key-split) and block 128.
std::vector<VarlenCase> dynamic_tile_cases() {
  return {gpu_case("dyn_mixed_causal_b64_d64", {0, 1, 700, 1, 0, 1500, 129},
                   {0, 1, 700, 1, 0, 1500, 129}, 4, 2, 64, 64, SA_MASK_CAUSAL),
          gpu_case("dyn_mixed_causal_b128_d128", {1, 0, 900, 1, 1500, 0, 257},
                   {1, 5, 900, 200, 1500, 0, 257}, 4, 1, 128, 128, SA_MASK_CAUSAL)};
}

// o and lse of the device copies (guards checked, no NaN left).
::testing::AssertionResult download_forward(const DeviceForward& d, const Packed& p,
                                            HostTensor* o, HostTensor* lse) {
  *o = HostTensor(p.o.dtype(), p.o.shape());
  *lse = HostTensor(SA_DTYPE_FP32, p.lse.shape());
  if (auto r = d.o.download(*o); !r) return r;
  if (auto r = d.lse.download(*lse); !r) return r;
  if (sa_test::any_nan(o->to_double()) || sa_test::any_nan(lse->to_double()))
    return ::testing::AssertionFailure() << "NaN left in an output";
  return ::testing::AssertionSuccess();
}

// Dynamic tiles (Tuning::sm90_fwd_dyn 2, the counter in a workspace full of garbage) against the
// static order (1) and the rule without a workspace (the static fallback): the same bytes; the
// dynamic result also against the fp64 reference.
TEST(GpuBsaVarlen, Sm90DynamicTilesEqualStaticBitwise) {
  SA_SKIP_WITHOUT_GPU();
  if (!sm90_runs()) GTEST_SKIP() << "needs an sm_90 device and the sm90 path";
  for (const VarlenCase& c : dynamic_tile_cases()) {
    SCOPED_TRACE(c.name);
    std::mt19937_64 rng(std::hash<std::string>{}(c.name));
    Packed p(c, rng);
    DeviceForward d(p, 8);
    ASSERT_TRUE(d.ok());
    sa_cpp::BsaForwardArgs a;
    d.args(a, p, c);
    a.options.impl = SA_IMPL_SM90;
    HostTensor o_want, lse_want;
    ASSERT_TRUE(d.poison(nullptr));
    ASSERT_TRUE(sa_test::run_bsa_forward_tiles(a, 1, true));
    ASSERT_TRUE(download_forward(d, p, &o_want, &lse_want));
    const std::pair<int32_t, bool> runs[] = {{2, true}, {0, false}, {0, true}};
    for (const auto& [tiles, workspace_given] : runs) {
      SCOPED_TRACE("tuning " + std::to_string(tiles) + (workspace_given ? "" : ", no workspace"));
      ASSERT_TRUE(d.poison(nullptr));
      ASSERT_TRUE(sa_test::run_bsa_forward_tiles(a, tiles, workspace_given));
      HostTensor o, lse;
      ASSERT_TRUE(download_forward(d, p, &o, &lse));
      EXPECT_TRUE(sa_test::bitwise_equal(o, o_want)) << "o differs from the static order's";
      EXPECT_TRUE(sa_test::bitwise_equal(lse, lse_want)) << "lse differs from the static order's";
      if (tiles == 2) expect_forward_matches(d, p, c);
    }
  }
}

// A graph captured with dynamic tiles replays twice, the counter full of garbage before each
// replay (the captured memset zeroes it): the static order's bytes each time.
TEST(GpuBsaVarlen, Sm90DynamicTilesGraphReplaysResetTheCounter) {
  SA_SKIP_WITHOUT_GPU();
  if (!sm90_runs()) GTEST_SKIP() << "needs an sm_90 device and the sm90 path";
  const VarlenCase c = dynamic_tile_cases()[0];
  std::mt19937_64 rng(std::hash<std::string>{}(c.name) + 1);
  Packed p(c, rng);
  DeviceForward d(p, 8);
  ASSERT_TRUE(d.ok());
  sa_cpp::BsaForwardArgs a;
  d.args(a, p, c);
  a.options.impl = SA_IMPL_SM90;
  HostTensor o_want, lse_want;
  ASSERT_TRUE(d.poison(nullptr));
  ASSERT_TRUE(sa_test::run_bsa_forward_tiles(a, 1, true));
  ASSERT_TRUE(download_forward(d, p, &o_want, &lse_want));
  sa_test::replay_bsa_forward_graph(
      a, 2, 2, [&](cudaStream_t stream) { return d.poison(stream); },
      [&](int) {
        HostTensor o, lse;
        ASSERT_TRUE(download_forward(d, p, &o, &lse));
        EXPECT_TRUE(sa_test::bitwise_equal(o, o_want)) << "o differs from the static order's";
        EXPECT_TRUE(sa_test::bitwise_equal(lse, lse_want)) << "lse differs from the static order's";
      });
}

// ---- backward ----------------------------------------------------------------------------------
// The device copies of a packed problem's backward tensors: inputs with `pad` NaN elements past
// every row, outputs (dq, dk, dv) poisoned and followed by NaN guards.
struct DeviceBackward {
  DeviceTensor q, k, v, o, lse, dout, dq, dk, dv, cu_q, cu_k, index, count;
  DeviceBackward(const Packed& p, int64_t pad)
      : q(p.q, pad, 0), k(p.k, pad, 0), v(p.v, pad, 0), o(p.o, pad, 0), lse(p.lse, 0, 0),
        dout(p.dout, pad, 0), dq(p.dq, pad, 64 * p.dq.shape()[2]),
        dk(p.dk, pad, 64 * p.dk.shape()[2]), dv(p.dv, pad, 64 * p.dv.shape()[2]),
        cu_q(p.cu_q, 0, 0), cu_k(p.cu_k, 0, 0), index(p.index, 0, 0), count(p.count, 0, 0) {}
  bool ok() const {
    return q.ok() && k.ok() && v.ok() && o.ok() && lse.ok() && dout.ok() && dq.ok() && dk.ok() &&
           dv.ok() && cu_q.ok() && cu_k.ok() && index.ok() && count.ok();
  }
  // New input values of the same shapes (o and lse included).
  bool upload(const Packed& p) {
    return q.upload(p.q) && k.upload(p.k) && v.upload(p.v) && o.upload(p.o) &&
           lse.upload(p.lse) && dout.upload(p.dout) && cu_q.upload(p.cu_q) &&
           cu_k.upload(p.cu_k) && index.upload(p.index) && count.upload(p.count);
  }
  bool poison(cudaStream_t stream) {
    return dq.poison(stream) && dk.poison(stream) && dv.poison(stream);
  }
  sa_bsa_bwd_args args(Packed& p, const VarlenCase& c) const {
    sa_bsa_bwd_args a = sa_bsa_bwd_args_default();
    p.bwd_args(a, c);
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.o = o.view();
    a.lse = lse.view();
    a.dout = dout.view();
    a.dq = dq.view();
    a.dk = dk.view();
    a.dv = dv.view();
    a.sparsity.q2k_index = index.view();
    a.sparsity.q2k_count = count.view();
    a.options.cu_seqlens_q = cu_q.view();
    a.options.cu_seqlens_k = cu_k.view();
    return a;
  }
};

// o (rounded to the case's dtype) and lse of the fp64 reference forward, into p.o and p.lse.
void fill_forward(Packed& p, const VarlenCase& c) {
  HostTensor o64, lse;
  reference_forward(p, c, &o64, &lse);
  for (int64_t i = 0; i < o64.numel(); ++i) p.o.set(i, o64.get(i));
  for (int64_t i = 0; i < lse.numel(); ++i) p.lse.set(i, lse.get(i));
}

// The fp64 reference's dq, dk, dv on fp64 copies of the backward's inputs (o as the GPU sees it).
void reference_backward(Packed& p, const VarlenCase& c, std::vector<double>* dq,
                        std::vector<double>* dk, std::vector<double>* dv) {
  HostTensor q64 = sa_test::to_fp64(p.q), k64 = sa_test::to_fp64(p.k),
             v64 = sa_test::to_fp64(p.v), o64 = sa_test::to_fp64(p.o),
             do64 = sa_test::to_fp64(p.dout);
  HostTensor dq64(SA_DTYPE_FP64, p.dq.shape()), dk64(SA_DTYPE_FP64, p.dk.shape()),
      dv64(SA_DTYPE_FP64, p.dv.shape());
  sa_cpp::BsaBackwardArgs a;
  p.bwd_args(a, c);
  a.q = q64.view();
  a.k = k64.view();
  a.v = v64.view();
  a.o = o64.view();
  a.dout = do64.view();
  a.dq = dq64.view();
  a.dk = dk64.view();
  a.dv = dv64.view();
  a.options.impl = SA_IMPL_REFERENCE;
  ASSERT_EQ(sa_bsa_backward(&a, nullptr), SA_OK) << sa_last_error();
  *dq = dq64.to_double();
  *dk = dk64.to_double();
  *dv = dv64.to_double();
}

struct Gradients {
  HostTensor dq, dk, dv;
};

// Downloads dq, dk, dv (failing when padding or guards were written).
::testing::AssertionResult download(const DeviceBackward& d, const Packed& p, Gradients* g) {
  g->dq = HostTensor(p.dq.dtype(), p.dq.shape());
  g->dk = HostTensor(p.dk.dtype(), p.dk.shape());
  g->dv = HostTensor(p.dv.dtype(), p.dv.shape());
  ::testing::AssertionResult r = d.dq.download(g->dq);
  if (!r) return r << " (dq)";
  r = d.dk.download(g->dk);
  if (!r) return r << " (dk)";
  r = d.dv.download(g->dv);
  if (!r) return r << " (dv)";
  return ::testing::AssertionSuccess();
}

// Pass: no NaN; rel L2 of dq, dk, dv below 1e-2 (dq, dk against at least 1e-3 of dv's norm, as
// in gpu_test_util.hpp: dS cancels to exactly 0 in fp64 where a row sees one key); dq exactly 0 in
// rows with lse = -inf (no key); dk = dv = 0 exactly for every (key, KV head) the reference gives
// a zero dv row (nobody attends it: keys of sequences without queries among them).
void expect_backward_matches(const Gradients& g, Packed& p, const VarlenCase& c) {
  std::vector<double> want_dq, want_dk, want_dv;
  reference_backward(p, c, &want_dq, &want_dk, &want_dv);
  const std::vector<double> dq = g.dq.to_double(), dk = g.dk.to_double(), dv = g.dv.to_double();
  EXPECT_FALSE(sa_test::any_nan(dq)) << "NaN in dq";
  EXPECT_FALSE(sa_test::any_nan(dk)) << "NaN in dk";
  EXPECT_FALSE(sa_test::any_nan(dv)) << "NaN in dv";
  const double floor = 1e-3 * sa_test::l2_norm(want_dv);
  EXPECT_LT(sa_test::rel_l2_floor(dq, want_dq, floor), 1e-2) << "rel L2 of dq";
  EXPECT_LT(sa_test::rel_l2_floor(dk, want_dk, floor), 1e-2) << "rel L2 of dk";
  EXPECT_LT(sa_test::rel_l2_floor(dv, want_dv, floor), 1e-2) << "rel L2 of dv";
  const int64_t D = c.D;
  for (int64_t h = 0; h < c.Hq; ++h)
    for (int64_t t = 0; t < p.Tq; ++t) {
      if (p.lse.get(h * p.Tq + t) != -INFINITY) continue;
      for (int64_t x = 0; x < D; ++x)
        ASSERT_EQ(dq[static_cast<size_t>((t * c.Hq + h) * D + x)], 0.0)
            << "dq of a row without keys, t=" << t << " h=" << h;
    }
  for (int64_t t = 0; t < p.Tkv; ++t)
    for (int64_t hk = 0; hk < c.Hkv; ++hk) {
      const size_t row = static_cast<size_t>((t * c.Hkv + hk) * D);
      bool unattended = true;
      for (int64_t x = 0; x < D && unattended; ++x) unattended = want_dv[row + x] == 0.0;
      if (!unattended) continue;
      for (int64_t x = 0; x < D; ++x) {
        ASSERT_EQ(dk[row + x], 0.0) << "dk of an unattended key, t=" << t << " hk=" << hk;
        ASSERT_EQ(dv[row + x], 0.0) << "dv of an unattended key, t=" << t << " hk=" << hk;
      }
    }
}

constexpr int32_t kSingleOwner = 1 << 30;  // a bucket no row reaches: one group per row

struct VarlenBwdCase {
  VarlenCase base;
  int32_t bucket;  // options.bucket_size: 0 automatic, kSingleOwner, or a split size
  bool deterministic;
  std::string name;
  sa_impl impl = SA_IMPL_PORTABLE;
  // Sequences whose q and dout (nan_q) or k and v (nan_kv) are NaN, set after the reference
  // forward: sequences without keys (nan_q) or without queries (nan_kv), whose tokens the crossing
  // tiles and blocks of their neighbours load. Their gradients are exact zeros.
  std::vector<int64_t> nan_q, nan_kv;
};
void PrintTo(const VarlenBwdCase& c, std::ostream* os) { *os << c.name; }

// NaN into the q and dout tokens of the sequences c.nan_q and the k and v tokens of c.nan_kv.
void poison_neighbours(Packed& p, const VarlenBwdCase& c) {
  const VarlenCase& v = c.base;
  for (int64_t b : c.nan_q) {
    const int64_t n = v.sq[static_cast<size_t>(b)] * v.Hq;
    for (int64_t i = p.q0[b] * v.Hq * v.D; i < (p.q0[b] * v.Hq + n) * v.D; ++i) p.q.set(i, NAN);
    for (int64_t i = p.q0[b] * v.Hq * v.Dv; i < (p.q0[b] * v.Hq + n) * v.Dv; ++i)
      p.dout.set(i, NAN);
  }
  for (int64_t b : c.nan_kv) {
    const int64_t n = v.skv[static_cast<size_t>(b)] * v.Hkv;
    for (int64_t i = p.k0[b] * v.Hkv * v.D; i < (p.k0[b] * v.Hkv + n) * v.D; ++i) p.k.set(i, NAN);
    for (int64_t i = p.k0[b] * v.Hkv * v.Dv; i < (p.k0[b] * v.Hkv + n) * v.Dv; ++i)
      p.v.set(i, NAN);
  }
}

// The cases on the portable backward (name as is) and the sm90 one (name + "Sm90").
std::vector<VarlenBwdCase> portable_backward_cases();
std::vector<VarlenBwdCase> backward_cases() {
  std::vector<VarlenBwdCase> out = portable_backward_cases();
  const size_t n = out.size();
  for (size_t i = 0; i < n; ++i) {
    VarlenBwdCase c = out[i];
    c.impl = SA_IMPL_SM90;
    c.name += "Sm90";
    out.push_back(c);
  }
  return out;
}

std::vector<VarlenBwdCase> portable_backward_cases() {
  std::vector<VarlenBwdCase> out;
  for (const VarlenCase& c : forward_cases()) {
    if (c.dtype != SA_DTYPE_BF16) continue;  // the portable backward is bf16
    out.push_back({c, 0, false, c.name + "_bucket_auto"});
    out.push_back({c, kSingleOwner, false, c.name + "_single_owner"});
    out.push_back({c, 2, false, c.name + "_bucket2"});
    out.push_back({c, 0, true, c.name + "_deterministic"});
  }
  // Many short sequences (most reverse rows past their sequence's end), one of one token.
  VarlenCase many =
      gpu_case("gqa_many_short_causal_b64_d64", {1, 9, 0, 30, 64, 3, 17, 2, 65, 40},
               {1, 9, 5, 30, 64, 3, 0, 2, 65, 41}, 4, 2, 64, 64, SA_MASK_CAUSAL);
  out.push_back({many, 0, false, many.name + "_bucket_auto"});
  out.push_back({many, 3, false, many.name + "_bucket3"});
  out.push_back({many, 0, true, many.name + "_deterministic"});
  // A sequence whose last query tile and last KV block cross into its neighbours: the next one
  // has queries and no keys (q, dout NaN: the crossing Q / dO tile loads them), the one after it
  // keys and no queries (k, v NaN: the crossing KV box loads them); a normal sequence follows.
  // Expected: finite, correct gradients everywhere, exact zeros for the NaN sequences (Hopper
  // hazards H1, H3: the producer zeroes the foreign Q / dO rows, padded keys are selected away).
  VarlenCase nan128 = gpu_case("nan_neighbours_gqa_causal_b128_d128", {100, 50, 0, 90},
                               {100, 0, 70, 90}, 4, 2, 128, 128, SA_MASK_CAUSAL);
  VarlenCase nan64 = gpu_case("nan_neighbours_gqa_causal_b64_d64", {40, 30, 0, 50},
                              {40, 0, 45, 50}, 4, 2, 64, 64, SA_MASK_CAUSAL);
  for (const VarlenCase& c : {nan128, nan64}) {
    out.push_back({c, 0, false, c.name + "_bucket_auto", SA_IMPL_PORTABLE, {1}, {2}});
    out.push_back({c, kSingleOwner, false, c.name + "_single_owner", SA_IMPL_PORTABLE, {1}, {2}});
    out.push_back({c, 2, false, c.name + "_bucket2", SA_IMPL_PORTABLE, {1}, {2}});
  }
  // Single owner with 12 sequences of 65..127 keys (none a multiple of 64), H_kv 2: every
  // sequence's last KV block crosses into the next sequence's first one, whose CTA writes those
  // keys (H4: only the valid rows of a crossing 64-key box may be stored).
  VarlenCase cross = gpu_case("crossing_blocks_gqa_none_b128_d128",
                              {70, 127, 65, 100, 90, 66, 127, 80, 75, 111, 65, 99},
                              {65, 127, 66, 101, 90, 67, 126, 81, 75, 113, 65, 100}, 4, 2, 128,
                              128, SA_MASK_NONE);
  out.push_back({cross, kSingleOwner, false, cross.name + "_single_owner"});
  out.push_back({cross, 0, false, cross.name + "_bucket_auto"});
  // Block 128 with skv % 128 in (0, 64]: the second 64-key half of the last block lies wholly in
  // the next sequence (warpgroup 1's box: nothing stored; its part of every tile is hidden), and
  // S_q % 128 in (0, 64]: the second query tile of the last block is past the sequence (H9).
  VarlenCase half = gpu_case("crossing_half_gqa_causal_b128_d64", {130, 40, 192, 64, 1},
                             {130, 40, 192, 64, 1}, 4, 2, 64, 128, SA_MASK_CAUSAL);
  out.push_back({half, kSingleOwner, false, half.name + "_single_owner"});
  out.push_back({half, 0, false, half.name + "_bucket_auto"});
  out.push_back({half, 0, true, half.name + "_deterministic"});
  return out;
}

// One backward on the default stream with a queried workspace full of garbage; outputs poisoned.
::testing::AssertionResult run_backward(DeviceBackward& d, Packed& p, const VarlenBwdCase& c,
                                        Gradients* g) {
  if (!d.poison(nullptr)) return ::testing::AssertionFailure() << "poison failed";
  sa_bsa_bwd_args a = d.args(p, c.base);
  a.options.bucket_size = c.bucket;
  a.options.deterministic = c.deterministic ? 1 : 0;
  a.options.impl = c.impl;
  size_t bytes = 0;
  if (sa_bsa_backward_workspace_size(&a, &bytes) != SA_OK)
    return ::testing::AssertionFailure() << "workspace size: " << sa_last_error();
  DeviceBuffer workspace(bytes);
  if (bytes > 0 && (!workspace.ok() || cudaMemset(workspace.get(), 0xff, bytes) != cudaSuccess))
    return ::testing::AssertionFailure() << "workspace";
  sa_impl used = SA_IMPL_AUTO;
  sa_context ctx = sa_context_default();
  ctx.workspace = workspace.get();
  ctx.workspace_bytes = bytes;
  ctx.impl_used = &used;
  if (sa_bsa_backward(&a, &ctx) != SA_OK)
    return ::testing::AssertionFailure() << "sa_bsa_backward: " << sa_last_error();
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess)
    return ::testing::AssertionFailure() << "kernel failed: " << cudaGetErrorString(err);
  if (used != c.impl) return ::testing::AssertionFailure() << "ran " << sa_impl_name(used);
  return download(d, p, g);
}

class GpuBsaVarlenBackward : public ::testing::TestWithParam<VarlenBwdCase> {};

TEST_P(GpuBsaVarlenBackward, MatchesReference) {
  SA_SKIP_WITHOUT_GPU();
  const VarlenBwdCase& c = GetParam();
  if (c.impl == SA_IMPL_SM90 && !sm90_runs())
    GTEST_SKIP() << "needs an sm_90 device and the sm90 path";
  std::mt19937_64 rng(std::hash<std::string>{}(c.base.name));
  Packed p(c.base, rng);
  fill_forward(p, c.base);
  poison_neighbours(p, c);
  DeviceBackward d(p, 8);
  ASSERT_TRUE(d.ok());
  Gradients g;
  ASSERT_TRUE(run_backward(d, p, c, &g));
  expect_backward_matches(g, p, c.base);
  if (!c.deterministic) return;
  for (int run = 1; run < 3; ++run) {
    Gradients again;
    ASSERT_TRUE(run_backward(d, p, c, &again));
    EXPECT_TRUE(sa_test::bitwise_equal(again.dq, g.dq)) << "dq differs on run " << run;
    EXPECT_TRUE(sa_test::bitwise_equal(again.dk, g.dk)) << "dk differs on run " << run;
    EXPECT_TRUE(sa_test::bitwise_equal(again.dv, g.dv)) << "dv differs on run " << run;
  }
}

INSTANTIATE_TEST_SUITE_P(GpuBsaVarlen, GpuBsaVarlenBackward,
                         ::testing::ValuesIn(backward_cases()),
                         [](const ::testing::TestParamInfo<VarlenBwdCase>& i) {
                           return i.param.name;
                         });

// The Hopper backward under forced tuning values (Tuning::sm90_bsa_bwd_stats / _full): a packed
// call runs the rule's kernel whatever they say (bsa_backward_varlen.cu), never the full-block
// path (H11: every sequence here has a partial last block although T_kv % block == 0).
TEST(GpuBsaVarlen, Sm90BackwardIgnoresTuningVariants) {
  SA_SKIP_WITHOUT_GPU();
  if (!sm90_runs()) GTEST_SKIP() << "needs an sm_90 device and the sm90 path";
  for (int32_t block : {64, 128}) {
    // T_kv = 256, a multiple of both blocks; no sequence's length is.
    const VarlenCase c = gpu_case(block == 64 ? "tuning_b64" : "tuning_b128", {100, 90, 66},
                                  {100, 90, 66}, 4, 2, 128, block, SA_MASK_CAUSAL);
    std::mt19937_64 rng(11);
    Packed p(c, rng);
    fill_forward(p, c);
    DeviceBackward d(p, 8);
    ASSERT_TRUE(d.ok());
    for (const auto& [stats, full] :
         std::vector<std::pair<int, int>>{{0, 0}, {1, 0}, {0, 1}, {1, 1}}) {
      SCOPED_TRACE("block " + std::to_string(block) + " stats " + std::to_string(stats) +
                   " full " + std::to_string(full));
      sa::detail::Tuning t;
      t.sm90_bsa_bwd_stats = stats;
      t.sm90_bsa_bwd_full = full;
      const sa::detail::ScopedTuning tune(t);
      const VarlenBwdCase bc{c, kSingleOwner, false, c.name, SA_IMPL_SM90};
      Gradients g;
      ASSERT_TRUE(run_backward(d, p, bc, &g));
      expect_backward_matches(g, p, c);
    }
  }
}

// cu_seqlens_k outside the contract (not monotonic: two sequences each span all T_kv keys) makes
// more reverse rows live than the work-item bound counts (H_kv (T_kv + B (block - 1)) / block,
// cuda/reverse_map_gpu.hpp). The items past it are dropped: the call finishes (the sm90 dQ
// conversion waits only for the items that run), and nothing is written past any output
// (padding and guards checked by the download). The gradients' values are unspecified.
TEST(GpuBsaVarlen, BackwardWithNonMonotonicCuSeqlensKStaysInBounds) {
  SA_SKIP_WITHOUT_GPU();
  for (int32_t block : {64, 128}) {
    const VarlenCase c = gpu_case(block == 64 ? "nonmono_b64" : "nonmono_b128", {64, 64, 64},
                                  {100, 100, 104}, 4, 2, 64, block, SA_MASK_NONE);
    std::mt19937_64 rng(21);
    Packed p(c, rng);
    fill_forward(p, c);
    // Sequences 0 and 2 read as [0, 304); sequence 1 as empty (its start clamped to 304).
    const int64_t T = p.Tkv;
    const std::vector<int64_t> cu = {0, T, 0, T};
    for (int64_t b = 0; b <= p.B; ++b) p.cu_k.set(b, static_cast<double>(cu[b]));
    DeviceBackward d(p, 8);
    ASSERT_TRUE(d.ok());
    for (const sa_impl impl : {SA_IMPL_PORTABLE, SA_IMPL_SM90}) {
      if (impl == SA_IMPL_SM90 && !sm90_runs()) continue;
      for (const int32_t bucket : {0, kSingleOwner, 2}) {
        SCOPED_TRACE("block " + std::to_string(block) + " " + sa_impl_name(impl) + " bucket " +
                     std::to_string(bucket));
        const VarlenBwdCase bc{c, bucket, false, c.name, impl, {}, {}};
        Gradients g;
        ASSERT_TRUE(run_backward(d, p, bc, &g));
      }
    }
  }
}

// A backward graph captured on one set of offsets replays correctly with others of the same
// shapes (B, T_q, T_kv, N_q_max, K_max): grids and workspace depend on shapes only, cu_seqlens is
// read on the device. Every bucket mode, and deterministic mode; the portable backward and the
// sm90 one (whose replay moves the empty sequence and changes which blocks cross).
class GpuBsaVarlenBackwardGraph : public ::testing::TestWithParam<sa_impl> {};

TEST_P(GpuBsaVarlenBackwardGraph, ReplaysWithNewOffsets) {
  SA_SKIP_WITHOUT_GPU();
  const sa_impl impl = GetParam();
  if (impl == SA_IMPL_SM90 && !sm90_runs())
    GTEST_SKIP() << "needs an sm_90 device and the sm90 path";
  for (const auto& [bucket, deterministic] :
       std::vector<std::pair<int32_t, bool>>{{0, false}, {kSingleOwner, false}, {2, false},
                                             {0, true}}) {
    SCOPED_TRACE("bucket " + std::to_string(bucket) + (deterministic ? " deterministic" : ""));
    VarlenCase c = gpu_case("replay_a", {100, 60, 0}, {80, 90, 20}, 4, 2, 64, 64,
                            SA_MASK_CAUSAL);
    std::mt19937_64 rng(5);
    Packed p(c, rng);
    fill_forward(p, c);
    DeviceBackward d(p, 8);
    ASSERT_TRUE(d.ok());
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    sa_bsa_bwd_args a = d.args(p, c);
    a.options.bucket_size = bucket;
    a.options.deterministic = deterministic ? 1 : 0;
    a.options.impl = impl;
    size_t bytes = 0;
    ASSERT_EQ(sa_bsa_backward_workspace_size(&a, &bytes), SA_OK) << sa_last_error();
    DeviceBuffer workspace(bytes);
    ASSERT_TRUE(bytes == 0 || workspace.ok());
    sa_context ctx = sa_context_default();
    ctx.stream = stream;
    ctx.workspace = workspace.get();
    ctx.workspace_bytes = bytes;
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const sa_status status = sa_bsa_backward(&a, &ctx);
    const std::string error = status == SA_OK ? "" : sa_last_error();
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_EQ(status, SA_OK) << error;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int replay = 0; replay < 2; ++replay) {
      SCOPED_TRACE("replay " + std::to_string(replay));
      if (replay == 1) {
        // Same B = 3, T_q = 160, T_kv = 190, N_q_max = 2 and K_max = 3; other offsets (the
        // empty sequence moved, keys without queries, one key) and metadata.
        c.name = "replay_b";
        c.sq = {0, 32, 128};
        c.skv = {1, 61, 128};
        std::mt19937_64 rng_b(6);
        p = Packed(c, rng_b);
        ASSERT_EQ(p.Nq, 2);
        ASSERT_EQ(p.Kmax, 3);
        fill_forward(p, c);
        ASSERT_TRUE(d.upload(p));
      }
      ASSERT_TRUE(d.poison(stream));
      ASSERT_EQ(cudaMemsetAsync(workspace.get(), 0xff, bytes, stream), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      Gradients g;
      ASSERT_TRUE(download(d, p, &g));
      expect_backward_matches(g, p, c);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

INSTANTIATE_TEST_SUITE_P(GpuBsaVarlen, GpuBsaVarlenBackwardGraph,
                         ::testing::Values(SA_IMPL_PORTABLE, SA_IMPL_SM90),
                         [](const ::testing::TestParamInfo<sa_impl>& i) {
                           return std::string(i.param == SA_IMPL_SM90 ? "Sm90" : "Portable");
                         });

}  // namespace
