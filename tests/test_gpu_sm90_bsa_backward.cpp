// The Hopper BSA backward (src/sm90/bsa_backward.cu) against the fp64 reference (SPEC 1).
//
// Same method as test_gpu_bsa_backward.cpp (the portable backward), with options.impl forced to
// SA_IMPL_SM90 (the automatic choice never picks the sm90 backward until it has been validated on
// hardware: GpuSm90BsaBackwardGating checks that). Random inputs and sparsity pattern on the host
// (bsa_problem_builder.hpp), o and lse from the CPU reference forward, device tensors with padded
// rows and a NaN guard region that must come back untouched, dq/dk/dv poisoned with NaN, the
// oracle the reference backward on fp64 copies. Cases: block 64 and 128, D 64 and 128, MHA, GQA,
// MQA, BHSD and BSHD, partial KV blocks (block_len and S_kv; their padded keys hold NaN in K and
// V, which must not take part), S_q not a multiple of the block, empty rows, single owners and
// forced several owners (bucket 1, 2), unattended KV blocks (dk = dv = 0 exactly), rows of many
// query tiles (the Q/dO ring wraps), a negative scale; a CUDA graph replayed with new metadata
// values; deterministic mode refused with its reason.
// Pass: no NaN; rel L2 of dq, dk, dv below 1e-2; exact zeros where nothing attends.
// Tests skip unless the device is sm_90.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "bsa_problem_builder.hpp"
#include "gpu_test_util.hpp"
#include "test_util.hpp"

#if SA_HAVE_SM90

namespace sa_test {
namespace {

// ---- cases -----------------------------------------------------------------------------------
constexpr int32_t kSingleOwner = 1 << 30;  // a bucket no row reaches: one group per row

struct GpuBwdCase {
  std::string name;
  BsaShape shape;
  BsaPatternSpec spec;
  int32_t bucket = 0;  // options.bucket_size: 0 automatic, kSingleOwner, or a split size
  bool deterministic = false;
  float scale = 0.f;   // 0: 1/sqrt(D)
  int64_t pad = 8;     // extra elements per innermost row of the device tensors
  bool nan_padded_keys = true;  // K, V of padded keys inside the tensor := NaN
};

void PrintTo(const GpuBwdCase& c, std::ostream* os) { *os << c.name; }

GpuBwdCase make_case(std::string name, BsaShape shape, BsaPatternSpec spec, int32_t bucket,
                     bool deterministic = false, float scale = 0.f, int64_t pad = 8) {
  GpuBwdCase c;
  c.name = std::move(name);
  c.shape = shape;
  c.spec = spec;
  c.bucket = bucket;
  c.deterministic = deterministic;
  c.scale = scale;
  c.pad = pad;
  return c;
}

constexpr sa_layout kBshd = SA_LAYOUT_BSHD;

const GpuBwdCase kCases[] = {
    // block 128 (two consumer warpgroups of 64 keys, Q tiles of 64 rows: two per query block)
    make_case("Block128D128MhaBhsdSingleOwner", shape_of(1, 2, 2, 256, 384, 128, 128, 3),
              spec_of(true, -1, false, false), kSingleOwner),
    make_case("Block128D128GqaBshdPartialEmptyRowsUnattendedBucket1",
              shape_of(2, 4, 2, 300, 333, 128, 128, 3, kBshd),
              spec_of(true, -1, true, true, true, 1), 1),
    make_case("Block128D128GqaPartialEmptyRowsUnattendedSingleOwner",
              shape_of(2, 4, 2, 300, 333, 128, 128, 3), spec_of(true, -1, true, true, false, 1),
              kSingleOwner),
    make_case("Block128D64MqaFixedCountPartialBucket2", shape_of(1, 3, 1, 200, 300, 64, 128, 2),
              spec_of(false, 2, false, true), 2),
    make_case("Block128D64GqaBshdEmptyRowsAuto", shape_of(2, 4, 2, 257, 256, 64, 128, 2, kBshd),
              spec_of(true, -1, true, false), 0),
    make_case("Block128D128MqaAutoSplitUnattended", shape_of(1, 8, 1, 512, 512, 128, 128, 4),
              spec_of(true, -1, true, true, false, 2), 0),
    // block 64 (one consumer warpgroup, two CTAs per SM)
    make_case("Block64D128GqaBshdPartialEmptyRowsSingleOwner",
              shape_of(1, 4, 2, 130, 200, 128, 64, 3, kBshd), spec_of(true, -1, true, true),
              kSingleOwner),
    make_case("Block64D128MhaBucket1", shape_of(2, 2, 2, 192, 256, 128, 64, 4),
              spec_of(true, -1, false, false), 1),
    make_case("Block64D64MqaPartialLenPerBatchBucket2", shape_of(2, 2, 1, 190, 250, 64, 64, 4),
              spec_of(true, -1, true, true, true), 2),
    make_case("Block64D64GqaBshdFixedCountAuto", shape_of(1, 6, 3, 100, 320, 64, 64, 5, kBshd),
              spec_of(false, -1, false, false), 0),
    make_case("Block64D128MqaAutoSplitUnattended", shape_of(1, 8, 1, 512, 512, 128, 64, 8),
              spec_of(true, -1, true, true, false, 3), 0),
    // contiguous tensors, a negative scale, long reverse rows, every row empty
    make_case("Block128D128Contiguous", shape_of(1, 2, 1, 200, 256, 128, 128, 2),
              spec_of(true, -1, false, true), kSingleOwner, false, 0.f, 0),
    make_case("Block128D128NegativeScaleBucket1", shape_of(1, 2, 2, 200, 256, 128, 128, 2),
              spec_of(true, -1, false, true), 1, false, -0.2f),
    make_case("Block64D64RowOf150Blocks", shape_of(1, 1, 1, 64, 64 * 150, 64, 64, 150),
              spec_of(false, 150, false, true), 0),
    make_case("Block64D64LongReverseRowsSingleOwner", shape_of(1, 16, 1, 1024, 256, 64, 64, 4),
              spec_of(true, -1, true, false), kSingleOwner),
    make_case("Block128D128LongReverseRowsSingleOwner", shape_of(1, 8, 1, 1024, 512, 128, 128, 4),
              spec_of(true, -1, true, true), kSingleOwner),
    make_case("Block128D128CountZero", shape_of(1, 2, 2, 200, 256, 128, 128, 2),
              spec_of(false, 0, false, false), 0),
};

// K and V of every padded key inside the tensor (past kv_block_len, below S_kv) := NaN.
void poison_padded_keys(const BsaShape& s, const BsaPattern& pat, BsaTensors& t) {
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t n = 0; n < s.Nkv(); ++n)
      for (int64_t j = n * s.block + pat.block_len(s, b, n);
           j < std::min<int64_t>((n + 1) * s.block, s.Skv); ++j)
        for (int64_t hk = 0; hk < s.Hkv; ++hk) {
          for (int64_t x = 0; x < s.D; ++x) t.k.set(bsa_index(t.k, s.layout, b, hk, j, x), NAN);
          for (int64_t x = 0; x < s.Dv; ++x) t.v.set(bsa_index(t.v, s.layout, b, hk, j, x), NAN);
        }
}

// ---- one problem: host values, the device copies, a run, the checks --------------------------
struct Problem {
  GpuBwdCase c;
  BsaPattern pat;
  BsaTensors t;  // bf16; o and lse from the CPU reference forward

