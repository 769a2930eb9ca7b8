// The BSA backward driver's plan (src/cuda/bsa_backward_driver.hpp), on the CPU: for each arch's
// policy shape (portable: CTA slots, no tail order; sm90: CTA slots and a tail order) the driver's
// plan is the one the arch folders built before the driver owned it:
//   make_bsa_backward_plan(p, auto bucket ? cta_slots(p) : 0, deterministic, !deterministic, tail)
// field by field over a grid of shapes and options. CTA slots and tails are stubbed (no GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "common/problem.hpp"
#include "cuda/bsa_backward_driver.hpp"
#include "cuda/bsa_backward_plan.hpp"
#include "test_util.hpp"

namespace sa_test {
namespace {

namespace bsa_bwd = sa::portable::bsa_bwd;
using sa::portable::BsaBwdPlan;

int64_t g_slots = 0;
int32_t g_tail = 0;
int g_slot_calls = 0;
int64_t stub_slots(const sa::BsaBwdProblem&) { ++g_slot_calls; return g_slots; }
int32_t stub_tail(const sa::BsaBwdProblem&) { return g_tail; }

void expect_same(const BsaBwdPlan& a, const BsaBwdPlan& b) {
  EXPECT_EQ(a.bucket, b.bucket);
  EXPECT_EQ(a.tail_items, b.tail_items);
  EXPECT_EQ(a.several_owners, b.several_owners);
  EXPECT_EQ(a.dq_accumulator, b.dq_accumulator);
  EXPECT_EQ(a.Sq_pad, b.Sq_pad);
  EXPECT_EQ(a.Skv_pad, b.Skv_pad);
  EXPECT_EQ(a.lse2, b.lse2);
  EXPECT_EQ(a.delta, b.delta);
  EXPECT_EQ(a.dq_accum, b.dq_accum);
  EXPECT_EQ(a.dk_accum, b.dk_accum);
  EXPECT_EQ(a.dv_accum, b.dv_accum);
  EXPECT_EQ(a.map, b.map);
  EXPECT_EQ(a.dq_bytes, b.dq_bytes);
  EXPECT_EQ(a.dq_ready, b.dq_ready);
  EXPECT_EQ(a.dkv_bytes, b.dkv_bytes);
  EXPECT_EQ(a.map_bytes, b.map_bytes);
  EXPECT_EQ(a.dq_ready_count, b.dq_ready_count);
  EXPECT_EQ(a.total, b.total);
}

TEST(BsaBackwardDriverPlan, SameAsTheArchPlansBeforeTheDriver) {
  SA_SKIP_WITHOUT_GPU();  // the plan asks CUB for its scan's temporary bytes on the device
  const bsa_bwd::KernelPolicy portable{"portable", false, &stub_slots, nullptr, nullptr, nullptr};
  const bsa_bwd::KernelPolicy hopper{"sm90", true, &stub_slots, &stub_tail, nullptr, nullptr};
  int cases = 0;
  for (int64_t B : {1, 2, 3})
    for (int64_t Hkv : {1, 2, 8})
      for (int64_t group : {1, 4, 16})
        for (int64_t S : {1, 63, 64, 129, 1000, 4096, 32768})
          for (int64_t Skv_extra : {0, 77})
            for (int32_t block : {64, 128})
              for (int64_t D : {64, 128})
                for (int64_t Kmax : {1, 4, 16})
                  for (int32_t bucket_size : {0, 4, 100000})
                    for (int deterministic : {0, 1})
                      for (int64_t slots : {132, 264, 1024}) {
                        sa::BsaBwdProblem p;
                        sa::BsaDims& d = p.dims;
                        d.B = B;
                        d.Hkv = Hkv;
                        d.Hq = Hkv * group;
                        d.Sq = S;
                        d.Skv = S + Skv_extra;
                        d.D = d.Dv = D;
                        d.block = block;
                        d.Nq = (d.Sq + block - 1) / block;
                        d.Nkv = (d.Skv + block - 1) / block;
                        d.Kmax = Kmax;
                        p.options.bucket_size = bucket_size;
                        p.options.deterministic = deterministic;
                        g_slots = slots;
                        // Twice the slots, within the reverse map's 1024 tail items.
                        g_tail = static_cast<int32_t>(std::min<int64_t>(2 * slots, 1024));
                        const bool auto_bucket = !deterministic && bucket_size <= 0;
                        const int64_t want_slots = auto_bucket ? slots : 0;
                        g_slot_calls = 0;
                        expect_same(bsa_bwd::plan(p, portable),
                                    sa::portable::make_bsa_backward_plan(
                                        p, want_slots, deterministic != 0, deterministic == 0));
                        // CTA slots are a device query: asked only for the automatic bucket.
                        EXPECT_EQ(g_slot_calls, auto_bucket ? 1 : 0);
                        expect_same(bsa_bwd::plan(p, hopper),
                                    sa::portable::make_bsa_backward_plan(
                                        p, want_slots, deterministic != 0, deterministic == 0,
                                        g_tail));
                        EXPECT_EQ(bsa_bwd::workspace_bytes(p, hopper),
                                  bsa_bwd::plan(p, hopper).total);
                        ++cases;
                        if (::testing::Test::HasFailure()) return;
                      }
  EXPECT_EQ(cases, 3 * 3 * 3 * 7 * 2 * 2 * 2 * 3 * 3 * 2 * 3);
}

}  // namespace
}  // namespace sa_test
