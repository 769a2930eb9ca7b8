// BSA packed (variable-length, THD) batches (SPEC 4) on the CPU, through the public API: the fp64
// reference's forward and backward on a packed batch against running each sequence separately
// through the dense-batch reference (fresh random inputs; the same arithmetic, so the results
// agree to rounding), over SPEC 4's edge cases by name; the named errors of cu_seqlens, shapes
// and values; the CUDA paths' refusals; a version-2 options struct reading as a dense batch.
//
// Tables of cases: BsaVarlen/BsaVarlenReference.MatchesPerSequence/*
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "bsa_varlen_case.hpp"
#include "common/narrow.hpp"
#include "sparse_attention/sparse_attention.h"
#include "sparse_attention/sparse_attention.hpp"
#include "test_util.hpp"

namespace {

namespace sa_cpp = sparse_attention;
using sa_test::HostTensor;
using sa_test::apply_mask;
using sa_test::cdiv;
using sa_test::Packed;
using sa_test::VarlenCase;

// Rows [t0, t0 + n) of a [T, H, X] tensor as doubles.
std::vector<double> rows(const HostTensor& t, int64_t t0, int64_t n) {
  const int64_t per = t.numel() / t.shape()[0];
  std::vector<double> out;
  for (int64_t i = t0 * per; i < (t0 + n) * per; ++i) out.push_back(t.get(i));
  return out;
}

// One sequence as a dense batch of one in layout BSHD ([1, S, H, D]: the THD rows as they are).
struct Single {
  HostTensor q, k, v, o, lse, dout, dq, dk, dv, index, count;
  Single(const VarlenCase& c, const Packed& p, int64_t b) {
    const int64_t sq = c.sq[b], skv = c.skv[b], nq = cdiv(sq, c.block);
    auto slice = [](const HostTensor& src, int64_t t0, int64_t n, int64_t H, int64_t X) {
      HostTensor t(src.dtype(), {1, n, H, X});
      for (int64_t i = 0; i < t.numel(); ++i) t.set(i, src.get(t0 * H * X + i));
      return t;
    };
    q = slice(p.q, p.q0[b], sq, c.Hq, c.D);
    k = slice(p.k, p.k0[b], skv, c.Hkv, c.D);
    v = slice(p.v, p.k0[b], skv, c.Hkv, c.Dv);
    dout = slice(p.dout, p.q0[b], sq, c.Hq, c.Dv);
    o = HostTensor(c.dtype, {1, sq, c.Hq, c.Dv});
    lse = HostTensor(SA_DTYPE_FP32, {1, c.Hq, sq});
    dq = HostTensor(c.dtype, {1, sq, c.Hq, c.D});
    dk = HostTensor(c.dtype, {1, skv, c.Hkv, c.D});
    dv = HostTensor(c.dtype, {1, skv, c.Hkv, c.Dv});
    for (HostTensor* t : {&o, &lse, &dq, &dk, &dv}) t->poison();
    index = HostTensor(SA_DTYPE_INT32, {1, c.Hq, nq, p.Kmax});
    count = HostTensor(SA_DTYPE_INT32, {1, c.Hq, nq});
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t m = 0; m < nq; ++m) {
        count.i32()[h * nq + m] = p.count.i32()[(b * c.Hq + h) * p.Nq + m];
        for (int64_t s = 0; s < p.Kmax; ++s)
          index.i32()[(h * nq + m) * p.Kmax + s] =
              p.index.i32()[((b * c.Hq + h) * p.Nq + m) * p.Kmax + s];
      }
  }
  void fwd_args(sa_bsa_fwd_args& a, const VarlenCase& c) {
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.o = o.view();
    a.lse = lse.view();
    a.sparsity.q2k_index = index.view();
    a.sparsity.q2k_count = count.view();
    apply_mask(c, a.options);
    a.options.layout = SA_LAYOUT_BSHD;
  }
};

class BsaVarlenReference : public ::testing::TestWithParam<VarlenCase> {};

