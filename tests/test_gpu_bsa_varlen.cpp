// GPU tests of BSA packed batches (SPEC 4; skip without a GPU).
//
// The portable forward and the Hopper (sm90) forward take packed batches; AUTO prefers the sm90
// one on an sm_90 device. Every case runs on both (the sm90 ones named + "Sm90", skipped unless
// the device is sm_90 and the Hopper path is built), against the fp64 reference on the same
// packed problem (fp64 copies of the inputs): empty sequences, one-token sequences, sequences
// shorter than a block, partial blocks, S_q != S_kv per sequence, queries without keys, MHA / GQA
// / MQA, every mask, block 64 and 128, rows of N_q_max past every sequence, rows listing more
// than 32 blocks, NaN-poisoned outputs with NaN padding and guards that must come back
// untouched. A captured graph replays with new cu_seqlens and metadata values (grids depend on
// shapes only), on both forwards. The backward still refuses by name on every CUDA path.
//
// Filters: GpuBsaVarlen.* and GpuBsaVarlen/GpuBsaVarlenForward.*  (both match *GpuBsaVarlen*);
// the sm90 cases alone: '*GpuBsaVarlen*Sm90*'.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "bsa_varlen_case.hpp"
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

// AUTO runs the sm90 forward on an sm_90 device (else the portable one); forced sm90 with
// options.validate and every backward refuse by name, writing nothing.
TEST(GpuBsaVarlen, AutoPrefersSm90ForwardBackwardRefusesByName) {
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

  // The backward: not implemented for packed batches on any CUDA path yet.
  DeviceTensor dout(p.dout, 0, 0), dq(p.dq, 0, 0), dk(p.dk, 0, 0), dv(p.dv, 0, 0);
  ASSERT_TRUE(dout.ok() && dq.ok() && dk.ok() && dv.ok());
  std::vector<sa_impl> impls = {SA_IMPL_AUTO, SA_IMPL_PORTABLE};
  if (SA_HAVE_SM90) impls.push_back(SA_IMPL_SM90);
  for (sa_impl impl : impls) {
    SCOPED_TRACE(sa_impl_name(impl));
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
    a.options.impl = impl;
    const sa_cpp::Status st = sa_cpp::bsa_backward(a);
    EXPECT_EQ(st.code(), SA_ERROR_UNSUPPORTED) << st.to_string();
    EXPECT_NE(st.message().find("packed batches (options.cu_seqlens_q/k)"), std::string::npos)
        << st.message();
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

}  // namespace
