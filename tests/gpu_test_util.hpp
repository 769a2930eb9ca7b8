// Helpers shared by the GPU test files: skipping by device, device memory owned by a test, device
// copies of host tensors with padded rows and NaN guard regions (which must come back untouched),
// fp64 copies for the reference oracle, the shape / pattern builders of the case tables, and the
// run-and-compare steps several suites share. Header-only; everything goes through the public API
// except what the test files call on the implementations themselves.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bsa_problem_builder.hpp"
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
  sa_bsa_fwd_args args{};
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
// without keys; lse within 1e-4 and -inf exactly where the reference has it.
inline void expect_bsa_forward_matches_reference(const BsaShape& s, BsaPattern& pat,
                                                 const BsaTensors& t,
                                                 const sa_bsa_options& options, int64_t pad,
                                                 double tol) {
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
  // Rows without keys: exactly 0.
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < s.Sq; ++i) {
        if (pat.count(b, h, i / s.block) != 0) continue;
        for (int64_t x = 0; x < s.Dv; ++x)
          ASSERT_EQ(got[static_cast<size_t>(((b * s.Hq + h) * s.Sq + i) * s.Dv + x)], 0.0)
              << "o of an empty row, b=" << b << " h=" << h << " i=" << i;
      }
  // LSE: within 1e-4, -inf exactly where the reference has it, no NaN.
  EXPECT_TRUE(all_close(lse_gpu.to_double(), lse_ref.to_double(), 1e-4, 0.0)) << "lse";
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
  sa_dsa_fwd_args a{};
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

}  // namespace sa_test

// Skips the test unless there is a CUDA device and it is sm_90.
#define SA_SKIP_UNLESS_SM90()                                               \
  do {                                                                      \
    SA_SKIP_WITHOUT_GPU();                                                  \
    if (!::sa_test::device_is_sm90()) GTEST_SKIP() << "not an sm_90 device"; \
  } while (0)