TEST_P(BsaVarlenReference, MatchesPerSequence) {
  const VarlenCase& c = GetParam();
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  Packed p(c, rng);
  {
    sa_cpp::BsaForwardArgs a;
    p.fwd_args(a, c);
    const sa_cpp::Status st = sa_cpp::bsa_forward(a);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  {
    sa_cpp::BsaBackwardArgs a;
    p.bwd_args(a, c);
    const sa_cpp::Status st = sa_cpp::bsa_backward(a);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  for (HostTensor* t : {&p.o, &p.lse, &p.dq, &p.dk, &p.dv})
    ASSERT_FALSE(sa_test::any_nan(t->to_double())) << "an output element was not written";
  const double ninf = -std::numeric_limits<double>::infinity();
  for (int64_t b = 0; b < p.B; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b) + ": S_q = " + std::to_string(c.sq[b]) +
                 ", S_kv = " + std::to_string(c.skv[b]));
    const int64_t sq = c.sq[b], skv = c.skv[b];
    if (sq == 0 || skv == 0) {
      // No dense twin (a dense call needs S >= 1): no query sees a key, no key gets a gradient.
      for (double x : rows(p.o, p.q0[b], sq)) ASSERT_EQ(x, 0.0);
      for (double x : rows(p.dq, p.q0[b], sq)) ASSERT_EQ(x, 0.0);
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t i = 0; i < sq; ++i) ASSERT_EQ(p.lse.get(h * p.Tq + p.q0[b] + i), ninf);
      for (double x : rows(p.dk, p.k0[b], skv)) ASSERT_EQ(x, 0.0);
      for (double x : rows(p.dv, p.k0[b], skv)) ASSERT_EQ(x, 0.0);
      continue;
    }
    Single s(c, p, b);
    sa_cpp::BsaForwardArgs f;
    s.fwd_args(f, c);
    sa_cpp::Status st = sa_cpp::bsa_forward(f);
    ASSERT_TRUE(st.ok()) << st.to_string();
    sa_cpp::BsaBackwardArgs g;
    g.q = f.q;
    g.k = f.k;
    g.v = f.v;
    g.o = f.o;
    g.lse = f.lse;
    g.dout = s.dout.view();
    g.dq = s.dq.view();
    g.dk = s.dk.view();
    g.dv = s.dv.view();
    g.sparsity = f.sparsity;
    g.options = f.options;
    st = sa_cpp::bsa_backward(g);
    ASSERT_TRUE(st.ok()) << st.to_string();
    // The same fp64 arithmetic in the same order: equal up to the last rounding.
    EXPECT_TRUE(sa_test::all_close(rows(p.o, p.q0[b], sq), s.o.to_double(), 1e-12, 1e-12)) << "o";
    std::vector<double> lse_packed, lse_single = s.lse.to_double();
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < sq; ++i) lse_packed.push_back(p.lse.get(h * p.Tq + p.q0[b] + i));
    EXPECT_TRUE(sa_test::all_close(lse_packed, lse_single, 0.0, 0.0)) << "lse";
    EXPECT_TRUE(sa_test::all_close(rows(p.dq, p.q0[b], sq), s.dq.to_double(), 1e-12, 1e-12))
        << "dq";
    EXPECT_TRUE(sa_test::all_close(rows(p.dk, p.k0[b], skv), s.dk.to_double(), 1e-12, 1e-12))
        << "dk";
    EXPECT_TRUE(sa_test::all_close(rows(p.dv, p.k0[b], skv), s.dv.to_double(), 1e-12, 1e-12))
        << "dv";
  }
}

VarlenCase vcase(std::string name, std::vector<int64_t> sq, std::vector<int64_t> skv) {
  VarlenCase c;
  c.name = std::move(name);
  c.sq = std::move(sq);
  c.skv = std::move(skv);
  return c;
}
VarlenCase with_mask(VarlenCase c, sa_mask m, int64_t left = 0, int64_t right = 0) {
  c.mask = m;
  c.window_left = left;
  c.window_right = right;
  return c;
}

std::vector<VarlenCase> cases() {
  std::vector<VarlenCase> v;
  // Empty sequences, a one-token sequence, shorter than a block, exact blocks, partial last
  // blocks; GQA (2 query heads per KV head).
  const std::vector<int64_t> mixed = {100, 0, 1, 64, 130, 7};
  v.push_back(vcase("mixed_gqa_nomask", mixed, mixed));
  v.push_back(with_mask(vcase("mixed_gqa_causal", mixed, mixed), SA_MASK_CAUSAL));
  // S_q != S_kv per sequence (the default offset is each sequence's S_kv - S_q), incl. a
  // sequence with queries but no keys and one with keys but no queries.
  const std::vector<int64_t> sq = {70, 5, 128, 9, 0}, skv = {200, 64, 3, 0, 40};
  v.push_back(vcase("sq_ne_skv_nomask", sq, skv));
  v.push_back(with_mask(vcase("sq_ne_skv_causal", sq, skv), SA_MASK_CAUSAL));
  v.push_back(with_mask(vcase("sq_ne_skv_window", sq, skv), SA_MASK_WINDOW, 40, 10));
  VarlenCase cw = with_mask(vcase("causal_window_offset0", sq, skv), SA_MASK_CAUSAL_WINDOW, 50);
  cw.offset_given = true;
  v.push_back(cw);
  VarlenCase neg = with_mask(vcase("causal_offset_negative", {90, 33}, {90, 80}), SA_MASK_CAUSAL);
  neg.offset_given = true;
  neg.offset = -20;
  v.push_back(neg);
  // MQA, block 128, D != D_v, N_q_max beyond the longest sequence.
  VarlenCase mqa = with_mask(vcase("mqa_block128_causal", {300, 17, 129}, {129, 256, 300}),
                             SA_MASK_CAUSAL);
  mqa.Hq = 3;
  mqa.Hkv = 1;
  mqa.block = 128;
  mqa.Dv = 8;
  mqa.extra_nq = 2;
  v.push_back(mqa);
  // MHA, bf16 (outputs rounded the same way in both calls), one sequence.
  VarlenCase one = with_mask(vcase("mha_bf16_one_sequence", {150}, {150}), SA_MASK_CAUSAL);
  one.Hq = one.Hkv = 2;
  one.dtype = SA_DTYPE_BF16;
  v.push_back(one);
  return v;
}

