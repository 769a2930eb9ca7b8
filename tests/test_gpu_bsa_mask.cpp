// BSA token masks (SPEC 4) on the portable path (src/sm80) and the Hopper kernels (src/sm90),
// against the fp64 reference through the public API (itself checked against a brute-force dense
// masked attention on the CPU, test_bsa_mask.cpp). Skipped without a GPU.
//
//  * GpuBsaMaskForward: masks x layouts x block sizes x head dims, GQA/MQA, partial blocks,
//    rows that see no key, blocks entirely outside the mask (dense lists under causal), rows of
//    more than 128 listed blocks (the stager's chunks, some entirely hidden), rows with more than
//    32 visible blocks (the Hopper kernel's 32-slot chunks); NaN-poisoned outputs and guard
//    regions, o exactly 0 on rows that see no key (expect_bsa_forward_matches_reference). Each
//    case runs on the portable path (its plain name) and, on an sm_90 device with the Hopper path
//    built, on the sm90 forward (name + "Sm90").
//  * GpuBsaMaskBackward: the same masks with automatic buckets, single owners, split rows
//    (bucket 2: the fp32 workspace path) and deterministic mode; exact zeros for keys no query
//    sees and rows that see no key. Sm90MatchesReference: every backward case again with
//    options.impl = sm90 (an sm_90 device and the Hopper path built, else skipped; K and V of
//    padded keys := NaN): tiles the mask hides skipped, cut tiles banded, the second half of a
//    128-row block dead on its own, and at block 128 a warpgroup whose 64 keys the mask hides
//    from a live tile skipping its GEMMs (every causal block-128 case with offset <= 0, the
//    window cases, and blocks whose second 64 keys lie past S_kv).
//  * GpuBsaMaskDeterministic: three runs, the same bytes (portable; sm90 on an sm_90 device).
//  * GpuBsaMaskRouting: on an sm_90 device with the Hopper path built, AUTO runs a masked forward
//    on the sm90 path; the backward under AUTO (sm90) and on the portable path, fed the sm90
//    forward's o and lse, match the reference backward of those same o and lse.
//  * GpuBsaMaskDynamicTiles (sm90): the masked kernel's tile order on issue 38's causal MoBA lists
//    (query block m lists its diagonal block and round(0.25 m) earlier ones), with several tiles
//    per CTA: dynamic tiles (Tuning::sm90_fwd_dyn 2, the counter in a workspace full of garbage)
//    give the same bytes as the static order (1) and as the rule without a workspace (the static
//    fallback); both match the reference on the smaller cases; a captured graph replays twice
//    with the counter reset by its captured memset.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bsa_mask_oracle.hpp"
#include "bsa_problem_builder.hpp"
#include "common/tuning.hpp"
#include "gpu_test_util.hpp"
#include "test_util.hpp"

#ifndef SA_HAVE_SM90  // set by CMake like the library's
#define SA_HAVE_SM90 0
#endif

