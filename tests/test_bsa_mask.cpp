// BSA token masks (SPEC 4) on the CPU, through the public API: the fp64 reference's forward and
// backward against an independent brute-force dense masked attention (bsa_mask_oracle.hpp) on
// fresh random inputs, the edge cases of SPEC 4 by name, the named errors of the mask options,
// the reverse map's dropping of hidden pairs, and a version-1 options struct reading as "no
// mask".
//
// Tables of cases: BsaMask/BsaMaskReference.MatchesDenseMaskedAttention/*
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "api/extensible.hpp"
#include "bsa_mask_oracle.hpp"
#include "bsa_problem_builder.hpp"
#include "common/reverse_map.hpp"
#include "sparse_attention/sparse_attention.h"
#include "sparse_attention/sparse_attention.hpp"
#include "test_util.hpp"

namespace {

namespace sa_cpp = sparse_attention;
using sa_test::BsaPattern;
using sa_test::BsaPatternSpec;
using sa_test::BsaShape;
using sa_test::BsaTensors;
using sa_test::MaskSpec;

BsaShape shape_of(int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Skv, int64_t D,
                  int32_t block, int64_t Kmax, sa_layout layout) {
  BsaShape s;
  s.B = B;
  s.Hq = Hq;
  s.Hkv = Hkv;
  s.Sq = Sq;
  s.Skv = Skv;
  s.D = D;
  s.Dv = D;
  s.block = block;
  s.Kmax = Kmax;
  s.layout = layout;
  return s;
}

MaskSpec mask_of(sa_mask kind, bool given = false, int64_t offset = 0, int64_t left = 0,
                 int64_t right = 0) {
  MaskSpec m;
  m.kind = kind;
  m.offset_given = given;
  m.offset = offset;
  m.window_left = left;
  m.window_right = right;
  return m;
}

// Every row lists every KV block, in a random order (so causal hides whole blocks).
BsaPattern all_blocks(const BsaShape& s, std::mt19937_64& rng) {
  BsaPattern p;
  p.q2k_index = sa_test::HostTensor(SA_DTYPE_INT32, {s.B, s.Hq, s.Nq(), s.Nkv()});
  p.fixed_count = static_cast<int32_t>(s.Nkv());
  std::vector<int32_t> blocks(static_cast<size_t>(s.Nkv()));
  for (int32_t n = 0; n < s.Nkv(); ++n) blocks[static_cast<size_t>(n)] = n;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t m = 0; m < s.Nq(); ++m) {
        std::shuffle(blocks.begin(), blocks.end(), rng);
        for (int64_t slot = 0; slot < s.Nkv(); ++slot)
          p.index(b, h, m, slot) = blocks[static_cast<size_t>(slot)];
      }
  return p;
}

// The views of one call on CPU tensors.
void fill_views(sa_bsa_fwd_args& a, const BsaShape& s, BsaPattern& pat, BsaTensors& t,
                const MaskSpec& m) {
  a.q = t.q.view();
  a.k = t.k.view();
  a.v = t.v.view();
  a.sparsity = pat.sparsity();
  a.o = t.o.view();
  a.lse = t.lse.view();
  a.options.layout = s.layout;
  a.options.block_size = s.block;
  a.options.count = pat.has_count ? -1 : pat.fixed_count;
  m.apply(a.options);
}

sa_cpp::Status run_forward(const BsaShape& s, BsaPattern& pat, BsaTensors& t, const MaskSpec& m) {
  sa_cpp::BsaForwardArgs a;
  fill_views(a, s, pat, t, m);
  return sa_cpp::bsa_forward(a);
}

sa_cpp::Status run_backward(const BsaShape& s, BsaPattern& pat, BsaTensors& t,
                            const MaskSpec& m) {
  sa_cpp::BsaForwardArgs f;
  fill_views(f, s, pat, t, m);
  sa_cpp::BsaBackwardArgs a;
  a.q = f.q;
  a.k = f.k;
  a.v = f.v;
  a.o = f.o;
  a.lse = f.lse;
  a.dout = t.dout.view();
  a.sparsity = f.sparsity;
  a.dq = t.dq.view();
  a.dk = t.dk.view();
  a.dv = t.dv.view();
  a.options = f.options;
  return sa_cpp::bsa_backward(a);
}