INSTANTIATE_TEST_SUITE_P(BsaVarlen, BsaVarlenReference, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<VarlenCase>& i) {
                           return i.param.name;
                         });

// ---------------------------------------------------------------------------------------------
// Errors: shapes before anything runs (INVALID_ARGUMENT), values in the reference
// (INVALID_METADATA), the CUDA paths' refusals (UNSUPPORTED).
// ---------------------------------------------------------------------------------------------
VarlenCase small_case() { return vcase("small", {70, 0, 60}, {50, 10, 64}); }

void expect_error(sa_cpp::Status st, sa_status code, const std::string& needle) {
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_NE(st.message().find(needle), std::string::npos)
      << "message: " << st.message() << "\nexpected to contain: " << needle;
}

TEST(BsaVarlenErrors, NamedArgumentErrors) {
  const VarlenCase c = small_case();
  std::mt19937_64 rng(1);
  struct Edit {
    const char* what;
    void (*edit)(sa_bsa_fwd_args&, Packed&);
    const char* needle;
  };
  static HostTensor q4, cu_f32, cu_short, cu_one, lse3, idx_b, bl;
  q4 = HostTensor(SA_DTYPE_FP64, {1, 130, 2, 16});
  cu_f32 = HostTensor(SA_DTYPE_FP32, {4});
  cu_short = HostTensor(SA_DTYPE_INT32, {3});
  cu_one = HostTensor(SA_DTYPE_INT32, {1});
  lse3 = HostTensor(SA_DTYPE_FP32, {3, 2, 130});
  idx_b = HostTensor(SA_DTYPE_INT32, {2, 2, 2, 2});
  bl = HostTensor(SA_DTYPE_INT32, {2});
  const Edit edits[] = {
      {"k absent", [](sa_bsa_fwd_args& a, Packed&) { a.options.cu_seqlens_k = sa_tensor{}; },
       "options.cu_seqlens_k: absent while options.cu_seqlens_q is given"},
      {"q absent", [](sa_bsa_fwd_args& a, Packed&) { a.options.cu_seqlens_q = sa_tensor{}; },
       "options.cu_seqlens_q: absent while options.cu_seqlens_k is given"},
      {"rank-4 q", [](sa_bsa_fwd_args& a, Packed&) { a.q = q4.view(); },
       "q: expected rank 3 [T, H, D], got rank 4"},
      {"fp32 cu", [](sa_bsa_fwd_args& a, Packed&) { a.options.cu_seqlens_q = cu_f32.view(); },
       "options.cu_seqlens_q: expected dtype int32"},
      {"k shorter", [](sa_bsa_fwd_args& a, Packed&) { a.options.cu_seqlens_k = cu_short.view(); },
       "options.cu_seqlens_k: expected shape [B + 1] = [4]"},
      {"no sequence", [](sa_bsa_fwd_args& a, Packed&) { a.options.cu_seqlens_q = cu_one.view(); },
       "options.cu_seqlens_q: expected shape [B + 1] with B >= 1"},
      {"index batch", [](sa_bsa_fwd_args& a, Packed&) { a.sparsity.q2k_index = idx_b.view(); },
       "sparsity.q2k_index: expected shape [B, H_q, N_q_max, K_max] = [3, 2"},
      {"lse rank 3", [](sa_bsa_fwd_args& a, Packed&) { a.lse = lse3.view(); },
       "lse: expected rank 2"},
      {"kv_block_len", [](sa_bsa_fwd_args& a, Packed&) { a.sparsity.kv_block_len = bl.view(); },
       "sparsity.kv_block_len: not taken with packed batches"},
  };
  for (const Edit& e : edits) {
    SCOPED_TRACE(e.what);
    Packed p(c, rng);
    sa_cpp::BsaForwardArgs a;
    p.fwd_args(a, c);
    e.edit(a, p);
    expect_error(sa_cpp::bsa_forward(a), SA_ERROR_INVALID_ARGUMENT, e.needle);
    EXPECT_TRUE(sa_test::any_nan(p.o.to_double())) << "an output was touched";
  }
}

