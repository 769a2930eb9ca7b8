// The portable BSA backward (src/sm80/bsa_backward.cu) against the fp64 reference (SPEC 1).
//
// Each case builds random inputs and a random sparsity pattern on the host
// (bsa_problem_builder.hpp), runs the forward through the CPU reference (public API) for o and
// lse, copies everything to the device with dq, dk, dv poisoned with NaN, and runs
// sa_bsa_backward on the CUDA tensors (the portable implementation forced: AUTO picks the Hopper
// backward on an sm_90 device), workspace queried and passed in. The oracle is the reference
// backward through the same API on fp64 copies of the same host values. Device tensors have padded rows and a guard region
// after the data, all NaN, which must come back untouched.
// Pass: no NaN; rel L2 of dq, dk, dv below 1e-2; dk = dv = 0 exactly for every key no query
// attends (KV blocks nobody lists, padded keys of partial blocks).
// Also: deterministic mode gives the same bytes on 3 runs; a CUDA graph captured once follows new
// metadata VALUES on replay; an unsupported dtype is refused with its reason.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bsa_problem_builder.hpp"
#include "gpu_test_util.hpp"
#include "test_util.hpp"

namespace sa_test {
namespace {

// ---- cases -----------------------------------------------------------------------------------
// The cases (gpu_bsa_backward_cases), problem, run and checks are shared with the sm90 suite
// (gpu_test_util.hpp); here the portable backward is forced and must run.
using GpuBwdCase = GpuBsaBwdCase;

class GpuBsaBackward : public ::testing::TestWithParam<GpuBwdCase> {};

TEST_P(GpuBsaBackward, MatchesReference) {
  SA_SKIP_WITHOUT_GPU();
  expect_bsa_backward_case_matches_reference(GetParam(), SA_IMPL_PORTABLE, SA_IMPL_PORTABLE);
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuBsaBackward,
                         ::testing::ValuesIn(gpu_bsa_backward_cases(SA_IMPL_PORTABLE)),
                         [](const ::testing::TestParamInfo<GpuBwdCase>& info) {
                           return info.param.name;
                         });

// Deterministic mode: three runs, the same bytes (and a match with the reference).
TEST(GpuBsaBackwardDeterministic, BitwiseIdenticalOverThreeRuns) {
  SA_SKIP_WITHOUT_GPU();
  expect_bsa_backward_deterministic_bitwise(SA_IMPL_PORTABLE);
}

// A CUDA graph captured once on a non-default stream (workspace preallocated) follows new
// metadata values on replay: the whole backward, reverse map included, reads them on the device.
TEST(GpuBsaBackwardGraph, ReplayFollowsNewMetadataValues) {
  SA_SKIP_WITHOUT_GPU();
  expect_bsa_backward_graph_replay_follows_new_metadata(SA_IMPL_AUTO);
}

// A dtype the portable backward does not serve is refused with its reason, not run.
TEST(GpuBsaBackwardSupport, RefusesFp16WithReason) {
  SA_SKIP_WITHOUT_GPU();
  const BsaShape s = shape_of(1, 1, 1, 64, 64, 64, 64, 1);
  std::mt19937_64 rng(7);
  BsaPattern pat = random_bsa_pattern(s, spec_of(false, 1, false, false), rng);
  BsaTensors t = make_bsa_tensors(s, SA_DTYPE_FP16, rng);
  t.o.fill(0.5);
  t.lse.fill(1.0);
  DeviceTensor q(t.q, 0, 0), k(t.k, 0, 0), v(t.v, 0, 0), o(t.o, 0, 0), lse(t.lse, 0, 0),
      dout(t.dout, 0, 0), dq(t.dq, 0, 0), dk(t.dk, 0, 0), dv(t.dv, 0, 0),
      index(pat.q2k_index, 0, 0);
  sa_bsa_bwd_args a = sa_bsa_bwd_args_default();
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
  a.sparsity.q2k_count = sa_tensor_none();
  a.sparsity.kv_block_len = sa_tensor_none();
  a.options = sa_bsa_options_default();
  a.options.block_size = 64;
  a.options.impl = SA_IMPL_PORTABLE;
  EXPECT_EQ(sa_bsa_backward(&a, nullptr), SA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(sa_last_error()).find("portable backward supports bf16"),
            std::string::npos)
      << sa_last_error();
}

}  // namespace
}  // namespace sa_test