  explicit Problem(const GpuBwdCase& c_) : c(c_) {
    std::mt19937_64 rng(std::hash<std::string>{}(c.name));
    pat = random_bsa_pattern(c.shape, c.spec, rng);
    t = make_bsa_tensors(c.shape, SA_DTYPE_BF16, rng);
    if (c.nan_padded_keys) poison_padded_keys(c.shape, pat, t);
  }

  sa_bsa_options options() const {
    sa_bsa_options o = sa_bsa_options_default();
    o.scale = c.scale;
    o.layout = c.shape.layout;
    o.block_size = c.shape.block;
    o.count = pat.has_count ? -1 : pat.fixed_count;
    o.bucket_size = c.bucket;
    o.deterministic = c.deterministic ? 1 : 0;
    o.impl = SA_IMPL_SM90;
    return o;
  }

  // o and lse of the current pattern, through the CPU reference (public API).
  ::testing::AssertionResult forward() {
    sa_bsa_fwd_args a{};
    a.q = t.q.view();
    a.k = t.k.view();
    a.v = t.v.view();
    a.o = t.o.view();
    a.lse = t.lse.view();
    a.sparsity = pat.sparsity();
    a.options = options();
    a.options.impl = SA_IMPL_REFERENCE;
    if (sa_bsa_forward(&a, nullptr) != SA_OK)
      return ::testing::AssertionFailure() << "reference forward: " << sa_last_error();
    return ::testing::AssertionSuccess();
  }

