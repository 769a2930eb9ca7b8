// Helpers shared by the GPU test files: skipping by device, device memory owned by a test, device
// copies of host tensors with padded rows and NaN guard regions (which must come back untouched),
// fp64 copies for the reference oracle, the shape / pattern builders of the case tables, and the
// run-and-compare steps several suites share. Header-only; everything goes through the public API
// except what the test files call on the implementations themselves.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bsa_mask_oracle.hpp"
#include "bsa_problem_builder.hpp"
#include "common/tuning.hpp"
#include "dsa_problem_builder.hpp"
#include "test_util.hpp"

namespace sa_test {

// ---- skipping ----------------------------------------------------------------------------------
inline bool device_is_sm90() {
  static const bool yes = [] {
    if (!cuda_available()) return false;
    cudaDeviceProp prop{};
    return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9 && prop.minor == 0;
  }();
  return yes;
}

// True when the current device lets a kernel opt in to at least `bytes` of shared memory per block.
inline bool device_smem_optin_at_least(int bytes) {
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    return false;
  return optin >= bytes;
}

// ---- device memory ---------------------------------------------------------------------------
// `bytes` of device memory (uninitialised), or a device copy of a host tensor's bytes.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_ != 0) ok_ = cudaMalloc(&ptr_, bytes_) == cudaSuccess;
  }
  explicit DeviceBuffer(const HostTensor& t) : DeviceBuffer(t.bytes().size()) {
    if (ok_ && bytes_ != 0)
      ok_ = cudaMemcpy(ptr_, t.data(), bytes_, cudaMemcpyHostToDevice) == cudaSuccess;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  bool ok() const { return ok_; }
  // Copies the whole buffer into `t`, which must hold exactly as many bytes.
  bool download(HostTensor& t) const {
    return t.bytes().size() == bytes_ &&
           cudaMemcpy(t.data(), ptr_, bytes_, cudaMemcpyDeviceToHost) == cudaSuccess;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  bool ok_ = true;
};

// A device copy of a host tensor whose innermost rows are `pad` elements wider than the tensor
// (pad a multiple of 8 keeps the strides legal) and which is followed by `guard` elements.
// Floating tensors: padding and guard hold NaN; int32: zeros.
class DeviceTensor {
 public:
  DeviceTensor(const HostTensor& t, int64_t pad, int64_t guard)
      : dtype_(t.dtype()), shape_(t.shape()), pad_(pad), guard_(guard) {
    const int64_t X = shape_.back();
    rows_ = t.numel() / X;
    buffer_ = std::make_unique<DeviceBuffer>(
        static_cast<size_t>((rows_ * (X + pad_) + guard_) * sa::dtype_size(dtype_)));
    ok_ = buffer_->ok() && upload(t);
    view_ = sa_tensor_contiguous(buffer_->get(), dtype_, static_cast<int32_t>(shape_.size()),
                                 shape_.data(), SA_DEVICE_CUDA, 0);
    int64_t stride = 1;
    for (int i = static_cast<int>(shape_.size()) - 1; i >= 0; --i) {
      view_.strides[i] = stride;
      stride *= (i == static_cast<int>(shape_.size()) - 1) ? X + pad_ : shape_[i];
    }
  }
  bool ok() const { return ok_; }
  const sa_tensor& view() const { return view_; }

  // New values (same shape), padding and guard NaN again (zeros for int32).
  bool upload(const HostTensor& t) {
    const int64_t es = sa::dtype_size(dtype_);
    const int64_t X = shape_.back();
    HostTensor phys(dtype_, {rows_ * (X + pad_) + guard_});
    if (dtype_ != SA_DTYPE_INT32) phys.poison();
    for (int64_t r = 0; r < rows_; ++r)
      std::memcpy(static_cast<uint8_t*>(phys.data()) + r * (X + pad_) * es,
                  static_cast<const uint8_t*>(t.data()) + r * X * es,
                  static_cast<size_t>(X * es));
    return cudaMemcpy(buffer_->get(), phys.data(), phys.bytes().size(),
                      cudaMemcpyHostToDevice) == cudaSuccess;
  }
  // Every byte 0xff: NaN in bf16/fp16/fp32 (outputs before a run).
  bool poison(cudaStream_t stream = nullptr) {
    return cudaMemsetAsync(buffer_->get(), 0xff, buffer_->bytes(), stream) == cudaSuccess;
  }

  // Copies the tensor back into `t` (same shape and dtype). Fails when the copy fails or when
  // some element of the padding or guard is no longer NaN (something wrote outside the tensor).
  ::testing::AssertionResult download(HostTensor& t) const {
    const int64_t es = sa::dtype_size(dtype_);
    const int64_t X = shape_.back();
    HostTensor phys(dtype_, {rows_ * (X + pad_) + guard_});
    if (cudaMemcpy(phys.data(), buffer_->get(), phys.bytes().size(), cudaMemcpyDeviceToHost) !=
        cudaSuccess)
      return ::testing::AssertionFailure() << "cudaMemcpy failed";
    for (int64_t r = 0; r < rows_; ++r)
      std::memcpy(static_cast<uint8_t*>(t.data()) + r * X * es,
                  static_cast<const uint8_t*>(phys.data()) + r * (X + pad_) * es,
                  static_cast<size_t>(X * es));
    for (int64_t i = 0; i < phys.numel(); ++i) {
      const bool outside = i >= rows_ * (X + pad_) || i % (X + pad_) >= X;
      if (outside && !std::isnan(phys.get(i)))
        return ::testing::AssertionFailure()
               << "element " << i << " outside the tensor was written (" << phys.get(i) << ")";
    }
    return ::testing::AssertionSuccess();
  }

 private:
  sa_dtype dtype_;
  std::vector<int64_t> shape_;
  int64_t pad_, guard_, rows_ = 0;
  std::unique_ptr<DeviceBuffer> buffer_;
  sa_tensor view_{};
  bool ok_ = false;
};

// A contiguous view of `data` (host or device memory).
inline sa_tensor view_of(void* data, sa_dtype dtype, std::vector<int64_t> shape,
                         sa_device_type device) {
  return sa_tensor_contiguous(data, dtype, static_cast<int32_t>(shape.size()), shape.data(), device,
                              0);
}

// The same values in fp64 (the reference oracle's inputs).
inline HostTensor to_fp64(const HostTensor& t) {
  HostTensor r(SA_DTYPE_FP64, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) r.set(i, t.get(i));
  return r;
}

inline double norm(const std::vector<double>& v) {
  double n = 0.0;
  for (double x : v) n += x * x;
  return std::sqrt(n);
}

// ---- BSA cases -------------------------------------------------------------------------------
inline BsaShape shape_of(int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Skv, int64_t D,
                         int32_t block, int64_t Kmax, sa_layout layout = SA_LAYOUT_BHSD) {
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

// per_row: q2k_count given; fixed: the count of every row otherwise (-1: K_max); empty: some rows
// list no block; len / len_per_batch: kv_block_len [N_kv] / [B, N_kv] with partial blocks;
// unattended: a KV block no row lists (-1: none forced).
inline BsaPatternSpec spec_of(bool per_row, int32_t fixed, bool empty, bool len,
                              bool len_per_batch = false, int64_t unattended = -1) {
  BsaPatternSpec s;
  s.per_row_count = per_row;
  s.fixed_count = fixed;
  s.empty_rows = empty;
  s.kv_block_len = len;
  s.kv_block_len_per_batch = len_per_batch;
  s.unattended_block = unattended;
  return s;
}

// ---- BSA forward: arguments over device tensors ------------------------------------------------
// The tensors of sa_bsa_forward; the sparsity from `index` and, where given, `count` and
// `block_len` (null: absent). The options are left to the caller.
inline sa_bsa_fwd_args bsa_fwd_args(const DeviceTensor& q, const DeviceTensor& k,
                                    const DeviceTensor& v, const DeviceTensor& o,
                                    const DeviceTensor& lse, const DeviceTensor& index,
                                    const DeviceTensor* count = nullptr,
                                    const DeviceTensor* block_len = nullptr) {
  sa_bsa_fwd_args args = sa_bsa_fwd_args_default();
  args.q = q.view();
  args.k = k.view();
  args.v = v.view();
  args.o = o.view();
  args.lse = lse.view();
  args.sparsity.q2k_index = index.view();
  args.sparsity.q2k_count = count != nullptr ? count->view() : sa_tensor_none();
  args.sparsity.kv_block_len = block_len != nullptr ? block_len->view() : sa_tensor_none();
  return args;
}

// ---- BSA forward: one device run against the fp64 reference -----------------------------------
// sa_bsa_forward with `options` (options.impl: the implementation that must run) on device copies
// of t.q, t.k, t.v, t.o (rows `pad` elements wider) and t.lse, o and lse poisoned with NaN and
// followed by guard regions, with the pattern's metadata on the device. The oracle is the reference
// run through the same public API on fp64 copies of the same host values.
// Pass: padding and guards untouched; no NaN in o; rel L2 of o below `tol`; exactly 0 in the rows
// without keys; lse within 1e-4 and -inf exactly where the reference has it. `workspace_given`
// false: the call gets no workspace (where it is optional: the Hopper masked and packed kernels'
// tile counter, whose absence means the static tile order).
inline void expect_bsa_forward_matches_reference(const BsaShape& s, BsaPattern& pat,
                                                 const BsaTensors& t,
                                                 const sa_bsa_options& options, int64_t pad,
                                                 double tol, bool workspace_given = true) {
  // ---- GPU: CUDA tensors, o and lse poisoned, the implementation of options.impl ----
  const int64_t guard = 64 * s.Dv;
  DeviceTensor q(t.q, pad, 0), k(t.k, pad, 0), v(t.v, pad, 0), o(t.o, pad, guard);
  DeviceTensor lse(t.lse, 0, 64);
  DeviceTensor index(pat.q2k_index, 0, 0);
  HostTensor none_host(SA_DTYPE_INT32, {1});
  DeviceTensor count(pat.has_count ? pat.q2k_count : none_host, 0, 0);
  DeviceTensor block_len(pat.has_block_len ? pat.kv_block_len : none_host, 0, 0);
  ASSERT_TRUE(q.ok() && k.ok() && v.ok() && o.ok() && lse.ok() && index.ok() && count.ok() &&
              block_len.ok());

  sa_bsa_fwd_args args = bsa_fwd_args(q, k, v, o, lse, index, pat.has_count ? &count : nullptr,
                                      pat.has_block_len ? &block_len : nullptr);
  args.options = options;
  sa_impl used = SA_IMPL_AUTO;
  sa_context ctx = sa_context_default();
  ctx.impl_used = &used;
  // The workspace the call asks for (split-KV mode, the tile counter), filled with garbage first.
  size_t ws_bytes = 0;
  ASSERT_EQ(sa_bsa_forward_workspace_size(&args, &ws_bytes), SA_OK) << sa_last_error();
  if (!workspace_given) ws_bytes = 0;
  DeviceBuffer workspace(ws_bytes);
  ASSERT_TRUE(workspace.ok());
  if (ws_bytes > 0) {
    ASSERT_EQ(cudaMemset(workspace.get(), 0xff, ws_bytes), cudaSuccess);
  }
  ctx.workspace = workspace.get();
  ctx.workspace_bytes = ws_bytes;
  ASSERT_EQ(sa_bsa_forward(&args, &ctx), SA_OK) << sa_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(used, options.impl);
  HostTensor o_gpu(t.o.dtype(), t.o.shape()), lse_gpu(SA_DTYPE_FP32, t.lse.shape());
  ASSERT_TRUE(o.download(o_gpu)) << "o";
  ASSERT_TRUE(lse.download(lse_gpu)) << "lse";

  // ---- oracle: the fp64 reference through the same API on fp64 copies ----
  HostTensor q64 = to_fp64(t.q), k64 = to_fp64(t.k), v64 = to_fp64(t.v);
  HostTensor o_ref(SA_DTYPE_FP64, t.o.shape()), lse_ref(SA_DTYPE_FP32, t.lse.shape());
  sa_bsa_fwd_args ref = args;
  ref.q = q64.view();
  ref.k = k64.view();
  ref.v = v64.view();
  ref.o = o_ref.view();
  ref.lse = lse_ref.view();
  ref.sparsity = pat.sparsity();
  ref.options.impl = SA_IMPL_REFERENCE;
  ASSERT_EQ(sa_bsa_forward(&ref, nullptr), SA_OK) << sa_last_error();

  const std::vector<double> got = bhsd_doubles(o_gpu, s.layout);
  const std::vector<double> want = bhsd_doubles(o_ref, s.layout);
  EXPECT_FALSE(any_nan(got)) << "NaN in o";
  EXPECT_LT(rel_l2(got, want), tol) << "rel L2 of o";
  // Rows without keys (no block, or a token mask that hides every key: the reference's LSE is
  // -inf): exactly 0.
  const std::vector<double> lse_want = lse_ref.to_double();
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < s.Sq; ++i) {
        const bool no_key = pat.count(b, h, i / s.block) == 0 ||
                            lse_want[static_cast<size_t>((b * s.Hq + h) * s.Sq + i)] == -INFINITY;
        if (!no_key) continue;
        for (int64_t x = 0; x < s.Dv; ++x)
          ASSERT_EQ(got[static_cast<size_t>(((b * s.Hq + h) * s.Sq + i) * s.Dv + x)], 0.0)
              << "o of an empty row, b=" << b << " h=" << h << " i=" << i;
      }
  // LSE: within 1e-4, -inf exactly where the reference has it, no NaN.
  EXPECT_TRUE(all_close(lse_gpu.to_double(), lse_ref.to_double(), 1e-4, 0.0)) << "lse";
}

// ---- BSA forward: the Hopper masked and packed kernels' tile order ---------------------------
// sa_bsa_forward(args) on `stream` with Tuning::sm90_fwd_dyn = `tiles` (0 the rule, 1 static, 2
// dynamic), given the queried workspace filled with garbage (the call must zero its counter) or,
// with `workspace_given` false, none. Waits for the stream.
inline ::testing::AssertionResult run_bsa_forward_tiles(const sa_bsa_fwd_args& args, int32_t tiles,
                                                        bool workspace_given,
                                                        cudaStream_t stream = nullptr) {
  sa::detail::Tuning t;
  t.sm90_fwd_dyn = tiles;
  const sa::detail::ScopedTuning tune(t);
  size_t bytes = 0;
  if (sa_bsa_forward_workspace_size(&args, &bytes) != SA_OK)
    return ::testing::AssertionFailure() << "workspace size: " << sa_last_error();
  DeviceBuffer workspace(workspace_given ? bytes : 0);
  if (!workspace.ok()) return ::testing::AssertionFailure() << "cudaMalloc failed";
  if (workspace.bytes() > 0 && cudaMemset(workspace.get(), 0xff, workspace.bytes()) != cudaSuccess)
    return ::testing::AssertionFailure() << "workspace memset failed";
  sa_context ctx = sa_context_default();
  ctx.stream = stream;
  ctx.workspace = workspace.get();
  ctx.workspace_bytes = workspace.bytes();
  if (sa_bsa_forward(&args, &ctx) != SA_OK)
    return ::testing::AssertionFailure() << "sa_bsa_forward: " << sa_last_error();
  const cudaError_t err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess)
    return ::testing::AssertionFailure() << "kernel failed: " << cudaGetErrorString(err);
  return ::testing::AssertionSuccess();
}