// Largest |got - want| over max(1, max |want|): a relative L-infinity error.
double rel_max_error(const std::vector<double>& got, const std::vector<double>& want) {
  double err = 0.0, scale = 1.0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::fabs(want[i]));
    err = std::isnan(got[i]) ? INFINITY : std::max(err, std::fabs(got[i] - want[i]));
  }
  return err / scale;
}

// ---------------------------------------------------------------------------------------------
// Forward and backward against the dense oracle.
// ---------------------------------------------------------------------------------------------
struct MaskCase {
  std::string name;
  BsaShape shape;
  MaskSpec mask;
  bool all_blocks = false;   // every row lists every block (else a random pattern)
  BsaPatternSpec spec{};     // the random pattern's options
  bool expect_empty_rows = false;
};

void PrintTo(const MaskCase& c, std::ostream* os) { *os << c.name; }

class BsaMaskReference : public ::testing::TestWithParam<MaskCase> {};

TEST_P(BsaMaskReference, MatchesDenseMaskedAttention) {
  const MaskCase& c = GetParam();
  const BsaShape& s = c.shape;
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  BsaPattern pat = c.all_blocks ? all_blocks(s, rng) : sa_test::random_bsa_pattern(s, c.spec, rng);
  BsaTensors t = sa_test::make_bsa_tensors(s, SA_DTYPE_FP64, rng);

  const sa_cpp::Status fs = run_forward(s, pat, t, c.mask);
  ASSERT_TRUE(fs.ok()) << fs.to_string();
  const sa_test::DenseGrads want = sa_test::dense_masked_attention_grads(
      s, pat, c.mask, t, sa_test::default_scale(s));

  const std::vector<double> o = sa_test::bhsd_doubles(t.o, s.layout);
  const std::vector<double> lse = t.lse.to_double();
  EXPECT_LT(rel_max_error(o, want.o), 1e-12) << "o";
  bool any_empty = false, any_seen = false;
  for (size_t r = 0; r < want.lse.size(); ++r) {
    if (want.row_empty[r]) {
      any_empty = true;
      ASSERT_EQ(lse[r], -INFINITY) << "row " << r << " sees no key";
      for (int64_t x = 0; x < s.Dv; ++x)
        ASSERT_EQ(o[r * static_cast<size_t>(s.Dv) + static_cast<size_t>(x)], 0.0);
    } else {
      any_seen = true;
      ASSERT_NEAR(lse[r], want.lse[r], 1e-6 * (1 + std::fabs(want.lse[r]))) << "row " << r;
    }
  }
  EXPECT_EQ(any_empty, c.expect_empty_rows) << "the case's premise: rows that see no key";
  ASSERT_TRUE(any_seen || c.expect_empty_rows);

  const sa_cpp::Status bs = run_backward(s, pat, t, c.mask);
  ASSERT_TRUE(bs.ok()) << bs.to_string();
  const std::vector<double> dq = sa_test::bhsd_doubles(t.dq, s.layout);
  const std::vector<double> dk = sa_test::bhsd_doubles(t.dk, s.layout);
  const std::vector<double> dv = sa_test::bhsd_doubles(t.dv, s.layout);
  // The backward recomputes P from the fp32 LSE: relative errors of about 1e-7.
  EXPECT_LT(rel_max_error(dq, want.dq), 2e-6) << "dq";
  EXPECT_LT(rel_max_error(dk, want.dk), 2e-6) << "dk";
  EXPECT_LT(rel_max_error(dv, want.dv), 2e-6) << "dv";
  // Exact zeros: rows that see no key (dq), keys that no query sees (dk, dv).
  for (size_t r = 0; r < want.row_empty.size(); ++r) {
    if (!want.row_empty[r]) continue;
    for (int64_t x = 0; x < s.D; ++x)
      ASSERT_EQ(dq[r * static_cast<size_t>(s.D) + static_cast<size_t>(x)], 0.0) << "row " << r;
  }
  for (size_t j = 0; j < want.key_seen.size(); ++j) {
    if (want.key_seen[j]) continue;
    for (int64_t x = 0; x < s.D; ++x)
      ASSERT_EQ(dk[j * static_cast<size_t>(s.D) + static_cast<size_t>(x)], 0.0) << "key " << j;
    for (int64_t x = 0; x < s.Dv; ++x)
      ASSERT_EQ(dv[j * static_cast<size_t>(s.Dv) + static_cast<size_t>(x)], 0.0) << "key " << j;
  }
}

