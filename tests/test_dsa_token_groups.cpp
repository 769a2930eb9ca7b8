// Token groups of the DSA backward (src/cuda/dsa_token_groups.hpp): on the CPU, which head counts
// and layouts take them, the entries a group's union may need and the driver's workspace plan
// with them; with a GPU, the union builder against a union computed here (keys ascending, the
// multiplicities of each token adding up to its active slots, splits past a 4-bit field, the
// presence word, partial last groups, empty rows, topk_length, invalid indices, several windows
// of S_kv).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/problem.hpp"
#include "cuda/dsa_backward_driver.hpp"
#include "cuda/dsa_token_groups.hpp"
#include "test_util.hpp"

namespace sa_test {
namespace {

using sa::portable::dsa_bwd::group_capacity;
using sa::portable::dsa_bwd::group_tokens;
using sa::portable::dsa_bwd::kGroupFieldBits;
using sa::portable::dsa_bwd::kGroupFieldMax;
using sa::portable::dsa_bwd::KernelPolicy;
using sa::portable::dsa_bwd::plan_workspace;
using sa::portable::dsa_bwd::token_groups_eligible;
using sa::portable::dsa_bwd::WorkspacePlan;

size_t align256(int64_t bytes) { return (static_cast<size_t>(bytes) + 255) / 256 * 256; }

// A problem of contiguous token-major tensors (only the dims, strides and optional pointers
// matter to the plan).
sa::DsaBwdProblem contiguous_problem(int64_t Sq, int64_t Skv, int64_t H, int64_t Dqk,
                                     int64_t topk, bool sink, bool length, bool deterministic) {
  static float d_sink[1];
  static int32_t len[1];
  sa::DsaBwdProblem p;
  p.dims.Sq = Sq;
  p.dims.Skv = Skv;
  p.dims.H = H;
  p.dims.Dqk = Dqk;
  p.dims.Dv = 512;
  p.dims.topk = topk;
  p.options.deterministic = deterministic ? 1 : 0;
  p.d_sink = sink ? d_sink : nullptr;
  p.meta.topk_length.data = length ? len : nullptr;
  for (sa::Shd* t : {&p.q, &p.dq}) {
    t->sh = Dqk;
    t->ss = H * Dqk;
  }
  for (sa::Shd* t : {&p.out, &p.dout}) {
    t->sh = 512;
    t->ss = H * 512;
  }
  p.lse_stride[0] = H;
  p.lse_stride[1] = 1;
  return p;
}

KernelPolicy groups_policy() {
  KernelPolicy k;
  k.op = "test";
  k.heads_per_cta = 64;
  k.token_groups = true;
  return k;
}

TEST(DsaTokenGroups, HeadCountsThatTakeGroups) {
  EXPECT_EQ(group_tokens(8), 8);
  EXPECT_EQ(group_tokens(16), 4);
  EXPECT_EQ(group_tokens(32), 2);
  for (int64_t H : {1, 2, 4, 12, 24, 48, 64, 80, 128}) EXPECT_EQ(group_tokens(H), 0) << H;
}

// Long sequences take several slices of groups, each within kGroupUnionBytesCap.
TEST(DsaTokenGroups, UnionsComeInSlicesWithinTheCap) {
  const sa::DsaBwdProblem p =
      contiguous_problem(131072, 131072, 16, 576, 2048, true, false, false);
  const WorkspacePlan plan = plan_workspace(p, groups_policy());
  const int64_t per_group = plan.group_cap * 8 + 8;
  EXPECT_EQ(plan.group_cap, 8192);
  EXPECT_LE(plan.group_slice * per_group, sa::portable::dsa_bwd::kGroupUnionBytesCap);
  EXPECT_EQ(plan.group_slice, 6554);  // 32,768 groups in 5 equal slices (at most 8,191 each)
}

TEST(DsaTokenGroups, CapacityBoundsEveryUnion) {
  // min(G topk, S_kv + ceil(G topk / 15)), at least 1.
  EXPECT_EQ(group_capacity(4096, 2048, 2), 4096);          // G topk
  EXPECT_EQ(group_capacity(4096, 2048, 4), 4096 + 547);    // ceil(8192 / 15) = 547
  EXPECT_EQ(group_capacity(4096, 2048, 8), 4096 + 1093);   // ceil(16384 / 15) = 1093
  EXPECT_EQ(group_capacity(4, 96, 8), 4 + 52);             // ceil(768 / 15) = 52
  EXPECT_EQ(group_capacity(100000, 64, 4), 256);
  EXPECT_EQ(group_capacity(1, 1, 2), 2);
}

TEST(DsaTokenGroups, EligibleProblems) {
  for (int64_t H : {8, 16, 32})
    EXPECT_TRUE(token_groups_eligible(contiguous_problem(5, 100, H, 576, 64, true, true, false)))
        << H;
  EXPECT_FALSE(token_groups_eligible(contiguous_problem(5, 100, 64, 576, 64, true, true, false)));
  EXPECT_FALSE(token_groups_eligible(contiguous_problem(5, 100, 24, 576, 64, true, true, false)));
  // Deterministic mode keeps its own route.
  EXPECT_FALSE(token_groups_eligible(contiguous_problem(5, 100, 16, 576, 64, false, false, true)));
  // A tensor whose tokens are not H head rows apart: a group's rows are not one "token".
  for (int which = 0; which < 5; ++which) {
    sa::DsaBwdProblem p = contiguous_problem(5, 100, 16, 576, 64, false, false, false);
    sa::Shd* t[4] = {&p.q, &p.dq, &p.out, &p.dout};
    if (which < 4)
      t[which]->ss += 8;
    else
      p.lse_stride[0] = 17;
    EXPECT_FALSE(token_groups_eligible(p)) << which;
  }
}

// With token groups the plan adds, after the accumulator and the d_sink terms, the item counter
// (also without topk_length) and the unions; the same problem's plan without them is unchanged.
TEST(DsaTokenGroups, WorkspacePlan) {
  struct Case {
    int64_t Sq, Skv, H, topk;
    bool sink, length;
  };
  for (const Case& c : {Case{4096, 4096, 16, 2048, true, false}, Case{7, 300, 32, 64, false, true},
                        Case{21, 48, 8, 40, true, true}, Case{1, 1, 8, 1, false, false}}) {
    const sa::DsaBwdProblem p =
        contiguous_problem(c.Sq, c.Skv, c.H, 576, c.topk, c.sink, c.length, false);
    SCOPED_TRACE("H " + std::to_string(c.H) + " S_q " + std::to_string(c.Sq));
    const WorkspacePlan plain = plan_workspace(p, 64);
    const WorkspacePlan plan = plan_workspace(p, groups_policy());
    const int G = group_tokens(c.H);
    // One slice of all groups: the unions fit kGroupUnionBytesCap at these sizes.
    const int64_t items = (c.Sq + G - 1) / G;
    EXPECT_EQ(plan.group_slice, items);
    EXPECT_EQ(plain.group_tokens, 0);
    EXPECT_EQ(plan.group_tokens, G);
    EXPECT_EQ(plan.group_cap, group_capacity(c.Skv, c.topk, G));
    size_t at = align256(c.Skv * 576 * 4);
    if (c.sink) at += align256(c.H * c.Sq * 4);
    EXPECT_TRUE(plan.counter);
    EXPECT_EQ(plan.counter_at, at);
    at += 256;
    EXPECT_EQ(plan.group_keys, at);
    at += align256(items * plan.group_cap * 4);
    EXPECT_EQ(plan.group_mult, at);
    at += align256(items * plan.group_cap * 4);
    EXPECT_EQ(plan.group_len, at);
    at += align256(items * 4);
    EXPECT_EQ(plan.group_present, at);
    at += align256(items * 4);
    EXPECT_EQ(plan.total, at + 256);
    EXPECT_GE(plan.total, plain.total);
    // Pinned slices (slice_tokens: max(1, slice_tokens / G) groups).
    EXPECT_EQ(plan_workspace(p, groups_policy(), 5).group_slice, std::min<int64_t>(
                                                                     items, std::max(1, 5 / G)));
    // A policy without token groups plans as the heads-per-CTA overload.
    KernelPolicy padded = groups_policy();
    padded.token_groups = false;
    EXPECT_EQ(plan_workspace(p, padded).total, plain.total);
  }
}

// ---- the builder on the GPU --------------------------------------------------------------------
struct Union {
  std::vector<int32_t> keys;
  std::vector<uint32_t> mult;
  uint32_t present = 0;
};

// The union of group b as the header describes it, from SPEC 2's active-slot rule.
Union host_union(const std::vector<int32_t>& idx, const std::vector<int32_t>* len, int64_t Sq,
                 int64_t Skv, int64_t topk, int G, int64_t b) {
  std::map<int32_t, std::vector<uint32_t>> count;
  for (int g = 0; g < G && b * G + g < Sq; ++g) {
    const int64_t t = b * G + g;
    int64_t n = topk;
    if (len != nullptr) n = std::min<int64_t>(std::max<int32_t>((*len)[t], 0), topk);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t j = idx[t * topk + i];
      if (j < 0 || j >= Skv) continue;
      auto& c = count[j];
      c.resize(G, 0u);
      ++c[g];
    }
  }
  Union u;
  for (const auto& [key, c] : count) {
    const uint32_t most = *std::max_element(c.begin(), c.end());
    for (uint32_t e = 0; e * kGroupFieldMax < most; ++e) {
      uint32_t word = 0;
      for (int g = 0; g < G; ++g) {
        const uint32_t done = e * kGroupFieldMax;
        if (c[g] > done) word |= std::min(kGroupFieldMax, c[g] - done) << (kGroupFieldBits * g);
      }
      u.keys.push_back(key);
      u.mult.push_back(word);
      u.present |= word;
    }
  }
  return u;
}

struct BuilderCase {
  std::string name;
  int64_t Sq, Skv, topk;
  int G;
  bool length, invalid;
  int32_t key_range;  // keys drawn from [0, key_range) (with replacement: duplicates)
};

class DsaTokenGroupsGpu : public ::testing::TestWithParam<BuilderCase> {};

TEST_P(DsaTokenGroupsGpu, UnionsMatchTheHost) {
  SA_SKIP_WITHOUT_GPU();
  const BuilderCase& c = GetParam();
  std::mt19937_64 rng(7);
  std::vector<int32_t> idx(static_cast<size_t>(c.Sq * c.topk)), len(static_cast<size_t>(c.Sq));
  std::uniform_int_distribution<int32_t> key(0, c.key_range - 1);
  const int32_t bad[4] = {-1, static_cast<int32_t>(c.Skv), std::numeric_limits<int32_t>::max(),
                          std::numeric_limits<int32_t>::min()};
  for (int64_t t = 0; t < c.Sq; ++t) {
    len[t] = std::uniform_int_distribution<int32_t>(-2, static_cast<int32_t>(c.topk + 3))(rng);
    if (t < 2) len[t] = t == 0 ? 0 : -3;  // a first group of empty rows at G 2
    for (int64_t i = 0; i < c.topk; ++i) {
      int32_t j = key(rng);
      if (c.invalid && rng() % 5 == 0) j = bad[rng() % 4];
      idx[t * c.topk + i] = j;
    }
  }
  const int G = c.G;
  const int64_t items = (c.Sq + G - 1) / G;
  const int64_t cap = group_capacity(c.Skv, c.topk, G);
  int32_t *d_idx = nullptr, *d_len = nullptr, *d_keys = nullptr, *d_entries = nullptr;
  uint32_t *d_mult = nullptr, *d_present = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_idx), idx.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_len), len.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_keys), items * cap * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_mult), items * cap * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_entries), items * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_present), items * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_idx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_len, len.data(), len.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_entries, 0x7f, items * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_present, 0x7f, items * 4), cudaSuccess);
  sa::portable::dsa_bwd::TokenGroupArgs a{};
  a.rows.idx = d_idx;
  a.rows.len = c.length ? d_len : nullptr;
  a.rows.idx_ss = c.topk;
  a.rows.idx_si = 1;
  a.rows.len_s = 1;
  a.rows.skv = c.Skv;
  a.rows.topk = static_cast<int32_t>(c.topk);
  a.sq = c.Sq;
  a.G = G;
  a.cap = cap;
  // Two slices (the driver's slices of groups): [0, half) and [half, items), each into its rows.
  const int64_t half = items / 2;
  const int64_t slices[2][2] = {{0, half}, {half, items - half}};  // {first, groups}; half may be 0
  for (const auto& slice : slices) {
    const int64_t first = slice[0];
    a.first = first;
    a.groups = slice[1];
    a.keys = d_keys + first * cap;
    a.mult = d_mult + first * cap;
    a.entries = d_entries + first;
    a.present = d_present + first;
    sa::portable::dsa_bwd::build_token_groups(a, nullptr);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<int32_t> keys(static_cast<size_t>(items * cap)), entries(static_cast<size_t>(items));
  std::vector<uint32_t> mult(keys.size()), present(entries.size());
  ASSERT_EQ(cudaMemcpy(keys.data(), d_keys, keys.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(mult.data(), d_mult, mult.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(entries.data(), d_entries, entries.size() * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(present.data(), d_present, present.size() * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (void* ptr : {static_cast<void*>(d_idx), static_cast<void*>(d_len),
                    static_cast<void*>(d_keys), static_cast<void*>(d_mult),
                    static_cast<void*>(d_entries), static_cast<void*>(d_present)})
    (void)cudaFree(ptr);
  int64_t split = 0;
  for (int64_t b = 0; b < items; ++b) {
    const Union want = host_union(idx, c.length ? &len : nullptr, c.Sq, c.Skv, c.topk, G, b);
    ASSERT_EQ(entries[b], static_cast<int32_t>(want.keys.size())) << "group " << b;
    ASSERT_LE(entries[b], cap) << "group " << b;
    EXPECT_EQ(present[b], want.present) << "group " << b;
    for (size_t e = 0; e < want.keys.size(); ++e) {
      ASSERT_EQ(keys[b * cap + e], want.keys[e]) << "group " << b << " entry " << e;
      ASSERT_EQ(mult[b * cap + e], want.mult[e]) << "group " << b << " entry " << e;
      split += e > 0 && want.keys[e] == want.keys[e - 1];
    }
  }
  if (c.key_range * 15 < c.topk) {
    EXPECT_GT(split, 0) << "the case meant to split did not";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DsaTokenGroupsGpu,
    ::testing::Values(
        // name, Sq, Skv, topk, G, length, invalid, key range
        BuilderCase{"G2_OddTokens", 7, 300, 64, 2, true, true, 300},
        BuilderCase{"G4_PartialLastGroup", 13, 4096, 2048, 4, false, false, 4096},
        BuilderCase{"G8_TwoWindows", 21, 4096, 512, 8, true, true, 4096},
        BuilderCase{"G4_ManyWindows", 9, 50000, 1024, 4, true, false, 50000},
        BuilderCase{"G8_Over15Splits", 11, 4, 96, 8, false, false, 4},
        BuilderCase{"G2_Over15SplitsLengths", 6, 8, 200, 2, true, true, 3},
        BuilderCase{"G8_OneToken", 1, 10, 3, 8, false, true, 10}),
    [](const ::testing::TestParamInfo<BuilderCase>& i) { return i.param.name; });

}  // namespace
}  // namespace sa_test
