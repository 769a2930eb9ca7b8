// The Hopper BSA backward (src/sm90/bsa_backward.cu) against the fp64 reference (SPEC 1).
//
// Same method as test_gpu_bsa_backward.cpp (the portable backward), with options.impl forced to
// SA_IMPL_SM90 (GpuSm90BsaBackwardDispatch checks that AUTO picks it on an sm_90 device). Random
// inputs and sparsity pattern on the host
// (bsa_problem_builder.hpp), o and lse from the CPU reference forward, device tensors with padded
// rows and a NaN guard region that must come back untouched, dq/dk/dv poisoned with NaN, the
// oracle the reference backward on fp64 copies. Cases: block 64 and 128, D 64 and 128, MHA, GQA,
// MQA, BHSD and BSHD, partial KV blocks (block_len and S_kv; their padded keys hold NaN in K and
// V, which must not take part), S_q not a multiple of the block, empty rows, single owners and
// forced several owners (bucket 1, 2), unattended KV blocks (dk = dv = 0 exactly), rows of many
// query tiles (the Q/dO ring wraps), a negative scale; a CUDA graph replayed with new metadata
// values; deterministic mode bitwise stable over three runs; the last work items' launch order
// (longest first, or not reordered); the main kernel's tuning variants (Tuning::sm90_bsa_bwd_stats
// and sm90_bsa_bwd_full: the loader warp's stats ring, the full-block path, both) on every case,
// in deterministic mode and in a replayed graph.
// Pass: no NaN; rel L2 of dq, dk, dv below 1e-2; exact zeros where nothing attends.
// Tests skip unless the device is sm_90.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bsa_problem_builder.hpp"
#include "common/tuning.hpp"
#include "gpu_test_util.hpp"
#include "test_util.hpp"

#if SA_HAVE_SM90