TEST(BsaVarlenErrors, BadValuesNamedByTheReference) {
  const VarlenCase c = small_case();  // cu_q = {0, 70, 70, 130}, cu_k = {0, 50, 60, 124}
  std::mt19937_64 rng(2);
  struct Edit {
    const char* what;
    void (*edit)(Packed&);
    const char* needle;
  };
  const Edit edits[] = {
      {"first", [](Packed& p) { p.cu_q.i32()[0] = 3; }, "options.cu_seqlens_q[0] = 3: expected 0"},
      {"decreasing", [](Packed& p) { p.cu_k.i32()[2] = 40; },
       "options.cu_seqlens_k[2] = 40 < options.cu_seqlens_k[1] = 50"},
      {"last", [](Packed& p) { p.cu_q.i32()[3] = 129; },
       "options.cu_seqlens_q[3] = 129: expected T_q (q's first dim) = 130"},
      {"too long for N_q_max", [](Packed& p) { p.cu_q.i32()[1] = p.cu_q.i32()[2] = 0; },
       "options.cu_seqlens_q: sequence 2 has S_q = 130, 3 query blocks of 64, more than "
       "sparsity.q2k_index's N_q_max = 2"},
      {"global block id", [](Packed& p) {
         p.count.i32()[(2 * 2 + 0) * p.Nq + 0] = 1;
         p.index.i32()[((2 * 2 + 0) * p.Nq + 0) * p.Kmax] = 1;
       },
       "sparsity.q2k_index[b=2, h=0, m=0, slot=0] = 1: expected a KV block in [0, 1) (local to "
       "sequence 2, S_kv = 64)"},
  };
  for (const Edit& e : edits) {
    SCOPED_TRACE(e.what);
    Packed p(c, rng);
    e.edit(p);
    sa_cpp::BsaForwardArgs a;
    p.fwd_args(a, c);
    expect_error(sa_cpp::bsa_forward(a), SA_ERROR_INVALID_METADATA, e.needle);
    sa_cpp::BsaBackwardArgs g;
    p.bwd_args(g, c);
    expect_error(sa_cpp::bsa_backward(g), SA_ERROR_INVALID_METADATA, e.needle);
  }
}

TEST(BsaVarlenErrors, CudaPathsRefuseByName) {
  const VarlenCase c = small_case();
  std::mt19937_64 rng(3);
  Packed p(c, rng);
  sa_cpp::BsaForwardArgs a;
  p.fwd_args(a, c);
  // The portable forward and backward take packed batches (GPU suite GpuBsaVarlen*), but these
  // are CPU tensors.
  a.options.impl = SA_IMPL_PORTABLE;
  expect_error(sa_cpp::bsa_forward(a), SA_ERROR_UNSUPPORTED, "needs CUDA tensors");
  sa_cpp::BsaBackwardArgs g;
  p.bwd_args(g, c);
  g.options.impl = SA_IMPL_PORTABLE;  // it takes packed batches too, but not CPU tensors
  expect_error(sa_cpp::bsa_backward(g), SA_ERROR_UNSUPPORTED, "needs CUDA tensors");
  g.options.impl = SA_IMPL_SM90;
  expect_error(sa_cpp::bsa_backward(g), SA_ERROR_UNSUPPORTED, "sm90");
}

// A caller built against the version-2 header: its options end before cu_seqlens, so the call
// is a dense batch whatever lies past its size.
TEST(BsaVarlenAbi, Version2OptionsReadAsDense) {
  std::mt19937_64 rng(4);
  HostTensor q(SA_DTYPE_FP64, {1, 2, 70, 16}), k(SA_DTYPE_FP64, {1, 1, 70, 16}),
      v(SA_DTYPE_FP64, {1, 1, 70, 16}), o(SA_DTYPE_FP64, {1, 2, 70, 16}),
      lse(SA_DTYPE_FP32, {1, 2, 70}), index(SA_DTYPE_INT32, {1, 2, 2, 2}),
      junk(SA_DTYPE_INT32, {2});
  for (HostTensor* t : {&q, &k, &v}) t->fill_uniform(rng);
  for (int i = 0; i < 8; ++i) index.i32()[i] = i % 2;
  sa_cpp::BsaForwardArgs a;
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.o = o.view();
  a.lse = lse.view();
  a.sparsity.q2k_index = index.view();
  a.options.block_size = 64;
  a.options.cu_seqlens_q = junk.view();  // past a version-2 caller's struct: never read
  a.options.cu_seqlens_k = junk.view();
  a.options.size = offsetof(sa_bsa_options, cu_seqlens_q);
  const sa_cpp::Status st = sa_cpp::bsa_forward(a);
  EXPECT_TRUE(st.ok()) << st.to_string();
}

}  // namespace