namespace sa_test {
namespace {

MaskSpec mask_spec(sa_mask kind, bool given = false, int64_t offset = 0, int64_t left = 0,
                   int64_t right = 0) {
  MaskSpec m;
  m.kind = kind;
  m.offset_given = given;
  m.offset = offset;
  m.window_left = left;
  m.window_right = right;
  return m;
}

// Every row lists every KV block, in a random order; under causal the blocks above the diagonal
// are entirely outside.
void list_all_blocks(const BsaShape& s, BsaPattern& p, std::mt19937_64& rng) {
  p = BsaPattern{};
  p.q2k_index = HostTensor(SA_DTYPE_INT32, {s.B, s.Hq, s.Nq(), s.Nkv()});
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
}

// Issue 38's causal MoBA lists (S_q = S_kv): query block m lists its diagonal block m and
// round(0.25 m) distinct random earlier blocks, in a random order, with per-row counts; slots past
// a row's count hold garbage. K_max must be at least 1 + round(0.25 (N_q - 1)).
void moba_causal_blocks(const BsaShape& s, BsaPattern& p, std::mt19937_64& rng) {
  p = BsaPattern{};
  p.q2k_index = HostTensor(SA_DTYPE_INT32, {s.B, s.Hq, s.Nq(), s.Kmax});
  p.q2k_count = HostTensor(SA_DTYPE_INT32, {s.B, s.Hq, s.Nq()});
  p.has_count = true;
  for (int64_t i = 0; i < p.q2k_index.numel(); ++i) p.q2k_index.i32()[i] = -7;
  std::vector<int32_t> row;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t m = 0; m < s.Nq(); ++m) {
        row.resize(static_cast<size_t>(m));
        for (int32_t n = 0; n < m; ++n) row[static_cast<size_t>(n)] = n;
        std::shuffle(row.begin(), row.end(), rng);
        row.resize(static_cast<size_t>(std::llround(0.25 * static_cast<double>(m))));
        row.push_back(static_cast<int32_t>(m));
        std::shuffle(row.begin(), row.end(), rng);
        p.q2k_count.i32()[(b * s.Hq + h) * s.Nq() + m] = static_cast<int32_t>(row.size());
        for (size_t slot = 0; slot < row.size(); ++slot)
          p.index(b, h, m, static_cast<int64_t>(slot)) = row[slot];
      }
}

struct GpuMaskCase {
  std::string name;
  BsaShape shape;
  MaskSpec mask;
  bool all_blocks = false;  // every row lists every block (K_max must be N_kv)
  BsaPatternSpec spec{};    // else a random pattern
  sa_dtype dtype = SA_DTYPE_BF16;
  bool forward_only = false;  // too long for the backward suites' CPU reference
};

constexpr sa_layout kBhsd = SA_LAYOUT_BHSD;
constexpr sa_layout kBshd = SA_LAYOUT_BSHD;

const GpuMaskCase kCases[] = {
    // Causal, S_q = S_kv, dense lists: hidden blocks, diagonal blocks partial.
    {"CausalBlock128D128MhaBhsdDense", shape_of(1, 2, 2, 512, 512, 128, 128, 4, kBhsd),
     mask_spec(SA_MASK_CAUSAL), true},
    {"CausalBlock64D64GqaBshdDense", shape_of(2, 4, 2, 300, 300, 64, 64, 5, kBshd),
     mask_spec(SA_MASK_CAUSAL), true},
    {"CausalBlock64D128MqaBhsdDenseFp16", shape_of(1, 4, 1, 256, 256, 128, 64, 4, kBhsd),
     mask_spec(SA_MASK_CAUSAL), true, {}, SA_DTYPE_FP16},
    {"CausalBlock128D64GqaBshdDense", shape_of(1, 4, 2, 384, 384, 64, 128, 3, kBshd),
     mask_spec(SA_MASK_CAUSAL), true},
    // Bottom-right: S_q < S_kv (default offset S_kv - S_q) and S_q > S_kv (rows with no key).
    {"CausalSqBelowSkvBlock128D128", shape_of(1, 2, 1, 200, 700, 128, 128, 6, kBhsd),
     mask_spec(SA_MASK_CAUSAL), true},
    {"CausalSqAboveSkvEmptyRowsBlock64D64", shape_of(1, 2, 2, 400, 150, 64, 64, 3, kBshd),
     mask_spec(SA_MASK_CAUSAL), true},
    // An explicit negative offset, random lists with partial blocks and empty rows.
    {"CausalNegativeOffsetRandomPartialBlock64D128",
     shape_of(2, 4, 2, 330, 330, 128, 64, 3, kBshd), mask_spec(SA_MASK_CAUSAL, true, -100),
     false, spec_of(true, -1, true, true, true)},
    // Windows: 0 (the diagonal key only), asymmetric, and an offset that empties rows.
    {"WindowZeroBlock64D64", shape_of(1, 2, 2, 256, 256, 64, 64, 4, kBhsd),
     mask_spec(SA_MASK_WINDOW), true},
    {"WindowAsymmetricBlock128D128GqaBshd", shape_of(1, 4, 2, 520, 600, 128, 128, 5, kBshd),
     mask_spec(SA_MASK_WINDOW, false, 0, 100, 20), true},
    {"WindowOffsetEmptiesRowsBlock128D64", shape_of(1, 2, 2, 300, 400, 64, 128, 4, kBhsd),
     mask_spec(SA_MASK_WINDOW, true, 250, 90, 10), true},
    // Sliding window plus causal (window smaller and larger than a block), random lists.
    {"CausalWindow70Block128D128MqaRandomPartial",
     shape_of(1, 4, 1, 640, 640, 128, 128, 3, kBhsd),
     mask_spec(SA_MASK_CAUSAL_WINDOW, false, 0, 70), false, spec_of(true, -1, true, true)},
    {"CausalWindow300Block64D64GqaBshdDense", shape_of(1, 4, 2, 640, 640, 64, 64, 10, kBshd),
     mask_spec(SA_MASK_CAUSAL_WINDOW, false, 0, 300), true},
    // More than 128 listed blocks, most hidden by a window: the stager walks hidden chunks.
    {"CausalWindowRowOf150BlocksBlock64D64", shape_of(1, 1, 1, 64 * 150, 64 * 150, 64, 64, 150),
     mask_spec(SA_MASK_CAUSAL_WINDOW, false, 0, 100), true},
    // Rows of up to 65 (block 64) and 40 (block 128) visible blocks in a random order: the Hopper
    // kernel's filtered walk crosses its 32-slot chunks with visible entries on both sides, and
    // pairs them into block-64 stages across the chunk boundary.
    {"CausalLongRowsBlock64D128GqaBshd", shape_of(1, 2, 1, 64 * 65 - 20, 64 * 65 - 20, 128, 64,
                                                  65, kBshd),
     mask_spec(SA_MASK_CAUSAL), true, {}, SA_DTYPE_BF16, true},
    {"CausalLongRowsBlock128D64", shape_of(1, 2, 2, 128 * 40, 128 * 40, 64, 128, 40, kBhsd),
     mask_spec(SA_MASK_CAUSAL), true, {}, SA_DTYPE_BF16, true},
    // Offsets that hide one 64-row half of a 128-row block from a KV block but not the other:
    // -100 hides the first half of each diagonal block, +100 shows every key of the second half.
    {"CausalNegativeOffsetBlock128D128GqaDense", shape_of(1, 4, 2, 300, 300, 128, 128, 3, kBhsd),
     mask_spec(SA_MASK_CAUSAL, true, -100), true},
    {"CausalPositiveOffsetBlock128D64MqaBshdDense",
     shape_of(1, 4, 1, 384, 384, 64, 128, 3, kBshd), mask_spec(SA_MASK_CAUSAL, true, 100), true},
    // A causal MoBA-like pattern (random lists with partial blocks, block 128).
    {"CausalRandomPartialBlock128D128GqaBshd", shape_of(2, 4, 2, 520, 520, 128, 128, 3, kBshd),
     mask_spec(SA_MASK_CAUSAL), false, spec_of(true, -1, true, true)},
    // The sm90 backward's hidden warpgroup parts at block 128, D 128: offset -30 hides keys
    // 64-127 of each diagonal block from its rows 0-63 (warpgroup 1 skips [1]-[5] there) while
    // both warpgroups' keys of rows 64-127 are cut; S = 448 leaves the last block 64 valid keys,
    // so its warpgroup 1 (keys past S_kv) is hidden on every tile.
    {"CausalOffsetMinus30Block128D128GqaBshdDense", shape_of(1, 4, 2, 448, 448, 128, 128, 4, kBshd),
     mask_spec(SA_MASK_CAUSAL, true, -30), true},
};

// A forward case on one implementation: the portable path, or the sm90 forward (run only on an
// sm_90 device with the Hopper path built).
struct GpuMaskFwdCase {
  GpuMaskCase base;
  sa_impl impl;
  std::string name;
};

void PrintTo(const GpuMaskFwdCase& c, std::ostream* os) { *os << c.name; }

std::vector<GpuMaskFwdCase> forward_cases() {
  std::vector<GpuMaskFwdCase> out;
  for (const GpuMaskCase& c : kCases) out.push_back({c, SA_IMPL_PORTABLE, c.name});
  for (const GpuMaskCase& c : kCases) out.push_back({c, SA_IMPL_SM90, c.name + "Sm90"});
  return out;
}

class GpuBsaMaskForward : public ::testing::TestWithParam<GpuMaskFwdCase> {};

TEST_P(GpuBsaMaskForward, MatchesReference) {
  SA_SKIP_WITHOUT_GPU();
  if (GetParam().impl == SA_IMPL_SM90 && (!SA_HAVE_SM90 || !device_is_sm90()))
    GTEST_SKIP() << "needs an sm_90 device and the sm90 path";
  const GpuMaskCase& c = GetParam().base;
  const BsaShape& s = c.shape;
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  BsaPattern pat;
  if (c.all_blocks)
    list_all_blocks(s, pat, rng);
  else
    pat = random_bsa_pattern(s, c.spec, rng);
  BsaTensors t = make_bsa_tensors(s, c.dtype, rng);
  sa_bsa_options options = sa_bsa_options_default();
  options.layout = s.layout;
  options.block_size = s.block;
  options.count = pat.has_count ? -1 : pat.fixed_count;
  options.impl = GetParam().impl;
  c.mask.apply(options);
  expect_bsa_forward_matches_reference(s, pat, t, options, 8,
                                       c.dtype == SA_DTYPE_FP16 ? 2e-3 : 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuBsaMaskForward, ::testing::ValuesIn(forward_cases()),
                         [](const ::testing::TestParamInfo<GpuMaskFwdCase>& i) {
                           return i.param.name;
                         });

// ---- backward ----------------------------------------------------------------------------------
struct GpuMaskBwdCase {
  GpuMaskCase base;
  int32_t bucket;  // 0 automatic, kBsaBwdSingleOwner, or a split size
  bool deterministic;
  std::string name;
};

void PrintTo(const GpuMaskBwdCase& c, std::ostream* os) { *os << c.name; }

std::vector<GpuMaskBwdCase> backward_cases() {
  std::vector<GpuMaskBwdCase> out;
  for (const GpuMaskCase& c : kCases) {
    if (c.dtype != SA_DTYPE_BF16 || c.forward_only) continue;  // the portable backward: bf16
    out.push_back({c, 0, false, c.name + "BucketAuto"});
    out.push_back({c, kBsaBwdSingleOwner, false, c.name + "SingleOwner"});
    out.push_back({c, 2, false, c.name + "Bucket2"});
    out.push_back({c, 0, true, c.name + "Deterministic"});
  }
  return out;
}

// The problem of a case: GpuBsaBwdProblem (gpu_test_util.hpp) with the case's pattern and mask.
// sm90: K and V of padded keys := NaN (of the final pattern), as in the sm90 backward suite.
GpuBsaBwdProblem make_problem(const GpuMaskBwdCase& c, sa_impl impl) {
  GpuBsaBwdCase bc = gpu_bsa_bwd_case(c.name, c.base.shape, c.base.spec, c.bucket,
                                      c.deterministic);
  bc.mask = c.base.mask;
  GpuBsaBwdProblem p(bc, impl);
  if (c.base.all_blocks) {
    std::mt19937_64 rng(std::hash<std::string>{}(c.name) + 1);
    list_all_blocks(c.base.shape, p.pat, rng);
  }
  if (impl == SA_IMPL_SM90) poison_bsa_padded_keys(c.base.shape, p.pat, p.t);
  return p;
}

bool sm90_available() { return SA_HAVE_SM90 && device_is_sm90(); }

class GpuBsaMaskBackward : public ::testing::TestWithParam<GpuMaskBwdCase> {};

TEST_P(GpuBsaMaskBackward, MatchesReference) {
  SA_SKIP_WITHOUT_GPU();
  GpuBsaBwdProblem p = make_problem(GetParam(), SA_IMPL_PORTABLE);
  ASSERT_TRUE(p.forward());
  GpuBsaBwdDevice d(p);
  ASSERT_TRUE(d.ok());
  GpuBsaBwdGradients g;
  ASSERT_TRUE(run_bsa_backward(d, p, SA_IMPL_PORTABLE, &g));
  expect_bsa_backward_matches_reference(p, g);
}

TEST_P(GpuBsaMaskBackward, Sm90MatchesReference) {
  SA_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 device and the sm90 path";
  GpuBsaBwdProblem p = make_problem(GetParam(), SA_IMPL_SM90);
  ASSERT_TRUE(p.forward());
  GpuBsaBwdDevice d(p);
  ASSERT_TRUE(d.ok());
  GpuBsaBwdGradients g;
  ASSERT_TRUE(run_bsa_backward(d, p, SA_IMPL_SM90, &g));
  expect_bsa_backward_matches_reference(p, g);
}

// The same under the Hopper backward's tuning variants (Tuning::sm90_bsa_bwd_stats / _full:
// the loader warp's stats ring, which also judges each warpgroup's part of a tile against the
// band; the full-block path where every KV block is full, e.g. CausalBlock128D128MhaBhsdDense,
// CausalBlock128D64GqaBshdDense, WindowZeroBlock64D64, CausalPositiveOffsetBlock128D64MqaBshdDense).
TEST_P(GpuBsaMaskBackward, Sm90VariantsMatchReference) {
  SA_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 device and the sm90 path";
  GpuBsaBwdProblem p = make_problem(GetParam(), SA_IMPL_SM90);
  ASSERT_TRUE(p.forward());
  GpuBsaBwdDevice d(p);
  ASSERT_TRUE(d.ok());
  for (const auto& [name, stats, full] : {std::tuple<const char*, bool, bool>{"none", false, false},
                                          {"stats", true, false},
                                          {"full", false, true},
                                          {"stats+full", true, true}}) {
    SCOPED_TRACE(std::string("variant ") + name);
    sa::detail::Tuning t;
    t.sm90_bsa_bwd_stats = stats;
    t.sm90_bsa_bwd_full = full;
    const sa::detail::ScopedTuning tune(t);
    GpuBsaBwdGradients g;
    ASSERT_TRUE(run_bsa_backward(d, p, SA_IMPL_SM90, &g));
    expect_bsa_backward_matches_reference(p, g);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuBsaMaskBackward, ::testing::ValuesIn(backward_cases()),
                         [](const ::testing::TestParamInfo<GpuMaskBwdCase>& i) {
                           return i.param.name;
                         });

void expect_mask_deterministic(sa_impl impl) {
  for (const GpuMaskCase& c : {kCases[1], kCases[10], kCases[0]}) {
    SCOPED_TRACE(c.name);
    GpuBsaBwdProblem p = make_problem({c, 0, true, c.name}, impl);
    ASSERT_TRUE(p.forward());
    GpuBsaBwdDevice d(p);
    ASSERT_TRUE(d.ok());
    GpuBsaBwdGradients first;
    ASSERT_TRUE(run_bsa_backward(d, p, impl, &first));
    expect_bsa_backward_matches_reference(p, first);
    for (int run = 1; run < 3; ++run) {
      GpuBsaBwdGradients again;
      ASSERT_TRUE(run_bsa_backward(d, p, impl, &again));
      EXPECT_TRUE(bitwise_equal(again.dq, first.dq)) << "dq differs on run " << run;
      EXPECT_TRUE(bitwise_equal(again.dk, first.dk)) << "dk differs on run " << run;
      EXPECT_TRUE(bitwise_equal(again.dv, first.dv)) << "dv differs on run " << run;
    }
  }
}

TEST(GpuBsaMaskDeterministic, BitwiseIdenticalOverThreeRuns) {
  SA_SKIP_WITHOUT_GPU();
  expect_mask_deterministic(SA_IMPL_PORTABLE);
}

TEST(GpuBsaMaskDeterministic, Sm90BitwiseIdenticalOverThreeRuns) {
  SA_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 device and the sm90 path";
  expect_mask_deterministic(SA_IMPL_SM90);
}

// ---- routing on Hopper -------------------------------------------------------------------------
// Runs the masked forward of p through AUTO on the device and replaces p's o and lse (the
// reference's) by the GPU's; `used` gets the implementation that ran.
::testing::AssertionResult gpu_forward_into(GpuBsaBwdProblem& p, sa_impl* used) {
  DeviceTensor q(p.t.q, p.c.pad, 0), k(p.t.k, p.c.pad, 0), v(p.t.v, p.c.pad, 0),
      o(p.t.o, p.c.pad, 0), lse(p.t.lse, 0, 0), index(p.pat.q2k_index, 0, 0);
  HostTensor none_host(SA_DTYPE_INT32, {1});
  DeviceTensor count(p.pat.has_count ? p.pat.q2k_count : none_host, 0, 0);
  DeviceTensor block_len(p.pat.has_block_len ? p.pat.kv_block_len : none_host, 0, 0);
  if (!(q.ok() && k.ok() && v.ok() && o.ok() && lse.ok() && index.ok() && count.ok() &&
        block_len.ok()))
    return ::testing::AssertionFailure() << "device copies failed";
  sa_bsa_fwd_args a = bsa_fwd_args(q, k, v, o, lse, index, p.pat.has_count ? &count : nullptr,
                                   p.pat.has_block_len ? &block_len : nullptr);
  a.options = p.options();
  a.options.impl = SA_IMPL_AUTO;
  size_t bytes = 0;
  if (sa_bsa_forward_workspace_size(&a, &bytes) != SA_OK)
    return ::testing::AssertionFailure() << "workspace size: " << sa_last_error();
  DeviceBuffer workspace(bytes);
  if (!workspace.ok()) return ::testing::AssertionFailure() << "cudaMalloc failed";
  sa_context ctx = sa_context_default();
  ctx.workspace = workspace.get();
  ctx.workspace_bytes = bytes;
  ctx.impl_used = used;
  if (sa_bsa_forward(&a, &ctx) != SA_OK)
    return ::testing::AssertionFailure() << "sa_bsa_forward: " << sa_last_error();
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess)
    return ::testing::AssertionFailure() << "kernel failed: " << cudaGetErrorString(err);
  if (!o.download(p.t.o) || !lse.download(p.t.lse))
    return ::testing::AssertionFailure() << "download failed";
  return ::testing::AssertionSuccess();
}

// ---- dynamic tiles (sm90) -----------------------------------------------------------------------
struct DynTilesCase {
  std::string name;
  BsaShape shape;  // S_q = S_kv, K_max = 1 + round(0.25 (N_q - 1))
  sa_dtype dtype;
};
void PrintTo(const DynTilesCase& c, std::ostream* os) { *os << c.name; }

BsaShape moba_shape(int64_t B, int64_t Hq, int64_t Hkv, int64_t S, int64_t D, int32_t block) {
  const int64_t nq = (S + block - 1) / block;
  return shape_of(B, Hq, Hkv, S, S, D, block, 1 + std::llround(0.25 * static_cast<double>(nq - 1)),
                  kBshd);
}

// Every case has at least 256 tiles: 2 to 4 per CTA of a 132-SM H100 (the hand-off's two slots
// both turn over, k >= 2), the shortest rows last in the dynamic order. The first two (512 tiles,
// S 8192) are compared bit for bit with the static order only; the last two (256 tiles, S not a
// multiple of the block) also against the fp64 reference.
const DynTilesCase kDynCases[] = {
    {"MobaBlock128D128Gqa", moba_shape(1, 8, 2, 8192, 128, 128), SA_DTYPE_BF16},
    {"MobaBlock64D128", moba_shape(1, 4, 4, 8192, 128, 64), SA_DTYPE_BF16},
    {"MobaBlock128D64TwoBatchesFp16", moba_shape(2, 8, 2, 2048 - 40, 64, 128), SA_DTYPE_FP16},
    {"MobaBlock64D64TwoBatches", moba_shape(2, 4, 2, 2048 - 17, 64, 64), SA_DTYPE_BF16},
};

// Device copies of a dense masked problem's forward tensors (o and lse followed by NaN guards).
struct MaskedForwardDevice {
  DeviceTensor q, k, v, o, lse, index, count;
  MaskedForwardDevice(const BsaTensors& t, const BsaPattern& pat)
      : q(t.q, 8, 0), k(t.k, 8, 0), v(t.v, 8, 0), o(t.o, 8, 64 * t.o.shape().back()),
        lse(t.lse, 0, 64), index(pat.q2k_index, 0, 0), count(pat.q2k_count, 0, 0) {}
  bool ok() const {
    return q.ok() && k.ok() && v.ok() && o.ok() && lse.ok() && index.ok() && count.ok();
  }
  bool poison(cudaStream_t stream) { return o.poison(stream) && lse.poison(stream); }
  // o and lse into `out` (o, lse order); fails when a guard was written or a NaN is left.
  ::testing::AssertionResult download(const BsaTensors& t, std::vector<HostTensor>* out) const {
    out->assign({HostTensor(t.o.dtype(), t.o.shape()), HostTensor(SA_DTYPE_FP32, t.lse.shape())});
    if (auto r = o.download((*out)[0]); !r) return r;
    if (auto r = lse.download((*out)[1]); !r) return r;
    for (const HostTensor& x : *out)
      if (any_nan(x.to_double())) return ::testing::AssertionFailure() << "NaN left in an output";
    return ::testing::AssertionSuccess();
  }
};

sa_bsa_options moba_options(const BsaShape& s) {
  sa_bsa_options options = sa_bsa_options_default();
  options.layout = s.layout;
  options.block_size = s.block;
  options.count = -1;
  options.impl = SA_IMPL_SM90;
  options.mask = SA_MASK_CAUSAL;
  return options;
}

class GpuBsaMaskDynamicTiles : public ::testing::TestWithParam<DynTilesCase> {};

// Dynamic tiles (2) against the static order (1), and the rule (0) with and without the
// workspace: the same bytes (each tile's result does not depend on which CTA runs it or when).
TEST_P(GpuBsaMaskDynamicTiles, Sm90DynamicEqualsStaticBitwise) {
  SA_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 device and the sm90 path";
  const DynTilesCase& c = GetParam();
  const BsaShape& s = c.shape;
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  BsaPattern pat;
  moba_causal_blocks(s, pat, rng);
  const BsaTensors t = make_bsa_tensors(s, c.dtype, rng);
  MaskedForwardDevice d(t, pat);
  ASSERT_TRUE(d.ok());
  sa_bsa_fwd_args args = bsa_fwd_args(d.q, d.k, d.v, d.o, d.lse, d.index, &d.count);
  args.options = moba_options(s);
  size_t bytes = 0;
  ASSERT_EQ(sa_bsa_forward_workspace_size(&args, &bytes), SA_OK) << sa_last_error();
  EXPECT_GE(bytes, sizeof(uint32_t)) << "a masked call asks for the tile counter";
  std::vector<HostTensor> want;
  ASSERT_TRUE(d.poison(nullptr));
  ASSERT_TRUE(run_bsa_forward_tiles(args, 1, true));
  ASSERT_TRUE(d.download(t, &want));
  const std::pair<int32_t, bool> runs[] = {{2, true}, {0, true}, {0, false}, {2, true}};
  for (const auto& [tiles, workspace_given] : runs) {
    SCOPED_TRACE("tuning " + std::to_string(tiles) + (workspace_given ? "" : ", no workspace"));
    ASSERT_TRUE(d.poison(nullptr));
    ASSERT_TRUE(run_bsa_forward_tiles(args, tiles, workspace_given));
    std::vector<HostTensor> got;
    ASSERT_TRUE(d.download(t, &got));
    EXPECT_TRUE(bitwise_equal(got[0], want[0])) << "o differs from the static order's";
    EXPECT_TRUE(bitwise_equal(got[1], want[1])) << "lse differs from the static order's";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuBsaMaskDynamicTiles, ::testing::ValuesIn(kDynCases),
                         [](const ::testing::TestParamInfo<DynTilesCase>& i) {
                           return i.param.name;
                         });

// The smaller cases against the fp64 reference: dynamic tiles (the queried workspace, garbage in
// it) and the static fallback of the rule without a workspace.
class GpuBsaMaskDynamicTilesReference : public ::testing::TestWithParam<DynTilesCase> {};

TEST_P(GpuBsaMaskDynamicTilesReference, Sm90MatchesReference) {
  SA_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 device and the sm90 path";
  const DynTilesCase& c = GetParam();
  const BsaShape& s = c.shape;
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  BsaPattern pat;
  moba_causal_blocks(s, pat, rng);
  const BsaTensors t = make_bsa_tensors(s, c.dtype, rng);
  const double tol = c.dtype == SA_DTYPE_FP16 ? 2e-3 : 1e-2;
  {
    SCOPED_TRACE("dynamic tiles");
    sa::detail::Tuning tuning;
    tuning.sm90_fwd_dyn = 2;
    const sa::detail::ScopedTuning tune(tuning);
    expect_bsa_forward_matches_reference(s, pat, t, moba_options(s), 8, tol);
  }
  {
    SCOPED_TRACE("no workspace: the static order");
    expect_bsa_forward_matches_reference(s, pat, t, moba_options(s), 8, tol,
                                         /*workspace_given=*/false);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuBsaMaskDynamicTilesReference,
                         ::testing::Values(kDynCases[2], kDynCases[3]),
                         [](const ::testing::TestParamInfo<DynTilesCase>& i) {
                           return i.param.name;
                         });

// Forced dynamic tiles with no room for the counter: refused by name, nothing run.
TEST(GpuBsaMaskDynamicTilesRefusal, Sm90ForcedWithoutWorkspaceIsAnError) {
  SA_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 device and the sm90 path";
  const BsaShape s = moba_shape(1, 2, 2, 512, 64, 64);
  std::mt19937_64 rng(3);
  BsaPattern pat;
  moba_causal_blocks(s, pat, rng);
  const BsaTensors t = make_bsa_tensors(s, SA_DTYPE_BF16, rng);
  MaskedForwardDevice d(t, pat);
  ASSERT_TRUE(d.ok());
  sa_bsa_fwd_args args = bsa_fwd_args(d.q, d.k, d.v, d.o, d.lse, d.index, &d.count);
  args.options = moba_options(s);
  sa::detail::Tuning tuning;
  tuning.sm90_fwd_dyn = 2;
  const sa::detail::ScopedTuning tune(tuning);
  EXPECT_EQ(sa_bsa_forward(&args, nullptr), SA_ERROR_WORKSPACE);
  EXPECT_NE(std::string(sa_last_error()).find("dynamic tiles"), std::string::npos)
      << sa_last_error();
}

// A graph captured with dynamic tiles replays twice, the workspace's counter full of garbage
// before each replay: the captured memset zeroes it, and each replay gives the static order's
// bytes (block 64: the key-split consumers' lead alternation follows the dynamic sequence).
TEST(GpuBsaMaskDynamicTilesGraph, Sm90ReplaysResetTheCounter) {
  SA_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 device and the sm90 path";
  for (const DynTilesCase& c : {kDynCases[1], kDynCases[0]}) {
    SCOPED_TRACE(c.name);
    const BsaShape& s = c.shape;
    std::mt19937_64 rng(std::hash<std::string>{}(c.name) + 1);
    BsaPattern pat;
    moba_causal_blocks(s, pat, rng);
    const BsaTensors t = make_bsa_tensors(s, c.dtype, rng);
    MaskedForwardDevice d(t, pat);
    ASSERT_TRUE(d.ok());
    sa_bsa_fwd_args args = bsa_fwd_args(d.q, d.k, d.v, d.o, d.lse, d.index, &d.count);
    args.options = moba_options(s);
    std::vector<HostTensor> want;
    ASSERT_TRUE(d.poison(nullptr));
    ASSERT_TRUE(run_bsa_forward_tiles(args, 1, true));
    ASSERT_TRUE(d.download(t, &want));
    replay_bsa_forward_graph(
        args, 2, 2, [&](cudaStream_t stream) { return d.poison(stream); },
        [&](int) {
          std::vector<HostTensor> got;
          ASSERT_TRUE(d.download(t, &got));
          EXPECT_TRUE(bitwise_equal(got[0], want[0])) << "o differs from the static order's";
          EXPECT_TRUE(bitwise_equal(got[1], want[1])) << "lse differs from the static order's";
        });
  }
}

TEST(GpuBsaMaskRouting, AutoRunsSm90ForwardAndBackward) {
  SA_SKIP_WITHOUT_GPU();
  if (!SA_HAVE_SM90 || !device_is_sm90()) GTEST_SKIP() << "needs an sm_90 device and the sm90 path";
  // Causal block 128 (dense lists: hidden, partial and inside blocks), causal_window block 128
  // (random lists with partial blocks), causal block 64 with S_q > S_kv (rows that see no key).
  for (const GpuMaskCase& c : {kCases[0], kCases[10], kCases[5]}) {
    SCOPED_TRACE(c.name);
    GpuBsaBwdProblem p = make_problem({c, 0, false, c.name}, SA_IMPL_AUTO);
    // Forward: AUTO runs the sm90 kernel; its o and lse replace the reference's in p.
    sa_impl used = SA_IMPL_AUTO;
    ASSERT_TRUE(gpu_forward_into(p, &used));
    EXPECT_EQ(used, SA_IMPL_SM90);
    // Backward: AUTO (the sm90 path for a dense masked batch) and the portable path, on the sm90
    // forward's o and lse, each match the reference backward of the same o and lse (one LSE
    // convention: natural log, -inf for a row that sees no key).
    GpuBsaBwdDevice d(p);
    ASSERT_TRUE(d.ok());
    // run_bsa_backward runs the problem's requested implementation (p.impl) and checks that
    // `expect` ran: AUTO must pick sm90 for a dense masked batch; portable must run portable.
    const std::pair<sa_impl, sa_impl> runs[] = {{SA_IMPL_AUTO, SA_IMPL_SM90},
                                                {SA_IMPL_PORTABLE, SA_IMPL_PORTABLE}};
    for (const auto& [requested, expect] : runs) {
      p.impl = requested;
      GpuBsaBwdGradients g;
      ASSERT_TRUE(run_bsa_backward(d, p, expect, &g));
      expect_bsa_backward_matches_reference(p, g);
    }
    sa_bsa_bwd_args a = d.args(p);
    a.options.impl = SA_IMPL_SM90;
    size_t bytes = 0;
    EXPECT_EQ(sa_bsa_backward_workspace_size(&a, &bytes), SA_OK) << sa_last_error();
  }
}

}  // namespace
}  // namespace sa_test