  // dq, dk, dv of the current pattern in fp64 (logical BHSD order), through the reference.
  ::testing::AssertionResult reference(std::vector<double>* dq, std::vector<double>* dk,
                                       std::vector<double>* dv) {
    HostTensor q = to_fp64(t.q), k = to_fp64(t.k), v = to_fp64(t.v), o = to_fp64(t.o),
               dout = to_fp64(t.dout);
    HostTensor gq(SA_DTYPE_FP64, t.q.shape()), gk(SA_DTYPE_FP64, t.k.shape()),
        gv(SA_DTYPE_FP64, t.v.shape());
    sa_bsa_bwd_args a{};
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.o = o.view();
    a.lse = t.lse.view();
    a.dout = dout.view();
    a.sparsity = pat.sparsity();
    a.dq = gq.view();
    a.dk = gk.view();
    a.dv = gv.view();
    a.options = options();
    a.options.impl = SA_IMPL_REFERENCE;
    if (sa_bsa_backward(&a, nullptr) != SA_OK)
      return ::testing::AssertionFailure() << "reference backward: " << sa_last_error();
    *dq = bhsd_doubles(gq, c.shape.layout);
    *dk = bhsd_doubles(gk, c.shape.layout);
    *dv = bhsd_doubles(gv, c.shape.layout);
    return ::testing::AssertionSuccess();
  }

  // attended[(b * Hkv + hk) * Skv + j]: some query of the KV head's group attends key j.
  std::vector<uint8_t> attended_keys() const {
    const BsaShape& s = c.shape;
    std::vector<uint8_t> out(static_cast<size_t>(s.B * s.Hkv * s.Skv), 0);
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.Hq; ++h)
        for (int64_t m = 0; m < s.Nq(); ++m)
          for (int32_t slot = 0; slot < pat.count(b, h, m); ++slot) {
            const int64_t n = pat.index(b, h, m, slot);
            for (int64_t j = n * s.block; j < n * s.block + pat.block_len(s, b, n) && j < s.Skv;
                 ++j)
              out[static_cast<size_t>((b * s.Hkv + h / s.group()) * s.Skv + j)] = 1;
          }
    return out;
  }
};

// The device side of a Problem: inputs, metadata and outputs, with the call's arguments.
struct DeviceProblem {
  DeviceTensor q, k, v, o, dout, lse, index, count, block_len, dq, dk, dv;

  explicit DeviceProblem(const Problem& p)
      : q(p.t.q, p.c.pad, 0),
        k(p.t.k, p.c.pad, 0),
        v(p.t.v, p.c.pad, 0),
        o(p.t.o, p.c.pad, 0),
        dout(p.t.dout, p.c.pad, 0),
        lse(p.t.lse, 0, 0),
        index(p.pat.q2k_index, 0, 0),
        count(p.pat.has_count ? p.pat.q2k_count : HostTensor(SA_DTYPE_INT32, {1}), 0, 0),
        block_len(p.pat.has_block_len ? p.pat.kv_block_len : HostTensor(SA_DTYPE_INT32, {1}), 0,
                  0),
        dq(p.t.dq, p.c.pad, 64 * p.c.shape.D),
        dk(p.t.dk, p.c.pad, 64 * p.c.shape.D),
        dv(p.t.dv, p.c.pad, 64 * p.c.shape.Dv) {}

  bool ok() const {
    return q.ok() && k.ok() && v.ok() && o.ok() && dout.ok() && lse.ok() && index.ok() &&
           count.ok() && block_len.ok() && dq.ok() && dk.ok() && dv.ok();
  }

  sa_bsa_bwd_args args(const Problem& p) const {
    sa_bsa_bwd_args a{};
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.o = o.view();
    a.lse = lse.view();
    a.dout = dout.view();
    a.sparsity.q2k_index = index.view();
    a.sparsity.q2k_count = p.pat.has_count ? count.view() : sa_tensor_none();
    a.sparsity.kv_block_len = p.pat.has_block_len ? block_len.view() : sa_tensor_none();
    a.dq = dq.view();
    a.dk = dk.view();
    a.dv = dv.view();
    a.options = p.options();
    return a;
  }

  // New metadata values and forward outputs (same shapes).
  bool upload(const Problem& p) {
    return index.upload(p.pat.q2k_index) && o.upload(p.t.o) && lse.upload(p.t.lse) &&
           (!p.pat.has_count || count.upload(p.pat.q2k_count)) &&
           (!p.pat.has_block_len || block_len.upload(p.pat.kv_block_len));
  }

  bool poison_outputs(cudaStream_t stream) {
    return dq.poison(stream) && dk.poison(stream) && dv.poison(stream);
  }
};

struct Gradients {
  HostTensor dq, dk, dv;
};