// sa_bsa_forward(args) captured once in a CUDA graph on a non-blocking stream, with
// Tuning::sm90_fwd_dyn = `tiles` and the queried workspace, then replayed `replays` times. Before
// each replay the workspace is filled with garbage (0xff: a tile counter left so would end every
// CTA after its first tile, so the results depend on the captured memset that zeroes it) and
// `poison(stream)` runs; after each, `check(replay)`.
inline void replay_bsa_forward_graph(const sa_bsa_fwd_args& args, int32_t tiles, int replays,
                                     const std::function<bool(cudaStream_t)>& poison,
                                     const std::function<void(int)>& check) {
  sa::detail::Tuning t;
  t.sm90_fwd_dyn = tiles;
  size_t bytes = 0;
  {
    const sa::detail::ScopedTuning tune(t);
    ASSERT_EQ(sa_bsa_forward_workspace_size(&args, &bytes), SA_OK) << sa_last_error();
  }
  DeviceBuffer workspace(bytes);
  ASSERT_TRUE(workspace.ok());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  sa_context ctx = sa_context_default();
  ctx.stream = stream;
  ctx.workspace = workspace.get();
  ctx.workspace_bytes = bytes;
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  sa_status status = SA_OK;
  {
    const sa::detail::ScopedTuning tune(t);
    status = sa_bsa_forward(&args, &ctx);
  }
  const std::string error = status == SA_OK ? "" : sa_last_error();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(status, SA_OK) << error;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < replays; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    if (bytes > 0) {
      ASSERT_EQ(cudaMemsetAsync(workspace.get(), 0xff, bytes, stream), cudaSuccess);
    }
    ASSERT_TRUE(poison(stream));
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    check(replay);
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// ---- BSA backward: cases, one problem, a run, the checks -------------------------------------
// The portable and sm90 backward suites share these; each passes the implementation it requests
// (options.impl) and the one that must run.
constexpr int32_t kBsaBwdSingleOwner = 1 << 30;  // a bucket no row reaches: one group per row

struct GpuBsaBwdCase {
  std::string name;
  BsaShape shape;
  BsaPatternSpec spec;
  int32_t bucket = 0;  // options.bucket_size: 0 automatic, kBsaBwdSingleOwner, or a split size
  bool deterministic = false;
  float scale = 0.f;   // 0: 1/sqrt(D)
  int64_t pad = 8;     // extra elements per innermost row of the device tensors
  bool nan_padded_keys = false;  // K, V of padded keys inside the tensor := NaN
  MaskSpec mask;       // the token mask (options.mask and its parameters); none by default
};

inline void PrintTo(const GpuBsaBwdCase& c, std::ostream* os) { *os << c.name; }

inline GpuBsaBwdCase gpu_bsa_bwd_case(std::string name, BsaShape shape, BsaPatternSpec spec,
                                      int32_t bucket, bool deterministic = false,
                                      float scale = 0.f, int64_t pad = 8) {
  GpuBsaBwdCase c;
  c.name = std::move(name);
  c.shape = shape;
  c.spec = spec;
  c.bucket = bucket;
  c.deterministic = deterministic;
  c.scale = scale;
  c.pad = pad;
  return c;
}

// The cases of the backward suite of `impl`, in that suite's order: SA_IMPL_PORTABLE (options.impl
// forced) or SA_IMPL_SM90 (forced; K and V of padded keys := NaN).
inline std::vector<GpuBsaBwdCase> gpu_bsa_backward_cases(sa_impl impl) {
  constexpr sa_layout kBshd = SA_LAYOUT_BSHD;
  constexpr int32_t kSingleOwner = kBsaBwdSingleOwner;
  constexpr unsigned kPortable = 1, kSm90 = 2, kBoth = kPortable | kSm90;  // the suites of a case
  const auto make = [](auto&&... a) { return gpu_bsa_bwd_case(a...); };
  struct Tagged {
    unsigned suites;
    GpuBsaBwdCase c;
  };
  const Tagged all[] = {
      // block 128 (portable: 8-warp CTAs of 128 keys; sm90: two consumer warpgroups of 64 keys,
      // Q tiles of 64 rows: two per query block)
      {kBoth, make("Block128D128MhaBhsdSingleOwner", shape_of(1, 2, 2, 256, 384, 128, 128, 3),
                   spec_of(true, -1, false, false), kSingleOwner)},
      {kBoth, make("Block128D128GqaBshdPartialEmptyRowsUnattendedBucket1",
                   shape_of(2, 4, 2, 300, 333, 128, 128, 3, kBshd),
                   spec_of(true, -1, true, true, true, 1), 1)},
      {kBoth, make("Block128D128GqaPartialEmptyRowsUnattendedSingleOwner",
                   shape_of(2, 4, 2, 300, 333, 128, 128, 3),
                   spec_of(true, -1, true, true, false, 1), kSingleOwner)},
      {kBoth, make("Block128D64MqaFixedCountPartialBucket2",
                   shape_of(1, 3, 1, 200, 300, 64, 128, 2), spec_of(false, 2, false, true), 2)},
      {kBoth, make("Block128D64GqaBshdEmptyRowsAuto",
                   shape_of(2, 4, 2, 257, 256, 64, 128, 2, kBshd), spec_of(true, -1, true, false),
                   0)},
      {kPortable, make("Block128D128MqaAutoSplit", shape_of(1, 8, 1, 512, 512, 128, 128, 4),
                       spec_of(true, -1, true, true, false, 2), 0)},
      {kSm90, make("Block128D128MqaAutoSplitUnattended", shape_of(1, 8, 1, 512, 512, 128, 128, 4),
                   spec_of(true, -1, true, true, false, 2), 0)},
      // block 64 (portable: 4-warp CTAs of 64 keys; sm90: one consumer warpgroup, two CTAs per SM)
      {kBoth, make("Block64D128GqaBshdPartialEmptyRowsSingleOwner",
                   shape_of(1, 4, 2, 130, 200, 128, 64, 3, kBshd), spec_of(true, -1, true, true),
                   kSingleOwner)},
      {kBoth, make("Block64D128MhaBucket1", shape_of(2, 2, 2, 192, 256, 128, 64, 4),
                   spec_of(true, -1, false, false), 1)},
      {kBoth, make("Block64D64MqaPartialLenPerBatchBucket2", shape_of(2, 2, 1, 190, 250, 64, 64, 4),
                   spec_of(true, -1, true, true, true), 2)},
      {kBoth, make("Block64D64GqaBshdFixedCountAuto", shape_of(1, 6, 3, 100, 320, 64, 64, 5, kBshd),
                   spec_of(false, -1, false, false), 0)},
      {kBoth, make("Block64D128MqaAutoSplitUnattended", shape_of(1, 8, 1, 512, 512, 128, 64, 8),
                   spec_of(true, -1, true, true, false, 3), 0)},
      // contiguous tensors, a negative scale, long reverse rows, every row empty
      {kBoth, make("Block128D128Contiguous", shape_of(1, 2, 1, 200, 256, 128, 128, 2),
                   spec_of(true, -1, false, true), kSingleOwner, false, 0.f, 0)},
      {kBoth, make("Block128D128NegativeScaleBucket1", shape_of(1, 2, 2, 200, 256, 128, 128, 2),
                   spec_of(true, -1, false, true), 1, false, -0.2f)},
      {kBoth, make("Block64D64RowOf150Blocks", shape_of(1, 1, 1, 64, 64 * 150, 64, 64, 150),
                   spec_of(false, 150, false, true), 0)},
      {kPortable, make("Block64D64LongReverseRows", shape_of(1, 16, 1, 1024, 256, 64, 64, 4),
                       spec_of(true, -1, true, false), kSingleOwner)},
      {kSm90, make("Block64D64LongReverseRowsSingleOwner", shape_of(1, 16, 1, 1024, 256, 64, 64, 4),
                   spec_of(true, -1, true, false), kSingleOwner)},
      {kSm90, make("Block128D128LongReverseRowsSingleOwner",
                   shape_of(1, 8, 1, 1024, 512, 128, 128, 4), spec_of(true, -1, true, true),
                   kSingleOwner)},
      {kBoth, make("Block128D128CountZero", shape_of(1, 2, 2, 200, 256, 128, 128, 2),
                   spec_of(false, 0, false, false), 0)},
      // deterministic mode (one owner per row whatever the bucket, query-major dQ)
      {kBoth, make("Block128D128GqaPartialEmptyRowsDeterministic",
                   shape_of(2, 4, 2, 300, 333, 128, 128, 3, kBshd),
                   spec_of(true, -1, true, true), 1, true)},
      {kBoth, make("Block64D64MqaDeterministic", shape_of(1, 4, 1, 190, 250, 64, 64, 4),
                   spec_of(true, -1, true, true, false, 1), 0, true)},
      {kBoth, make("Block64D128MhaDeterministic", shape_of(1, 2, 2, 130, 260, 128, 64, 3),
                   spec_of(true, -1, false, true), 2, true)},
      {kBoth, make("Block128D64MqaDeterministic", shape_of(1, 3, 1, 200, 300, 64, 128, 2),
                   spec_of(false, 2, false, true), 0, true)},
  };
  const unsigned suite = impl == SA_IMPL_SM90 ? kSm90 : kPortable;
  std::vector<GpuBsaBwdCase> cases;
  for (const Tagged& t : all) {
    if ((t.suites & suite) == 0) continue;
    cases.push_back(t.c);
    cases.back().nan_padded_keys = impl == SA_IMPL_SM90;
  }
  return cases;
}

// K and V of every padded key inside the tensor (past kv_block_len, below S_kv) := NaN.
inline void poison_bsa_padded_keys(const BsaShape& s, const BsaPattern& pat, BsaTensors& t) {
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t n = 0; n < s.Nkv(); ++n)
      for (int64_t j = n * s.block + pat.block_len(s, b, n);
           j < std::min<int64_t>((n + 1) * s.block, s.Skv); ++j)
        for (int64_t hk = 0; hk < s.Hkv; ++hk) {
          for (int64_t x = 0; x < s.D; ++x) t.k.set(bsa_index(t.k, s.layout, b, hk, j, x), NAN);
          for (int64_t x = 0; x < s.Dv; ++x) t.v.set(bsa_index(t.v, s.layout, b, hk, j, x), NAN);
        }
}