BsaPatternSpec random_spec(bool kv_block_len, bool empty_rows = false) {
  BsaPatternSpec p;
  p.per_row_count = true;
  p.empty_rows = empty_rows;
  p.kv_block_len = kv_block_len;
  return p;
}

constexpr sa_layout kBhsd = SA_LAYOUT_BHSD;
constexpr sa_layout kBshd = SA_LAYOUT_BSHD;

const MaskCase kMaskCases[] = {
    // The usual triangle: S_q = S_kv, default offset 0; dense lists, so blocks above the
    // diagonal are entirely outside and the diagonal blocks partial.
    {"CausalSquareDenseListsBhsd64", shape_of(1, 2, 2, 200, 200, 8, 64, 4, kBhsd),
     mask_of(SA_MASK_CAUSAL), true},
    // Bottom-right alignment: S_q < S_kv, default offset S_kv - S_q = 190.
    {"CausalSqBelowSkvDefaultOffsetGqaBshd", shape_of(1, 4, 2, 70, 260, 8, 64, 5, kBshd),
     mask_of(SA_MASK_CAUSAL), true},
    // S_q > S_kv: default offset -110, so the first 110 rows see no key.
    {"CausalSqAboveSkvEmptyRowsMqa", shape_of(1, 3, 1, 240, 130, 8, 64, 3, kBhsd),
     mask_of(SA_MASK_CAUSAL), true, {}, true},
    // An explicit negative offset (rows 0..69 see nothing) with random lists and partial blocks.
    {"CausalNegativeOffsetRandomListsPartialLen",
     shape_of(2, 2, 1, 150, 150, 8, 64, 2, kBshd), mask_of(SA_MASK_CAUSAL, true, -70),
     false, random_spec(true), true},
    // Offsets far outside the sequence: everything visible / nothing visible.
    {"CausalHugeOffsetSeesEverything", shape_of(1, 2, 2, 130, 190, 8, 64, 3, kBhsd),
     mask_of(SA_MASK_CAUSAL, true, INT64_MAX), true},
    {"CausalHugeNegativeOffsetSeesNothing", shape_of(1, 2, 2, 130, 190, 8, 64, 3, kBhsd),
     mask_of(SA_MASK_CAUSAL, true, INT64_MIN), true, {}, true},
    // Window 0 both sides: query i sees only key i + offset.
    {"WindowZeroSeesOnlyTheDiagonalKey", shape_of(1, 2, 2, 128, 128, 8, 64, 2, kBhsd),
     mask_of(SA_MASK_WINDOW), true},
    // An asymmetric window with the last KV block cut at S_kv (block 128, 300 keys).
    {"WindowAsymmetricGqaBshd128", shape_of(1, 4, 2, 260, 300, 16, 128, 3, kBshd),
     mask_of(SA_MASK_WINDOW, false, 0, 37, 5), true},
    // A window whose band misses some rows entirely: offset +500 past S_kv.
    {"WindowOffsetPastTheEndEmptyRows", shape_of(1, 2, 2, 130, 200, 8, 64, 4, kBhsd),
     mask_of(SA_MASK_WINDOW, true, 150, 60, 0), true, {}, true},
    // Sliding window plus causal, MQA, block 128, partial blocks by kv_block_len, random lists
    // with empty rows.
    {"CausalWindowMqaBlock128PartialLen", shape_of(1, 3, 1, 300, 300, 8, 128, 3, kBhsd),
     mask_of(SA_MASK_CAUSAL_WINDOW, false, 0, 70), false, random_spec(true, true), true},
    {"CausalWindowWideGqaBshd64", shape_of(2, 4, 2, 192, 256, 8, 64, 4, kBshd),
     mask_of(SA_MASK_CAUSAL_WINDOW, false, 0, 100), true},
    // Mask "none" through the same path (the first version's behaviour).
    {"NoneMatchesTheBlockLists", shape_of(1, 2, 1, 150, 170, 8, 64, 2, kBshd),
     mask_of(SA_MASK_NONE), false, random_spec(true)},
};