::testing::AssertionResult download(const DeviceProblem& d, const Problem& p, Gradients* g) {
  g->dq = HostTensor(SA_DTYPE_BF16, p.t.dq.shape());
  g->dk = HostTensor(SA_DTYPE_BF16, p.t.dk.shape());
  g->dv = HostTensor(SA_DTYPE_BF16, p.t.dv.shape());
  ::testing::AssertionResult r = d.dq.download(g->dq);
  if (!r) return r << " (dq)";
  r = d.dk.download(g->dk);
  if (!r) return r << " (dk)";
  r = d.dv.download(g->dv);
  if (!r) return r << " (dv)";
  return ::testing::AssertionSuccess();
}

// One sa_bsa_backward on the default stream with a queried workspace; the outputs poisoned first.
::testing::AssertionResult run_backward(DeviceProblem& d, const Problem& p, Gradients* g) {
  if (!d.poison_outputs(nullptr)) return ::testing::AssertionFailure() << "poison failed";
  const sa_bsa_bwd_args a = d.args(p);
  size_t bytes = 0;
  if (sa_bsa_backward_workspace_size(&a, &bytes) != SA_OK)
    return ::testing::AssertionFailure() << "workspace size: " << sa_last_error();
  DeviceBuffer workspace(bytes);
  if (!workspace.ok()) return ::testing::AssertionFailure() << "cudaMalloc failed";
  // Garbage in the workspace: the backward must not rely on its contents.
  if (bytes > 0 && cudaMemset(workspace.get(), 0xff, bytes) != cudaSuccess)
    return ::testing::AssertionFailure() << "cudaMemset failed";
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
  if (used != SA_IMPL_SM90)
    return ::testing::AssertionFailure() << "ran " << sa_impl_name(used) << ", not sm90";
  return download(d, p, g);
}

// The checks every run must pass against the reference of the problem's current pattern.
void expect_matches_reference(Problem& p, const Gradients& g) {
  std::vector<double> want_dq, want_dk, want_dv;
  ASSERT_TRUE(p.reference(&want_dq, &want_dk, &want_dv));
  const BsaShape& s = p.c.shape;
  const std::vector<double> dq = bhsd_doubles(g.dq, s.layout);
  const std::vector<double> dk = bhsd_doubles(g.dk, s.layout);
  const std::vector<double> dv = bhsd_doubles(g.dv, s.layout);
  EXPECT_FALSE(any_nan(dq)) << "NaN in dq";
  EXPECT_FALSE(any_nan(dk)) << "NaN in dk";
  EXPECT_FALSE(any_nan(dv)) << "NaN in dv";
  EXPECT_LT(rel_l2(dq, want_dq), 1e-2) << "rel L2 of dq";
  EXPECT_LT(rel_l2(dk, want_dk), 1e-2) << "rel L2 of dk";
  EXPECT_LT(rel_l2(dv, want_dv), 1e-2) << "rel L2 of dv";
  // Keys nobody attends: exactly 0.
  const std::vector<uint8_t> attended = p.attended_keys();
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t hk = 0; hk < s.Hkv; ++hk)
      for (int64_t j = 0; j < s.Skv; ++j) {
        if (attended[static_cast<size_t>((b * s.Hkv + hk) * s.Skv + j)]) continue;
        for (int64_t x = 0; x < s.D; ++x) {
          const size_t i = static_cast<size_t>(((b * s.Hkv + hk) * s.Skv + j) * s.D + x);
          ASSERT_EQ(dk[i], 0.0) << "dk of an unattended key, b=" << b << " hk=" << hk
                                << " j=" << j;
          ASSERT_EQ(dv[i], 0.0) << "dv of an unattended key, b=" << b << " hk=" << hk
                                << " j=" << j;
        }
      }
  // Query rows of blocks that list nothing: dq exactly 0.
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < s.Sq; ++i) {
        if (p.pat.count(b, h, i / s.block) != 0) continue;
        for (int64_t x = 0; x < s.D; ++x)
          ASSERT_EQ(dq[static_cast<size_t>(((b * s.Hq + h) * s.Sq + i) * s.D + x)], 0.0)
              << "dq of an empty row, b=" << b << " h=" << h << " i=" << i;
      }
}

class GpuSm90BsaBackward : public ::testing::TestWithParam<GpuBwdCase> {};

TEST_P(GpuSm90BsaBackward, MatchesReference) {
  SA_SKIP_WITHOUT_GPU();
  SA_SKIP_UNLESS_SM90();
  Problem p(GetParam());
  if (p.c.spec.empty_rows) {
    ASSERT_TRUE(p.pat.has_empty_row(p.c.shape));
  }
  ASSERT_TRUE(p.forward());
  DeviceProblem d(p);
  ASSERT_TRUE(d.ok());
  Gradients g;
  ASSERT_TRUE(run_backward(d, p, &g));
  expect_matches_reference(p, g);
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuSm90BsaBackward, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<GpuBwdCase>& info) {
                           return info.param.name;
                         });