// One problem: host values, options with options.impl = `impl` (the implementation requested).
struct GpuBsaBwdProblem {
  GpuBsaBwdCase c;
  sa_impl impl;
  BsaPattern pat;
  BsaTensors t;  // bf16; o and lse from the CPU reference forward

  GpuBsaBwdProblem(const GpuBsaBwdCase& c_, sa_impl impl_) : c(c_), impl(impl_) {
    std::mt19937_64 rng(std::hash<std::string>{}(c.name));
    pat = random_bsa_pattern(c.shape, c.spec, rng);
    t = make_bsa_tensors(c.shape, SA_DTYPE_BF16, rng);
    if (c.nan_padded_keys) poison_bsa_padded_keys(c.shape, pat, t);
  }

  sa_bsa_options options() const {
    sa_bsa_options o = sa_bsa_options_default();
    o.scale = c.scale;
    o.layout = c.shape.layout;
    o.block_size = c.shape.block;
    o.count = pat.has_count ? -1 : pat.fixed_count;
    o.bucket_size = c.bucket;
    o.deterministic = c.deterministic ? 1 : 0;
    o.impl = impl;
    c.mask.apply(o);
    return o;
  }

  // o and lse of the current pattern, through the CPU reference (public API).
  ::testing::AssertionResult forward() {
    sa_bsa_fwd_args a = sa_bsa_fwd_args_default();
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
    sa_bsa_bwd_args a = sa_bsa_bwd_args_default();
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

  // attended[(b * Hkv + hk) * Skv + j]: some query of the KV head's group attends key j (the
  // block lists and the token mask).
  std::vector<uint8_t> attended_keys() const {
    const BsaShape& s = c.shape;
    std::vector<uint8_t> out(static_cast<size_t>(s.B * s.Hkv * s.Skv), 0);
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.Hq; ++h)
        for (int64_t m = 0; m < s.Nq(); ++m)
          for (int32_t slot = 0; slot < pat.count(b, h, m); ++slot) {
            const int64_t n = pat.index(b, h, m, slot);
            for (int64_t j = n * s.block; j < n * s.block + pat.block_len(s, b, n) && j < s.Skv;
                 ++j) {
              bool seen = c.mask.kind == SA_MASK_NONE;
              for (int64_t i = m * s.block; !seen && i < std::min((m + 1) * s.block, s.Sq); ++i)
                seen = c.mask.visible(i, j, s.Sq, s.Skv);
              if (seen) out[static_cast<size_t>((b * s.Hkv + h / s.group()) * s.Skv + j)] = 1;
            }
          }
    return out;
  }