INSTANTIATE_TEST_SUITE_P(BsaMask, BsaMaskReference, ::testing::ValuesIn(kMaskCases),
                         [](const ::testing::TestParamInfo<MaskCase>& i) { return i.param.name; });

// ---------------------------------------------------------------------------------------------
// The named errors of the mask options: nothing runs, no output is touched.
// ---------------------------------------------------------------------------------------------
struct BadMask {
  std::string name;
  int32_t kind;  // as a C caller may store it
  int32_t given;
  int64_t offset, left, right;
  std::string message;
};

class BsaMaskRejects : public ::testing::TestWithParam<BadMask> {};

TEST_P(BsaMaskRejects, NamesTheOption) {
  const BadMask& c = GetParam();
  const BsaShape s = shape_of(1, 1, 1, 64, 64, 8, 64, 1, kBhsd);
  std::mt19937_64 rng(1);
  BsaPattern pat = all_blocks(s, rng);
  BsaTensors t = sa_test::make_bsa_tensors(s, SA_DTYPE_FP64, rng);
  sa_cpp::BsaForwardArgs a;
  fill_views(a, s, pat, t, MaskSpec{});
  std::memcpy(&a.options.mask, &c.kind, sizeof c.kind);
  a.options.causal_offset_given = c.given;
  a.options.causal_offset = c.offset;
  a.options.window_left = c.left;
  a.options.window_right = c.right;
  size_t bytes = 0;
  const sa_cpp::Status ws = sa_cpp::bsa_forward_workspace_size(a, &bytes);
  EXPECT_EQ(ws.code(), SA_ERROR_INVALID_ARGUMENT);
  const sa_cpp::Status st = sa_cpp::bsa_forward(a);
  EXPECT_EQ(st.code(), SA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find(c.message), std::string::npos) << st.message();
  for (double x : t.o.to_double()) ASSERT_TRUE(std::isnan(x)) << "o was written";
  for (double x : t.lse.to_double()) ASSERT_TRUE(std::isnan(x)) << "lse was written";
}

const BadMask kBadMasks[] = {
    {"UnknownKind", 4, 0, 0, 0, 0, "options.mask: expected SA_MASK_NONE, SA_MASK_CAUSAL"},
    {"NegativeKind", -1, 0, 0, 0, 0, "options.mask: expected"},
    {"NegativeWindowLeft", SA_MASK_WINDOW, 0, 0, -1, 0, "options.window_left, "
     "options.window_right: expected >= 0, got -1, 0"},
    {"NegativeWindowRight", SA_MASK_WINDOW, 0, 0, 4, -3, "expected >= 0, got 4, -3"},
    {"WindowLeftWithCausal", SA_MASK_CAUSAL, 0, 0, 16, 0,
     "options.window_left: 16 is set but options.mask = SA_MASK_CAUSAL has no window"},
    {"WindowLeftWithNone", SA_MASK_NONE, 0, 0, 16, 0,
     "options.window_left: 16 is set but options.mask = SA_MASK_NONE"},
    {"WindowRightWithCausalWindow", SA_MASK_CAUSAL_WINDOW, 0, 0, 16, 2,
     "options.window_right: 2 is set but options.mask = SA_MASK_CAUSAL_WINDOW already hides"},
    {"WindowRightWithCausal", SA_MASK_CAUSAL, 0, 0, 0, 2,
     "options.window_right: 2 is set but options.mask = SA_MASK_CAUSAL has no window"},
    {"OffsetWithNone", SA_MASK_NONE, 1, 3, 0, 0,
     "options.causal_offset: set (causal_offset_given = 1, causal_offset = 3) but "
     "options.mask = SA_MASK_NONE"},
    {"OffsetWithoutGiven", SA_MASK_CAUSAL, 0, 5, 0, 0,
     "options.causal_offset: 5 is ignored unless options.causal_offset_given is nonzero"},
};

INSTANTIATE_TEST_SUITE_P(BsaMask, BsaMaskRejects, ::testing::ValuesIn(kBadMasks),
                         [](const ::testing::TestParamInfo<BadMask>& i) { return i.param.name; });

