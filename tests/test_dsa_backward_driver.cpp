// The DSA backward driver's workspace plan (src/cuda/dsa_backward_driver.hpp), on the CPU: the
// layout both arch policies get (portable: 32 or 64 heads per CTA, sm90: 64), which Python caches
// by size and the launches address by offset. Deterministic mode's partial rows ask CUB for its
// sort's scratch (a device query), so that test runs only with a GPU; the fixed-point mode's
// plan runs on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/problem.hpp"
#include "cuda/dsa_backward_driver.hpp"
#include "test_util.hpp"

namespace sa_test {
namespace {

using sa::portable::dsa_bwd::plan_workspace;
using sa::portable::dsa_bwd::WorkspacePlan;

size_t align256(int64_t bytes) { return (static_cast<size_t>(bytes) + 255) / 256 * 256; }

struct PlanCase {
  std::string name;
  int64_t Sq, Skv, H, Dqk, topk;
  bool sink, length;
  int heads_per_cta;
};

sa::DsaBwdProblem problem_of(const PlanCase& c, bool deterministic) {
  static float d_sink[1];
  static int32_t length[1];
  sa::DsaBwdProblem p;
  p.dims.Sq = c.Sq;
  p.dims.Skv = c.Skv;
  p.dims.H = c.H;
  p.dims.Dqk = c.Dqk;
  p.dims.Dv = 512;
  p.dims.topk = c.topk;
  p.options.deterministic = deterministic ? 1 : 0;
  p.d_sink = c.sink ? d_sink : nullptr;
  p.meta.topk_length.data = c.length ? length : nullptr;
  return p;
}

// The parts after the accumulator in every mode: the d_sink terms (with d_sink), then the item
// counter (with topk_length), from offset `at`; returns the offset after them.
size_t expect_terms_and_counter(const WorkspacePlan& plan, const PlanCase& c, size_t at) {
  if (c.sink) {
    EXPECT_EQ(plan.terms, at);
    at += align256(c.H * c.Sq * 4);
  }
  EXPECT_EQ(plan.counter, c.length);
  if (c.length) {
    EXPECT_EQ(plan.counter_at, at);
    at += 256;
  }
  return at;
}

class DsaBackwardDriverPlan : public ::testing::TestWithParam<PlanCase> {};

// Atomic mode: the fp32 accumulator, then the d_sink terms (with d_sink), then the item counter
// (with topk_length), each 256-byte aligned, plus 256 bytes of slack for the caller's pointer.
TEST_P(DsaBackwardDriverPlan, AtomicModeLayout) {
  const PlanCase& c = GetParam();
  const WorkspacePlan plan = plan_workspace(problem_of(c, false), c.heads_per_cta);
  size_t at = 0;
  EXPECT_EQ(plan.acc, at);
  at += align256(c.Skv * c.Dqk * 4);
  at = expect_terms_and_counter(plan, c, at);
  EXPECT_EQ(plan.groups, (c.H + c.heads_per_cta - 1) / c.heads_per_cta);
  EXPECT_FALSE(plan.deterministic);
  EXPECT_EQ(plan.total, at + 256);
}

// Deterministic mode: after the atomic parts, one slice's partial rows, the sort's four item
// arrays and its scratch.
TEST_P(DsaBackwardDriverPlan, DeterministicModeLayout) {
  SA_SKIP_WITHOUT_GPU();
  const PlanCase& c = GetParam();
  const WorkspacePlan atomic = plan_workspace(problem_of(c, false), c.heads_per_cta);
  for (int64_t pinned : {int64_t{0}, int64_t{5}}) {
    const WorkspacePlan plan = plan_workspace(problem_of(c, true), c.heads_per_cta, pinned);
    const int64_t groups = (c.H + c.heads_per_cta - 1) / c.heads_per_cta;
    const int64_t per_token = groups * c.topk * c.Dqk * 4;
    int64_t slice = pinned > 0 ? pinned : std::max<int64_t>(1, (int64_t{2} << 30) / per_token);
    slice = std::min<int64_t>({slice, c.Sq, INT32_MAX / c.topk});
    EXPECT_TRUE(plan.deterministic);
    EXPECT_EQ(plan.slice, slice) << "pinned " << pinned;
    size_t at = atomic.total - 256;
    EXPECT_EQ(plan.part, at);
    at += align256(slice * per_token);
    for (size_t offset : {plan.keys_in, plan.keys_out, plan.vals_in, plan.vals_out}) {
      EXPECT_EQ(offset, at);
      at += align256(slice * c.topk * 4);
    }
    EXPECT_EQ(plan.cub, at);
    EXPECT_GT(plan.cub_bytes, 0u);
    EXPECT_EQ(plan.total, at + align256(static_cast<int64_t>(plan.cub_bytes)) + 256);
  }
}

// The parts after the fixed-point accumulator (at its end: `at`), shared by the int64 and
// binned plans: row flags, slot counts, FixCtl, the d_sink terms and the item counter, no slices;
// returns the end of the counter's part.
size_t expect_fixed_point_tail(const WorkspacePlan& plan, const PlanCase& c, size_t at) {
  EXPECT_EQ(plan.bad, at);
  at += align256(c.Skv * 4);
  EXPECT_EQ(plan.counts, at);
  at += align256(c.Skv * 4);
  EXPECT_EQ(plan.ctl, at);
  at += 256;
  at = expect_terms_and_counter(plan, c, at);
  EXPECT_EQ(plan.slice, 0);
  return at;
}

// Deterministic mode by fixed point (a policy with fixed_point, the Hopper one): the int64
// accumulator of S_kv + 1 rows (the spare row takes inactive slots) in place of the fp32 one,
// the row flags, the slot counts and the control words, then the d_sink terms and the counter
// as in atomic mode; no slices, no sort (so no device query: this runs on the CPU).
TEST_P(DsaBackwardDriverPlan, FixedPointModeLayout) {
  const PlanCase& c = GetParam();
  sa::portable::dsa_bwd::KernelPolicy policy;
  policy.heads_per_cta = c.heads_per_cta;
  policy.fixed_point = true;
  const WorkspacePlan plan = plan_workspace(problem_of(c, true), policy);
  EXPECT_TRUE(plan.deterministic);
  EXPECT_TRUE(plan.fixed);
  size_t at = 0;
  EXPECT_EQ(plan.fix, at);
  at += align256((c.Skv + 1) * c.Dqk * 8);
  at = expect_fixed_point_tail(plan, c, at);
  EXPECT_EQ(plan.cub_bytes, 0u);
  EXPECT_EQ(plan.total, at + 256);
}

// The binned plan (a policy with fixed_point and launch_binned, the Hopper one under
// Tuning::sm90_dsa_bwd_det_binned): the kBinCount planes of S_kv + 1 rows of D_qk / 2 words in
// place of the int64 accumulator (their first two planes hold its rows, for the plan's int64
// form), then the same parts as the int64 plan.
void no_launch(const sa::portable::dsa_bwd::DsaBwdParams&, int64_t, int, cudaStream_t) {}

TEST_P(DsaBackwardDriverPlan, BinnedPlanLayout) {
  const PlanCase& c = GetParam();
  sa::portable::dsa_bwd::KernelPolicy policy;
  policy.heads_per_cta = c.heads_per_cta;
  policy.fixed_point = true;
  policy.launch_binned = &no_launch;
  const WorkspacePlan plan = plan_workspace(problem_of(c, true), policy);
  EXPECT_TRUE(plan.fixed);
  EXPECT_TRUE(plan.binned);
  size_t at = 0;
  EXPECT_EQ(plan.fix, at);
  const int64_t planes = 8 * (c.Skv + 1) * (c.Dqk / 2) * 8;
  EXPECT_GE(planes, (c.Skv + 1) * c.Dqk * 8);
  at += align256(planes);
  at = expect_fixed_point_tail(plan, c, at);
  EXPECT_EQ(plan.total, at + 256);
  // Outside deterministic mode launch_binned changes nothing.
  EXPECT_FALSE(plan_workspace(problem_of(c, false), policy).binned);
}

std::vector<PlanCase> plan_cases() {
  return {
      {"headline_h128_d576_sink_len_m64", 4096, 8192, 128, 576, 2048, true, true, 64},
      {"h64_d512_m64", 4096, 8192, 64, 512, 2048, false, false, 64},
      {"h16_d576_sink_m32", 7, 257, 16, 576, 64, true, false, 32},
      {"h16_d576_len_m64_padded", 7, 257, 16, 576, 64, false, true, 64},
      {"one_token_one_key_m32", 1, 1, 32, 512, 1, true, true, 32},
      {"h128_d512_topk1_m32", 3, 100, 128, 512, 1, false, true, 32},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, DsaBackwardDriverPlan, ::testing::ValuesIn(plan_cases()),
                         [](const ::testing::TestParamInfo<PlanCase>& i) { return i.param.name; });

}  // namespace
}  // namespace sa_test