  // Does query row i of (b, h) see some key (the block lists and the token mask)?
  bool row_sees_a_key(int64_t b, int64_t h, int64_t i) const {
    const BsaShape& s = c.shape;
    const int64_t m = i / s.block;
    for (int32_t slot = 0; slot < pat.count(b, h, m); ++slot) {
      const int64_t n = pat.index(b, h, m, slot);
      for (int64_t j = n * s.block; j < n * s.block + pat.block_len(s, b, n) && j < s.Skv; ++j)
        if (c.mask.visible(i, j, s.Sq, s.Skv)) return true;
    }
    return false;
  }
};

// The device side of a GpuBsaBwdProblem: inputs, metadata and outputs, with the call's arguments.
struct GpuBsaBwdDevice {
  DeviceTensor q, k, v, o, dout, lse, index, count, block_len, dq, dk, dv;

  explicit GpuBsaBwdDevice(const GpuBsaBwdProblem& p)
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

  sa_bsa_bwd_args args(const GpuBsaBwdProblem& p) const {
    sa_bsa_bwd_args a = sa_bsa_bwd_args_default();
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
  bool upload(const GpuBsaBwdProblem& p) {
    return index.upload(p.pat.q2k_index) && o.upload(p.t.o) && lse.upload(p.t.lse) &&
           (!p.pat.has_count || count.upload(p.pat.q2k_count)) &&
           (!p.pat.has_block_len || block_len.upload(p.pat.kv_block_len));
  }

  bool poison_outputs(cudaStream_t stream) {
    return dq.poison(stream) && dk.poison(stream) && dv.poison(stream);
  }
};

struct GpuBsaBwdGradients {
  HostTensor dq, dk, dv;
};

inline ::testing::AssertionResult download_bsa_gradients(const GpuBsaBwdDevice& d,
                                                         const GpuBsaBwdProblem& p,
                                                         GpuBsaBwdGradients* g) {
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
// `expect_used`: the implementation that must have run.
inline ::testing::AssertionResult run_bsa_backward(GpuBsaBwdDevice& d, const GpuBsaBwdProblem& p,
                                                   sa_impl expect_used, GpuBsaBwdGradients* g) {
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
  if (used != expect_used)
    return ::testing::AssertionFailure()
           << "ran " << sa_impl_name(used) << ", not " << sa_impl_name(expect_used);
  return download_bsa_gradients(d, p, g);
}

// The checks every run must pass against the reference of the problem's current pattern.
// Pass: no NaN; rel L2 of dq, dk, dv below 1e-2; dk = dv = 0 exactly for every key no query
// attends; dq = 0 exactly in the query rows of blocks that list nothing.
inline void expect_bsa_backward_matches_reference(GpuBsaBwdProblem& p,
                                                  const GpuBsaBwdGradients& g) {
  std::vector<double> want_dq, want_dk, want_dv;
  ASSERT_TRUE(p.reference(&want_dq, &want_dk, &want_dv));
  const BsaShape& s = p.c.shape;
  const std::vector<double> dq = bhsd_doubles(g.dq, s.layout);
  const std::vector<double> dk = bhsd_doubles(g.dk, s.layout);
  const std::vector<double> dv = bhsd_doubles(g.dv, s.layout);
  EXPECT_FALSE(any_nan(dq)) << "NaN in dq";
  EXPECT_FALSE(any_nan(dk)) << "NaN in dk";
  EXPECT_FALSE(any_nan(dv)) << "NaN in dv";
  // dQ and dK are sums of dS = P (dP - delta), which cancels to exactly 0 where a row's one
  // visible key takes all the probability (a window of 0): there the GPU keeps the fp32 rounding
  // of dP - delta, so their error is measured against at least 1e-3 of dV's norm (a floor far
  // below the norm of any dQ or dK that does not cancel).
  const double floor = 1e-3 * l2_norm(want_dv);
  EXPECT_LT(rel_l2_floor(dq, want_dq, floor), 1e-2) << "rel L2 of dq";
  EXPECT_LT(rel_l2_floor(dk, want_dk, floor), 1e-2) << "rel L2 of dk";
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
  // Query rows that see no key (blocks that list nothing, or the token mask): dq exactly 0.
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < s.Sq; ++i) {
        if (p.row_sees_a_key(b, h, i)) continue;
        for (int64_t x = 0; x < s.D; ++x)
          ASSERT_EQ(dq[static_cast<size_t>(((b * s.Hq + h) * s.Sq + i) * s.D + x)], 0.0)
              << "dq of an empty row, b=" << b << " h=" << h << " i=" << i;
      }
}

// A case of a MatchesReference suite: the problem of case `c` with options.impl = `impl`, the
// forward through the reference, one run on the device (`expect_used` must run), the checks.
inline void expect_bsa_backward_case_matches_reference(const GpuBsaBwdCase& c, sa_impl impl,
                                                       sa_impl expect_used) {
  GpuBsaBwdProblem p(c, impl);
  if (p.c.spec.empty_rows) {
    ASSERT_TRUE(p.pat.has_empty_row(p.c.shape));
  }
  ASSERT_TRUE(p.forward());
  GpuBsaBwdDevice d(p);
  ASSERT_TRUE(d.ok());
  GpuBsaBwdGradients g;
  ASSERT_TRUE(run_bsa_backward(d, p, expect_used, &g));
  expect_bsa_backward_matches_reference(p, g);
}

// A CUDA graph captured once on a non-default stream (workspace preallocated), options.impl =
// `impl`, follows new metadata values on replay: the whole backward, reverse map included, reads
// them on the device. Buckets 0, single owner and 2; K and V of padded keys as generated (replay
// 2's block lengths make other keys padded).
// Deterministic mode with options.impl = `impl` (which must run): three runs give the same bytes
// (and match the reference). Two cases: block 128 GQA BSHD with partial blocks, empty rows and
// bucket 1 asked for (ignored: one owner per row); block 64 MQA.
inline void expect_bsa_backward_deterministic_bitwise(sa_impl impl) {
  for (const GpuBsaBwdCase& base :
       {gpu_bsa_bwd_case("DetBlock128D128GqaPartialEmptyRows",
                         shape_of(2, 8, 2, 700, 900, 128, 128, 5, SA_LAYOUT_BSHD),
                         spec_of(true, -1, true, true, true, 2), 1, true),
        gpu_bsa_bwd_case("DetBlock64D64Mqa", shape_of(1, 8, 1, 640, 512, 64, 64, 6),
                         spec_of(true, -1, true, true), 0, true)}) {
    SCOPED_TRACE(base.name);
    GpuBsaBwdProblem p(base, impl);
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

// Where the capture happens: on the test's thread after one eager call (ThreadLocal mode), or on a
// fresh host thread whose first library call is the captured one (Global mode, PyTorch's default):
// per-thread state the call creates (the BSA backward's side stream) is created inside the capture.
enum class CaptureOn { kThreadAfterEagerCall, kFreshThreadGlobalMode };

inline void expect_bsa_backward_graph_replay_follows_new_metadata(
    sa_impl impl, CaptureOn where = CaptureOn::kThreadAfterEagerCall) {
  for (const int32_t bucket : {0, kBsaBwdSingleOwner, 2}) {
    SCOPED_TRACE("bucket " + std::to_string(bucket));
    const BsaShape s = shape_of(1, 4, 2, 384, 512, 128, 128, 3);
    GpuBsaBwdProblem p(
        gpu_bsa_bwd_case("GraphFirst", s, spec_of(true, -1, true, true, false, 1), bucket), impl);
    ASSERT_TRUE(p.forward());
    GpuBsaBwdDevice d(p);
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
    cudaGraph_t graph = nullptr;
    cudaError_t begin = cudaSuccess, end = cudaSuccess;
    sa_status status = SA_OK;
    std::string error;
    const auto capture = [&](cudaStreamCaptureMode mode) {
      begin = cudaStreamBeginCapture(stream, mode);
      if (begin != cudaSuccess) return;
      status = sa_bsa_backward(&a, &ctx);
      if (status != SA_OK) error = sa_last_error();
      end = cudaStreamEndCapture(stream, &graph);
    };
    if (where == CaptureOn::kThreadAfterEagerCall) {
      // One eager call first (the call works outside a capture too; nothing is cached).
      ASSERT_EQ(sa_bsa_backward(&a, &ctx), SA_OK) << sa_last_error();
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      capture(cudaStreamCaptureModeThreadLocal);
    } else {
      int device = 0;
      ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
      std::thread([&] {
        begin = cudaSetDevice(device);  // reported below like a failed capture start
        if (begin == cudaSuccess) capture(cudaStreamCaptureModeGlobal);
      }).join();
    }
    ASSERT_EQ(begin, cudaSuccess) << cudaGetErrorString(begin);
    ASSERT_EQ(status, SA_OK) << error;
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
      GpuBsaBwdGradients g;
      ASSERT_TRUE(download_bsa_gradients(d, p, &g));
      expect_bsa_backward_matches_reference(p, g);
    }
    EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  }
}

// ---- DSA cases -------------------------------------------------------------------------------
inline DsaShape shape_of(int64_t Sq, int64_t Skv, int64_t H, int64_t Dqk, int64_t topk) {
  DsaShape s;
  s.Sq = Sq;
  s.Skv = Skv;
  s.H = H;
  s.Dqk = Dqk;
  s.Dv = 512;
  s.topk = topk;
  return s;
}

inline DsaMetaSpec spec_of(DsaLengths lengths, bool invalid, bool duplicates, DsaSink sink) {
  DsaMetaSpec m;
  m.lengths = lengths;
  m.invalid = invalid;
  m.duplicates = duplicates;
  m.sink = sink;
  return m;
}

// A case's seed: `base` mixed with the characters of the case's name.
inline uint64_t seed_of(uint64_t base, const std::string& name) {
  uint64_t seed = base;
  for (char ch : name) seed = seed * 131 + static_cast<uint64_t>(ch);
  return seed;
}

// NaN in every kv row no active slot selects (the kernels must never read them). Returns how
// many rows were poisoned.
inline int poison_unselected_kv_rows(DsaHostCase& c) {
  const std::vector<bool> selected = c.selected_keys();
  int poisoned = 0;
  for (int64_t j = 0; j < c.shape.Skv; ++j) {
    if (selected[static_cast<size_t>(j)]) continue;
    ++poisoned;
    for (int64_t d = 0; d < c.shape.Dqk; ++d) c.kv.set(j * c.shape.Dqk + d, NAN);
  }
  return poisoned;
}

// The reference forward through the public API (automatic choice, which must be the reference)
// on host tensors `q` and `kv` (the case's values, in any dtype) with the case's metadata: out in
// `out_dtype` and fp32 lse, both NaN before the call.
inline void run_dsa_reference_forward(const DsaHostCase& c, HostTensor& q, HostTensor& kv,
                                      sa_dtype out_dtype, HostTensor* out_result,
                                      HostTensor* lse_result) {
  const DsaShape& s = c.shape;
  HostTensor idx = c.topk_idx, len = c.topk_length, sink = c.sink;
  HostTensor out(out_dtype, {s.Sq, s.H, s.Dv}), lse(SA_DTYPE_FP32, {s.Sq, s.H});
  out.poison();
  lse.poison();
  sa_dsa_fwd_args a = sa_dsa_fwd_args_default();
  a.q = q.view();
  a.kv = kv.view();
  a.topk_idx = idx.view();
  a.topk_length = c.has_length ? len.view() : sa_tensor_none();
  a.sink = c.has_sink ? sink.view() : sa_tensor_none();
  a.out = out.view();
  a.lse = lse.view();
  a.options = sa_dsa_options_default();
  a.options.scale = c.scale;
  a.options.d_v = static_cast<int32_t>(s.Dv);
  sa_context ctx = sa_context_default();
  sa_impl used = SA_IMPL_AUTO;
  ctx.impl_used = &used;
  ASSERT_EQ(sa_dsa_forward(&a, &ctx), SA_OK) << sa_last_error();
  ASSERT_EQ(used, SA_IMPL_REFERENCE);
  *out_result = std::move(out);
  *lse_result = std::move(lse);
}

// ---- DSA forward: the GPU cases, one device run, the checks against the fp64 reference -------
// The portable and sm90 forward suites share these; each passes the implementation it forces.
struct GpuDsaFwdCase {
  std::string name;
  DsaShape shape;
  DsaMetaSpec spec;
  sa_dtype dtype = SA_DTYPE_BF16;
};

// The cases of the suite of `impl` (SA_IMPL_PORTABLE or SA_IMPL_SM90), in that suite's order. The
// sm90 suite takes bf16 cases at H 8, 64 and 128 (its H 16 / 32 suite borrows the portable
// ones); the portable suite also H 16, 24, 32, 80 and fp16.
inline std::vector<GpuDsaFwdCase> gpu_dsa_forward_cases(sa_impl impl) {
  using L = DsaLengths;
  using S = DsaSink;
  const sa_dtype kFp16 = SA_DTYPE_FP16;
  constexpr unsigned kPortable = 1, kSm90 = 2, kBoth = kPortable | kSm90;  // the suites of a case
  struct Tagged {
    unsigned suites;
    GpuDsaFwdCase c;
  };
  const Tagged all[] = {
      {kPortable, {"H16_D576_K64_Plain", shape_of(8, 256, 16, 576, 64),
                  spec_of(L::kNone, false, false, S::kNone)}},
      {kSm90, {"H64_D576_K64_Plain", shape_of(8, 256, 64, 576, 64),
              spec_of(L::kNone, false, false, S::kNone)}},
      {kPortable, {"H32_D512_K7_Lengths", shape_of(8, 64, 32, 512, 7),
                  spec_of(L::kMixed, false, false, S::kFinite)}},
      {kSm90, {"H64_D512_K7_Lengths", shape_of(8, 64, 64, 512, 7),
              spec_of(L::kMixed, false, false, S::kFinite)}},
      {kBoth, {"H64_D576_K100_LengthsInvalid", shape_of(8, 400, 64, 576, 100),
              spec_of(L::kMixed, true, false, S::kFinite)}},
      {kBoth, {"H128_D576_K2048_Everything", shape_of(5, 5000, 128, 576, 2048),
              spec_of(L::kMixed, true, true, S::kMixed)}},
      {kBoth, {"H128_D512_K2048_Plain", shape_of(4, 4096, 128, 512, 2048),
              spec_of(L::kNone, false, false, S::kNone)}},
      {kBoth, {"H64_D512_K1_LengthsInvalid", shape_of(8, 50, 64, 512, 1),
              spec_of(L::kMixed, true, false, S::kNone)}},
      {kPortable, {"H16_D576_K1_Plain", shape_of(6, 10, 16, 576, 1),
                  spec_of(L::kNone, false, false, S::kNone)}},
      {kSm90, {"H128_D576_K1_Plain", shape_of(6, 10, 128, 576, 1),
              spec_of(L::kNone, false, false, S::kNone)}},
      {kPortable, {"H32_D576_K100_TopkAboveSkv", shape_of(8, 40, 32, 576, 100),
                  spec_of(L::kMixed, false, false, S::kFinite)}},
      {kSm90, {"H64_D576_K100_TopkAboveSkv", shape_of(8, 40, 64, 576, 100),
              spec_of(L::kMixed, false, false, S::kFinite)}},
      {kBoth, {"H64_D576_K70_TopkAboveSkvDuplicates", shape_of(8, 30, 64, 576, 70),
              spec_of(L::kNone, false, true, S::kNone)}},
      {kBoth, {"H64_D576_K64_Duplicates", shape_of(8, 300, 64, 576, 64),
              spec_of(L::kNone, false, true, S::kFinite)}},
      {kBoth, {"H64_D576_K96_SinkPosInf", shape_of(8, 300, 64, 576, 96),
              spec_of(L::kMixed, true, false, S::kPosInf)}},
      {kBoth, {"H64_D576_K96_SinkNegInf", shape_of(8, 300, 64, 576, 96),
              spec_of(L::kMixed, true, false, S::kNegInf)}},
      {kBoth, {"H64_D576_K96_SinkHuge", shape_of(8, 300, 64, 576, 96),
              spec_of(L::kMixed, true, false, S::kHuge)}},
      {kBoth, {"H64_D512_K96_SinkLarge", shape_of(8, 300, 64, 512, 96),
              spec_of(L::kNone, false, false, S::kLarge)}},
      {kBoth, {"H128_D576_K160_SinkMixed", shape_of(6, 700, 128, 576, 160),
              spec_of(L::kMixed, true, true, S::kMixed)}},
      // H 8 (SPEC 2's smallest): one m16 tile half valid on the portable path, 56 padding rows
      // of the 64-row item on the Hopper one; H 24: a half-valid second tile (portable only).
      {kBoth, {"H8_D576_K64_Plain", shape_of(8, 256, 8, 576, 64),
              spec_of(L::kNone, false, false, S::kNone)}},
      {kBoth, {"H8_D512_K100_LengthsInvalidSink", shape_of(300, 400, 8, 512, 100),
              spec_of(L::kMixed, true, true, S::kMixed)}},
      {kBoth, {"H8_D576_K130_PersistentItems", shape_of(400, 800, 8, 576, 130),
              spec_of(L::kNone, false, true, S::kFinite)}},
      {kBoth, {"H8_D576_K100_TopkAboveSkv", shape_of(8, 40, 8, 576, 100),
              spec_of(L::kMixed, false, false, S::kPosInf)}},
      {kPortable, {"H24_D576_K96_LengthsSink", shape_of(40, 300, 24, 576, 96),
                  spec_of(L::kMixed, true, false, S::kFinite)}},
      {kPortable, {"H80_D576_K96_PartialHeadGroup", shape_of(6, 300, 80, 576, 96),
                  spec_of(L::kMixed, true, false, S::kMixed)}},
      {kBoth, {"H128_D576_K96_ManyTokens", shape_of(40, 1024, 128, 576, 96),
              spec_of(L::kMixed, true, false, S::kFinite)}},
      {kPortable, {"H16_D512_K33_ManyTokens", shape_of(300, 512, 16, 512, 33),
                  spec_of(L::kMixed, true, false, S::kFinite)}},
      {kSm90, {"H128_D512_K600_LengthsInvalid", shape_of(4, 1500, 128, 512, 600),
              spec_of(L::kMixed, true, false, S::kMixed)}},
      // More work items (tokens x head groups) than an H200's 132 SMs and no topk_length: the
      // Hopper seesaw kernel's persistent CTAs walk several items each (3 chunks: an odd count, 2
      // iterations; and 1 chunk: one iteration whose second block is all inactive).
      {kSm90, {"H128_D576_K130_PersistentItems", shape_of(200, 800, 128, 576, 130),
              spec_of(L::kNone, true, true, S::kMixed)}},
      {kSm90, {"H64_D512_K64_PersistentItems", shape_of(300, 400, 64, 512, 64),
              spec_of(L::kNone, true, false, S::kFinite)}},
      // 5 chunks: 3 iterations per item, so the CTA's iteration count (the barriers' parity base)
      // is odd after its first item.
      {kSm90, {"H64_D576_K300_PersistentItems", shape_of(300, 700, 64, 576, 300),
              spec_of(L::kNone, false, false, S::kNone)}},
      // The same with topk_length: the persistent CTAs take their items from the workspace's
      // counter (dynamic scheduling), items of 0 to 5 chunks, some without any (kMixed: tokens
      // 0, 1, 66, 133, ...).
      {kSm90, {"H128_D576_K130_LengthsDynamicItems", shape_of(200, 800, 128, 576, 130),
              spec_of(L::kMixed, true, true, S::kMixed)}},
      {kSm90, {"H64_D576_K300_LengthsDynamicItems", shape_of(300, 700, 64, 576, 300),
              spec_of(L::kMixed, true, false, S::kFinite)}},
      {kSm90, {"H64_D512_K64_LengthsDynamicItems", shape_of(300, 400, 64, 512, 64),
              spec_of(L::kMixed, false, false, S::kNone)}},
      // H 16 and 32 (head padding) run the same persistent seesaw kernel: more items than SMs,
      // without and with topk_length (static and dynamic items).
      {kSm90, {"H16_D576_K130_PersistentItems", shape_of(300, 800, 16, 576, 130),
              spec_of(L::kNone, true, true, S::kMixed)}},
      {kSm90, {"H32_D512_K64_LengthsDynamicItems", shape_of(300, 400, 32, 512, 64),
              spec_of(L::kMixed, true, false, S::kFinite)}},
      // H 16 runs the transposed kernel (dsa_forward_small_h.cuh): items of 0 to 5 chunks on both
      // consumer warpgroups (their merge), dynamic items, and the sink's edge values.
      {kSm90, {"H16_D576_K300_LengthsDynamicItems", shape_of(300, 700, 16, 576, 300),
              spec_of(L::kMixed, true, true, S::kMixed)}},
      {kSm90, {"H16_D576_K96_SinkPosInf", shape_of(8, 300, 16, 576, 96),
              spec_of(L::kMixed, true, false, S::kPosInf)}},
      {kSm90, {"H16_D576_K96_SinkNegInf", shape_of(8, 300, 16, 576, 96),
              spec_of(L::kMixed, true, false, S::kNegInf)}},
      {kSm90, {"H16_D512_K200_SinkHuge", shape_of(8, 300, 16, 512, 200),
              spec_of(L::kNone, false, false, S::kHuge)}},
      // ~10 items per CTA on 132 SMs: the item slots' barriers wrap their parities.
      {kSm90, {"H64_D512_K16_LengthsDynamicManyItems", shape_of(1400, 256, 64, 512, 16),
              spec_of(L::kMixed, true, false, S::kFinite)}},
      {kPortable, {"H64_D576_K100_Fp16", shape_of(8, 400, 64, 576, 100),
                  spec_of(L::kMixed, true, true, S::kFinite), kFp16}},
      {kPortable, {"H128_D512_K600_Fp16", shape_of(4, 1500, 128, 512, 600),
                  spec_of(L::kMixed, true, false, S::kMixed), kFp16}},
  };
  const unsigned suite = impl == SA_IMPL_SM90 ? kSm90 : kPortable;
  std::vector<GpuDsaFwdCase> cases;
  for (const Tagged& t : all)
    if ((t.suites & suite) != 0) cases.push_back(t.c);
  return cases;
}

struct DsaFwdOutputs {
  HostTensor out, lse;
};

// The device copies of one DSA forward run: the case's inputs, out and lse.
struct DsaFwdDeviceBuffers {
  const DeviceBuffer &q, &kv, &idx, &len, &sink, &out, &lse;
};

// sa_dsa_forward through the public API on `d` with options.impl = `impl`; `expect_used` is the
// implementation that must have run. With `workspace` the queried workspace is passed, full of
// garbage (the forward must not rely on its contents); without, none (the forward's workspace is
// optional).
inline void launch_dsa_forward_public_api(const DsaHostCase& c, const DsaFwdDeviceBuffers& d,
                                          sa_impl impl, sa_impl expect_used,
                                          bool workspace = true) {
  const DsaShape& s = c.shape;
  sa_dsa_fwd_args a = sa_dsa_fwd_args_default();
  a.q = view_of(d.q.get(), c.dtype, {s.Sq, s.H, s.Dqk}, SA_DEVICE_CUDA);
  a.kv = view_of(d.kv.get(), c.dtype, {s.Skv, s.Dqk}, SA_DEVICE_CUDA);
  a.topk_idx = view_of(d.idx.get(), SA_DTYPE_INT32, {s.Sq, s.topk}, SA_DEVICE_CUDA);
  a.topk_length = c.has_length ? view_of(d.len.get(), SA_DTYPE_INT32, {s.Sq}, SA_DEVICE_CUDA)
                               : sa_tensor_none();
  a.sink =
      c.has_sink ? view_of(d.sink.get(), SA_DTYPE_FP32, {s.H}, SA_DEVICE_CUDA) : sa_tensor_none();
  a.out = view_of(d.out.get(), c.dtype, {s.Sq, s.H, s.Dv}, SA_DEVICE_CUDA);
  a.lse = view_of(d.lse.get(), SA_DTYPE_FP32, {s.Sq, s.H}, SA_DEVICE_CUDA);
  a.options = sa_dsa_options_default();
  a.options.scale = c.scale;
  a.options.d_v = static_cast<int32_t>(s.Dv);
  a.options.impl = impl;
  sa_context ctx = sa_context_default();
  size_t bytes = 0;
  ASSERT_EQ(sa_dsa_forward_workspace_size(&a, &bytes), SA_OK) << sa_last_error();
  DeviceBuffer ws(workspace ? bytes : 0);
  ASSERT_TRUE(ws.ok());
  if (workspace && bytes > 0) {
    // Garbage that would skip items if the forward did not zero its item counter.
    ASSERT_EQ(cudaMemset(ws.get(), 0x40, bytes), cudaSuccess);
    ctx.workspace = ws.get();
    ctx.workspace_bytes = bytes;
  }
  sa_impl used = SA_IMPL_AUTO;
  ctx.impl_used = &used;
  ASSERT_EQ(sa_dsa_forward(&a, &ctx), SA_OK) << sa_last_error();
  ASSERT_EQ(used, expect_used);
  // The workspace is freed when this returns: the kernel must be done with it.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// A kernel on device copies of the case's inputs, out and lse starting as NaN: `launch`, called
// with the buffers, runs it (a fatal failure inside stops the run); then out and lse come back.
template <class Launch>
void run_dsa_forward_on_device(const DsaHostCase& c, Launch&& launch, DsaFwdOutputs* result) {
  const DsaShape& s = c.shape;
  HostTensor out(c.dtype, {s.Sq, s.H, s.Dv}), lse(SA_DTYPE_FP32, {s.Sq, s.H});
  out.poison();
  lse.poison();
  DeviceBuffer q(c.q), kv(c.kv), idx(c.topk_idx), len(c.topk_length), sink(c.sink), d_out(out),
      d_lse(lse);
  for (const DeviceBuffer* b : {&q, &kv, &idx, &len, &sink, &d_out, &d_lse})
    ASSERT_TRUE(b->ok()) << "device allocation or copy failed";
  const DsaFwdDeviceBuffers d{q, kv, idx, len, sink, d_out, d_lse};
  ASSERT_NO_FATAL_FAILURE(launch(d));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  ASSERT_TRUE(d_out.download(out));
  ASSERT_TRUE(d_lse.download(lse));
  result->out = std::move(out);
  result->lse = std::move(lse);
}

// The public API on device copies of the case's inputs (out and lse start as NaN); `impl` is the
// implementation forced, `expect_used` the one that must have run.
inline void run_dsa_forward_public_api(const DsaHostCase& c, sa_impl impl, sa_impl expect_used,
                                       DsaFwdOutputs* result, bool workspace = true) {
  run_dsa_forward_on_device(
      c,
      [&](const DsaFwdDeviceBuffers& d) {
        launch_dsa_forward_public_api(c, d, impl, expect_used, workspace);
      },
      result);
}

// The fp64 reference through the public API on fp64 copies of the case's (16-bit) host values.
inline void run_dsa_forward_fp64_reference(const DsaHostCase& c, DsaFwdOutputs* result) {
  HostTensor q = to_fp64(c.q), kv = to_fp64(c.kv);
  run_dsa_reference_forward(c, q, kv, SA_DTYPE_FP64, &result->out, &result->lse);
}

// Pass: no NaN anywhere; rel L2 of out < 1e-2 (recorded as property rel_l2[_what]); lse within
// 1e-4 and +inf at the same positions; exactly 0 in rows that are empty or whose head has a sink
// of +inf (or above 1e38). `what` (null: none) prefixes the messages.
inline void expect_dsa_forward_matches(const DsaHostCase& c, const DsaFwdOutputs& got,
                                       const DsaFwdOutputs& want, const char* what) {
  const std::string prefix = what != nullptr ? std::string(what) + ": " : std::string();
  const DsaShape& s = c.shape;
  const std::vector<double> out = got.out.to_double(), lse = got.lse.to_double();
  const std::vector<double> ref_out = want.out.to_double(), ref_lse = want.lse.to_double();
  ASSERT_FALSE(any_nan(ref_out)) << "reference out holds NaN";
  EXPECT_FALSE(any_nan(out)) << prefix << "NaN in out";
  EXPECT_FALSE(any_nan(lse)) << prefix << "NaN in lse";

  double ref_norm = 0.0;
  for (double v : ref_out) ref_norm += v * v;
  if (ref_norm > 0.0) {
    const double err = rel_l2(out, ref_out);
    EXPECT_LT(err, 1e-2) << prefix << "rel L2 of out";
    ::testing::Test::RecordProperty(
        what != nullptr ? std::string("rel_l2_") + what : std::string("rel_l2"),
        std::to_string(err));
  }
  EXPECT_TRUE(all_close(lse, ref_lse, 1e-4, 0.0)) << prefix << "lse";

  // Rows that must be exactly zero: empty rows, heads whose sink takes the whole softmax.
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t t = 0; t < s.Sq; ++t) {
    for (int64_t h = 0; h < s.H; ++h) {
      const double sink = c.sink_at(h);
      if (!(c.row_empty(t) || sink == inf || sink > 1e38)) continue;
      for (int64_t d = 0; d < s.Dv; ++d) {
        const double v = out[static_cast<size_t>((t * s.H + h) * s.Dv + d)];
        ASSERT_EQ(v, 0.0) << prefix << "out[" << t << ", " << h << ", " << d
                          << "] must be 0 (empty row or infinite sink)";
      }
    }
  }
}

// Forces `impl` on a small DSA forward (S_q 2, S_kv 4, topk 2, no lengths or sinks) with H, D_qk,
// d_v and dtype as given, on uninitialised device tensors: it must be refused
// (SA_ERROR_UNSUPPORTED) with `reason` in the message.
inline void expect_dsa_forward_refused(sa_impl impl, int64_t H, int64_t Dqk, int64_t Dv,
                                       sa_dtype dtype, const char* reason) {
  const int64_t Sq = 2, Skv = 4, topk = 2;
  const int64_t esize = dtype == SA_DTYPE_FP32 ? 4 : 2;
  void *q = nullptr, *kv = nullptr, *idx = nullptr, *out = nullptr, *lse = nullptr;
  ASSERT_EQ(cudaMalloc(&q, Sq * H * Dqk * esize), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&kv, Skv * Dqk * esize), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&idx, Sq * topk * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, Sq * H * Dv * esize), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&lse, Sq * H * 4), cudaSuccess);
  sa_dsa_fwd_args a = sa_dsa_fwd_args_default();
  a.q = view_of(q, dtype, {Sq, H, Dqk}, SA_DEVICE_CUDA);
  a.kv = view_of(kv, dtype, {Skv, Dqk}, SA_DEVICE_CUDA);
  a.topk_idx = view_of(idx, SA_DTYPE_INT32, {Sq, topk}, SA_DEVICE_CUDA);
  a.topk_length = sa_tensor_none();
  a.sink = sa_tensor_none();
  a.out = view_of(out, dtype, {Sq, H, Dv}, SA_DEVICE_CUDA);
  a.lse = view_of(lse, SA_DTYPE_FP32, {Sq, H}, SA_DEVICE_CUDA);
  a.options = sa_dsa_options_default();
  a.options.d_v = static_cast<int32_t>(Dv);
  a.options.impl = impl;
  const sa_status st = sa_dsa_forward(&a, nullptr);
  const std::string message = sa_last_error();
  EXPECT_EQ(st, SA_ERROR_UNSUPPORTED) << message;
  EXPECT_NE(message.find(reason), std::string::npos)
      << "expected \"" << reason << "\" in: " << message;
  for (void* ptr : {q, kv, idx, out, lse}) (void)cudaFree(ptr);
}

}  // namespace sa_test

// Skips the test unless there is a CUDA device and it is sm_90.
#define SA_SKIP_UNLESS_SM90()                                               \
  do {                                                                      \
    SA_SKIP_WITHOUT_GPU();                                                  \
    if (!::sa_test::device_is_sm90()) GTEST_SKIP() << "not an sm_90 device"; \
  } while (0)