namespace sa_test {
namespace {

// ---- cases -----------------------------------------------------------------------------------
// The cases (gpu_bsa_backward_cases), problem, run and checks are shared with the portable
// suite (gpu_test_util.hpp); here options.impl is forced to SA_IMPL_SM90 and the sm90 backward
// must run.
using GpuBwdCase = GpuBsaBwdCase;

// K and V of padded keys inside the tensor := NaN.
GpuBwdCase make_case(std::string name, BsaShape shape, BsaPatternSpec spec, int32_t bucket,
                     bool deterministic = false, float scale = 0.f, int64_t pad = 8) {
  GpuBwdCase c =
      gpu_bsa_bwd_case(std::move(name), shape, spec, bucket, deterministic, scale, pad);
  c.nan_padded_keys = true;
  return c;
}

class GpuSm90BsaBackward : public ::testing::TestWithParam<GpuBwdCase> {};

TEST_P(GpuSm90BsaBackward, MatchesReference) {
  SA_SKIP_WITHOUT_GPU();
  SA_SKIP_UNLESS_SM90();
  expect_bsa_backward_case_matches_reference(GetParam(), SA_IMPL_SM90, SA_IMPL_SM90);
}

// The main kernel's tuning variants (bsa_backward_kernel.cuh kTune bits, selected through the
// internal tuning): the loader warp's stats ring, the full-block path, and both, each on the
// case. The full-block path serves only calls whose KV blocks are all full (no kv_block_len and
// S_kv a multiple of the block: Block128D128MhaBhsdSingleOwner, Block128D64GqaBshdEmptyRowsAuto,
// Block128D128CountZero, Block64D128MhaBucket1, Block64D64GqaBshdFixedCountAuto,
// Block64D64LongReverseRowsSingleOwner); the others run the general kernel under it (the
// stats ring still applies), which must be exact too.
struct Sm90BwdVariant {
  const char* name;
  bool stats, full;
};
constexpr Sm90BwdVariant kSm90BwdVariants[] = {
    {"stats", true, false}, {"full", false, true}, {"stats+full", true, true}};

sa::detail::Tuning variant_tuning(const Sm90BwdVariant& v) {
  sa::detail::Tuning t;
  t.sm90_bsa_bwd_stats = v.stats;
  t.sm90_bsa_bwd_full = v.full;
  return t;
}

TEST_P(GpuSm90BsaBackward, VariantsMatchReference) {
  SA_SKIP_WITHOUT_GPU();
  SA_SKIP_UNLESS_SM90();
  for (const Sm90BwdVariant& v : kSm90BwdVariants) {
    SCOPED_TRACE(std::string("variant ") + v.name);
    const sa::detail::ScopedTuning tune(variant_tuning(v));
    expect_bsa_backward_case_matches_reference(GetParam(), SA_IMPL_SM90, SA_IMPL_SM90);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuSm90BsaBackward,
                         ::testing::ValuesIn(gpu_bsa_backward_cases(SA_IMPL_SM90)),
                         [](const ::testing::TestParamInfo<GpuBwdCase>& info) {
                           return info.param.name;
                         });

// The launch order of the last work items (reverse map step 6; Tuning::sm90_bwd_tail): off and a
// short tail (3 items) are exact too (the suite above runs the default: two waves, i.e. every
// test case's items).
TEST(GpuSm90BsaBackwardTailOrder, MatchesReferenceWhateverTheOrder) {
  SA_SKIP_WITHOUT_GPU();
  SA_SKIP_UNLESS_SM90();
  for (int32_t tail : {0, 3}) {
    sa::detail::Tuning t;
    t.sm90_bwd_tail = tail;
    const sa::detail::ScopedTuning tune(t);
    for (const GpuBwdCase& c : gpu_bsa_backward_cases(SA_IMPL_SM90)) {
      SCOPED_TRACE(c.name + " tail " + std::to_string(tail));
      expect_bsa_backward_case_matches_reference(c, SA_IMPL_SM90, SA_IMPL_SM90);
    }
  }
}

// A CUDA graph captured once on a non-default stream (workspace preallocated) follows new
// metadata values on replay: the whole backward, reverse map included, reads them on the device.
// K and V of padded keys as generated (replay 2's block lengths make other keys padded).
TEST(GpuSm90BsaBackwardGraph, ReplayFollowsNewMetadataValues) {
  SA_SKIP_WITHOUT_GPU();
  SA_SKIP_UNLESS_SM90();
  expect_bsa_backward_graph_replay_follows_new_metadata(SA_IMPL_SM90);
}

// The same with the stats ring and the full-block path asked for (the graph's case has
// kv_block_len, so the general kernel with the loader warp runs): the loader reads the new
// metadata on the device too.
TEST(GpuSm90BsaBackwardGraph, ReplayFollowsNewMetadataValuesWithVariants) {
  SA_SKIP_WITHOUT_GPU();
  SA_SKIP_UNLESS_SM90();
  const sa::detail::ScopedTuning tune(variant_tuning(kSm90BwdVariants[2]));
  expect_bsa_backward_graph_replay_follows_new_metadata(SA_IMPL_SM90);
}

// The same with the capture on a fresh host thread in Global mode: the call's per-thread side
// stream (the reverse map's) is created inside the capture.
TEST(GpuSm90BsaBackwardGraph, CaptureOnAFreshThreadInGlobalMode) {
  SA_SKIP_WITHOUT_GPU();
  SA_SKIP_UNLESS_SM90();
  expect_bsa_backward_graph_replay_follows_new_metadata(SA_IMPL_SM90,
                                                        CaptureOn::kFreshThreadGlobalMode);
}

// The automatic choice: the sm90 backward on an sm_90 device, the portable one on any other GPU.
TEST(GpuSm90BsaBackwardDispatch, AutoPicksSm90OnHopper) {
  SA_SKIP_WITHOUT_GPU();
  GpuBsaBwdProblem p(make_case("GatingAuto", shape_of(1, 2, 1, 200, 256, 64, 64, 2),
                               spec_of(true, -1, false, true), 0),
                     SA_IMPL_SM90);
  ASSERT_TRUE(p.forward());
  GpuBsaBwdDevice d(p);
  ASSERT_TRUE(d.ok());
  sa_bsa_bwd_args a = d.args(p);
  a.options.impl = SA_IMPL_AUTO;
  size_t bytes = 0;
  ASSERT_EQ(sa_bsa_backward_workspace_size(&a, &bytes), SA_OK) << sa_last_error();
  DeviceBuffer workspace(bytes);
  ASSERT_TRUE(workspace.ok());
  sa_impl used = SA_IMPL_AUTO;
  sa_context ctx = sa_context_default();
  ctx.workspace = workspace.get();
  ctx.workspace_bytes = bytes;
  ctx.impl_used = &used;
  ASSERT_EQ(sa_bsa_backward(&a, &ctx), SA_OK) << sa_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const sa_impl want = device_is_sm90() ? SA_IMPL_SM90 : SA_IMPL_PORTABLE;
  EXPECT_EQ(used, want) << "ran " << sa_impl_name(used);
}

// Deterministic mode (one owner per row, dQ from the query-major pass): three runs, the same bytes.
TEST(GpuSm90BsaBackwardDeterministic, BitwiseIdenticalOverThreeRuns) {
  SA_SKIP_WITHOUT_GPU();
  SA_SKIP_UNLESS_SM90();
  expect_bsa_backward_deterministic_bitwise(SA_IMPL_SM90);
}

// The same under each tuning variant (deterministic mode: no dQ accumulator, so no reducer warp;
// the loader warp still runs with the stats variant).
TEST(GpuSm90BsaBackwardDeterministic, VariantsBitwiseIdenticalOverThreeRuns) {
  SA_SKIP_WITHOUT_GPU();
  SA_SKIP_UNLESS_SM90();
  for (const Sm90BwdVariant& v : kSm90BwdVariants) {
    SCOPED_TRACE(std::string("variant ") + v.name);
    const sa::detail::ScopedTuning tune(variant_tuning(v));
    expect_bsa_backward_deterministic_bitwise(SA_IMPL_SM90);
  }
}

}  // namespace
}  // namespace sa_test

#endif  // SA_HAVE_SM90