// A CUDA graph captured once on a non-default stream (workspace preallocated) follows new
// metadata values on replay: the whole backward, reverse map included, reads them on the device.
TEST(GpuSm90BsaBackwardGraph, ReplayFollowsNewMetadataValues) {
  SA_SKIP_WITHOUT_GPU();
  SA_SKIP_UNLESS_SM90();
  for (const int32_t bucket : {0, kSingleOwner, 2}) {
    SCOPED_TRACE("bucket " + std::to_string(bucket));
    const BsaShape s = shape_of(1, 4, 2, 384, 512, 128, 128, 3);
    GpuBwdCase gc = make_case("GraphFirst", s, spec_of(true, -1, true, true, false, 1), bucket);
    gc.nan_padded_keys = false;  // replay 2's block lengths make other keys padded
    Problem p(gc);
    ASSERT_TRUE(p.forward());
    DeviceProblem d(p);
    ASSERT_TRUE(d.ok());

    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    const sa_bsa_bwd_args a = d.args(p);
    size_t bytes = 0;
    ASSERT_EQ(sa_bsa_backward_workspace_size(&a, &bytes), SA_OK) << sa_last_error();
    DeviceBuffer workspace(bytes);
    ASSERT_TRUE(workspace.ok());
    sa_context ctx = sa_context_default();
    ctx.stream = stream;
    ctx.workspace = workspace.get();
    ctx.workspace_bytes = bytes;
    // One eager call first (the call works outside a capture too; nothing is cached).
    ASSERT_EQ(sa_bsa_backward(&a, &ctx), SA_OK) << sa_last_error();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const sa_status status = sa_bsa_backward(&a, &ctx);
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    ASSERT_EQ(status, SA_OK) << sa_last_error();
    ASSERT_EQ(end, cudaSuccess) << "capture invalidated: " << cudaGetErrorString(end);
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

    // Replay 1: the captured pattern. Replay 2: new index/count/block-length values (same
    // shapes) and the forward outputs that go with them.
    for (int replay = 0; replay < 2; ++replay) {
      SCOPED_TRACE("replay " + std::to_string(replay));
      if (replay == 1) {
        std::mt19937_64 rng(77);
        p.pat = random_bsa_pattern(s, spec_of(true, -1, true, true, false, 3), rng);
        ASSERT_TRUE(p.forward());
        ASSERT_TRUE(d.upload(p));
      }
      ASSERT_TRUE(d.poison_outputs(stream));
      ASSERT_EQ(cudaMemsetAsync(workspace.get(), 0xff, bytes, stream), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      Gradients g;
      ASSERT_TRUE(download(d, p, &g));
      expect_matches_reference(p, g);
    }
    EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  }
}

// Until validated on hardware the automatic choice never picks the sm90 backward: AUTO runs the
// portable one (on any GPU), and the sm90 entry's reason says how to force it.
TEST(GpuSm90BsaBackwardGating, AutoRunsPortable) {
  SA_SKIP_WITHOUT_GPU();
  Problem p(make_case("GatingAuto", shape_of(1, 2, 1, 200, 256, 64, 64, 2),
                      spec_of(true, -1, false, true), 0));
  ASSERT_TRUE(p.forward());
  DeviceProblem d(p);
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
  EXPECT_EQ(used, SA_IMPL_PORTABLE) << "ran " << sa_impl_name(used);
}

// Deterministic mode is not served by the sm90 backward: forcing it is refused with the reason.
TEST(GpuSm90BsaBackwardSupport, RefusesDeterministicWithReason) {
  SA_SKIP_WITHOUT_GPU();
  SA_SKIP_UNLESS_SM90();
  Problem p(make_case("RefuseDeterministic", shape_of(1, 2, 1, 128, 128, 64, 64, 2),
                      spec_of(false, 1, false, false), 0, true));
  ASSERT_TRUE(p.forward());
  DeviceProblem d(p);
  ASSERT_TRUE(d.ok());
  const sa_bsa_bwd_args a = d.args(p);
  size_t bytes = 0;
  EXPECT_EQ(sa_bsa_backward_workspace_size(&a, &bytes), SA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(sa_last_error()).find("deterministic mode"), std::string::npos)
      << sa_last_error();
}

}  // namespace
}  // namespace sa_test

#endif  // SA_HAVE_SM90