// ---------------------------------------------------------------------------------------------
// The reverse map drops exactly the (query block, KV block) pairs the mask hides entirely.
// ---------------------------------------------------------------------------------------------
TEST(BsaMaskReverseMap, DropsEntirelyHiddenPairsOnly) {
  // Causal, S = 320 (block 64: 5 blocks), dense lists: row n keeps query blocks m >= n.
  const BsaShape s = shape_of(1, 2, 1, 320, 320, 8, 64, 5, kBhsd);
  std::mt19937_64 rng(2);
  BsaPattern pat = all_blocks(s, rng);
  sa::BsaMeta meta = pat.meta();
  meta.mask.on = true;
  meta.mask.lo = -s.Sq;
  meta.mask.hi = 0;
  const sa::ReverseMap map = sa::build_reverse_map_cpu(s.dims(), meta, 0);
  for (int64_t n = 0; n < s.Nkv(); ++n) {
    std::vector<int32_t> want;
    for (int32_t hl = 0; hl < 2; ++hl)
      for (int32_t m = static_cast<int32_t>(n); m < s.Nq(); ++m)
        want.push_back(hl * static_cast<int32_t>(s.Nq()) + m);
    const std::vector<int32_t> got(map.entries.begin() + map.row_offsets[n],
                                   map.entries.begin() + map.row_offsets[n + 1]);
    EXPECT_EQ(got, want) << "KV block " << n;
  }
  // A window of 10 keys behind the diagonal: block 0 of keys is seen by query blocks 0 and 1
  // only (query 64 sees keys 54..64).
  meta.mask.lo = -10;
  const sa::ReverseMap win = sa::build_reverse_map_cpu(s.dims(), meta, 0);
  const std::vector<int32_t> row0(win.entries.begin() + win.row_offsets[0],
                                  win.entries.begin() + win.row_offsets[1]);
  EXPECT_EQ(row0, (std::vector<int32_t>{0, 1, 5, 6}));
}

// ---------------------------------------------------------------------------------------------
// A caller built against the first version (no mask fields; its padding holds anything) runs
// with no mask.
// ---------------------------------------------------------------------------------------------
TEST(BsaMaskAbi, FirstVersionOptionsReadAsNoMask) {
  const BsaShape s = shape_of(1, 1, 1, 64, 64, 8, 64, 1, kBhsd);
  std::mt19937_64 rng(3);
  BsaPattern pat = all_blocks(s, rng);
  BsaTensors t = sa_test::make_bsa_tensors(s, SA_DTYPE_FP64, rng);
  sa_bsa_fwd_args a = sa_bsa_fwd_args_default();
  fill_views(a, s, pat, t, MaskSpec{});
  // The first version's sizeof: its fields, then padding to the struct's alignment.
  const size_t v1 = (sa::api::kBsaOptionsV1 + alignof(sa_bsa_options) - 1) /
                    alignof(sa_bsa_options) * alignof(sa_bsa_options);
  a.options.size = v1;
  a.size = offsetof(sa_bsa_fwd_args, options) + v1;
  std::vector<unsigned char> buf(a.size, 0xff);  // padding and anything past it: 0xff
  std::memcpy(buf.data(), &a, sa::api::args_v1<sa_bsa_fwd_args>());
  sa_context ctx = sa_context_default();
  ASSERT_EQ(sa_bsa_forward(reinterpret_cast<const sa_bsa_fwd_args*>(buf.data()), &ctx), SA_OK)
      << sa_last_error();
  const sa_test::DenseGrads want = sa_test::dense_masked_attention_grads(
      s, pat, MaskSpec{}, t, sa_test::default_scale(s));
  EXPECT_LT(rel_max_error(sa_test::bhsd_doubles(t.o, s.layout), want.o), 1e-12);
  // Default options carry no mask.
  const sa_bsa_options d = sa_bsa_options_default();
  EXPECT_EQ(d.mask, SA_MASK_NONE);
  EXPECT_EQ(d.causal_offset_given, 0);
  EXPECT_EQ(d.causal_offset, 0);
  EXPECT_EQ(d.window_left, 0);
  EXPECT_EQ(d.window_right, 0);
}

}  // namespace
