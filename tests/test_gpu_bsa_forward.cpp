// The portable BSA forward (src/portable/bsa_forward.cu) against the fp64 reference (SPEC 1).
//
// Each case builds random inputs and a random sparsity pattern on the host
// (bsa_problem_builder.hpp), copies them to the device with o and lse poisoned with NaN, and runs
// sa_bsa_forward on the CUDA tensors (automatic implementation choice, which must be the portable
// one). The oracle is the reference run through the same public API on fp64 copies of the same
// host values. Device tensors have padded rows (their last-dim stride pattern is that of a wider
// tensor) and a guard region after the data, both NaN, which must come back untouched: nothing is
// written outside the output, in particular no query row past S_q.
// Pass: no NaN in o or lse; rel L2 of o below what the dtype allows (P and o are rounded to it);
// lse within 1e-4 and -inf exactly on the rows without keys.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "bsa_problem_builder.hpp"
#include "test_util.hpp"

namespace sa_test {
namespace {

// ---- device memory ---------------------------------------------------------------------------
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(const std::vector<uint8_t>& bytes) : bytes_(bytes.size()) {
    if (bytes_ == 0) return;
    ok_ = cudaMalloc(&ptr_, bytes_) == cudaSuccess &&
          cudaMemcpy(ptr_, bytes.data(), bytes_, cudaMemcpyHostToDevice) == cudaSuccess;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  bool ok() const { return ok_; }
  bool download(std::vector<uint8_t>& bytes) const {
    bytes.resize(bytes_);
    return cudaMemcpy(bytes.data(), ptr_, bytes_, cudaMemcpyDeviceToHost) == cudaSuccess;
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
    const int64_t esize = sa::dtype_size(dtype_);
    const int64_t X = shape_.back();
    const int64_t rows = t.numel() / X;
    HostTensor phys(dtype_, {rows * (X + pad) + guard});
    if (dtype_ != SA_DTYPE_INT32) phys.poison();
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<uint8_t*>(phys.data()) + r * (X + pad) * esize,
                  static_cast<const uint8_t*>(t.data()) + r * X * esize,
                  static_cast<size_t>(X * esize));
    buffer_ = std::make_unique<DeviceBuffer>(phys.bytes());
    view_ = sa_tensor_contiguous(buffer_->get(), dtype_, static_cast<int32_t>(shape_.size()),
                                 shape_.data(), SA_DEVICE_CUDA, 0);
    int64_t stride = 1;
    for (int i = static_cast<int>(shape_.size()) - 1; i >= 0; --i) {
      view_.strides[i] = stride;
      stride *= (i == static_cast<int>(shape_.size()) - 1) ? X + pad : shape_[i];
    }
  }
  bool ok() const { return buffer_->ok(); }
  const sa_tensor& view() const { return view_; }

  // Copies the tensor back into `t` (same shape and dtype). Returns false when the copy fails or
  // when some element of the padding or guard is no longer NaN.
  ::testing::AssertionResult download(HostTensor& t) const {
    std::vector<uint8_t> bytes;
    if (!buffer_->download(bytes)) return ::testing::AssertionFailure() << "cudaMemcpy failed";
    const int64_t esize = sa::dtype_size(dtype_);
    const int64_t X = shape_.back();
    const int64_t rows = t.numel() / X;
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<uint8_t*>(t.data()) + r * X * esize,
                  bytes.data() + r * (X + pad_) * esize, static_cast<size_t>(X * esize));
    HostTensor phys(dtype_, {rows * (X + pad_) + guard_});
    std::memcpy(phys.data(), bytes.data(), bytes.size());
    for (int64_t i = 0; i < phys.numel(); ++i) {
      const bool outside = i >= rows * (X + pad_) || i % (X + pad_) >= X;
      if (outside && !std::isnan(phys.get(i)))
        return ::testing::AssertionFailure()
               << "element " << i << " outside the tensor was written (" << phys.get(i) << ")";
    }
    return ::testing::AssertionSuccess();
  }

 private:
  sa_dtype dtype_;
  std::vector<int64_t> shape_;
  int64_t pad_, guard_;
  std::unique_ptr<DeviceBuffer> buffer_;
  sa_tensor view_{};
};

HostTensor to_fp64(const HostTensor& t) {
  HostTensor r(SA_DTYPE_FP64, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) r.set(i, t.get(i));
  return r;
}

// ---- cases -----------------------------------------------------------------------------------
struct GpuBsaCase {
  std::string name;
  BsaShape shape;
  BsaPatternSpec spec;
  sa_dtype dtype = SA_DTYPE_BF16;
  float scale = 0.f;    // 0: 1/sqrt(D)
  int64_t pad = 8;      // extra elements per innermost row of q, k, v, o on the device
};

void PrintTo(const GpuBsaCase& c, std::ostream* os) { *os << c.name; }

BsaShape shape_of(int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Skv, int64_t D,
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
// list no block; len / len_per_batch: kv_block_len [N_kv] / [B, N_kv] with partial blocks.
BsaPatternSpec spec_of(bool per_row, int32_t fixed, bool empty, bool len,
                       bool len_per_batch = false) {
  BsaPatternSpec s;
  s.per_row_count = per_row;
  s.fixed_count = fixed;
  s.empty_rows = empty;
  s.kv_block_len = len;
  s.kv_block_len_per_batch = len_per_batch;
  return s;
}

GpuBsaCase make_case(std::string name, BsaShape shape, BsaPatternSpec spec, sa_dtype dtype,
                     float scale = 0.f, int64_t pad = 8) {
  GpuBsaCase c;
  c.name = std::move(name);
  c.shape = shape;
  c.spec = spec;
  c.dtype = dtype;
  c.scale = scale;
  c.pad = pad;
  return c;
}

constexpr sa_dtype kBf16 = SA_DTYPE_BF16;
constexpr sa_dtype kFp16 = SA_DTYPE_FP16;
constexpr sa_layout kBshd = SA_LAYOUT_BSHD;

const GpuBsaCase kCases[] = {
    // block 128 (128-row CTAs, 32 rows per warp)
    make_case("Block128D128Bf16MhaBhsd", shape_of(1, 2, 2, 256, 384, 128, 128, 3),
              spec_of(true, -1, false, false), kBf16),
    make_case("Block128D128Bf16GqaBshdPartialLenPerBatchEmptyRows",
              shape_of(2, 4, 2, 300, 333, 128, 128, 3, kBshd), spec_of(true, -1, true, true, true),
              kBf16),
    make_case("Block128D128Fp16MqaFixedCountSkvNotMultiple",
              shape_of(1, 4, 1, 128, 129, 128, 128, 2), spec_of(false, 2, false, false), kFp16),
    make_case("Block128D64Fp16MqaFixedCountPartialLen", shape_of(1, 3, 1, 200, 300, 64, 128, 2),
              spec_of(false, 2, false, true), kFp16),
    make_case("Block128D64Bf16GqaBshdEmptyRows", shape_of(2, 4, 2, 257, 256, 64, 128, 2, kBshd),
              spec_of(true, -1, true, false), kBf16),
    // block 64 (64-row CTAs, 16 rows per warp)
    make_case("Block64D128Bf16GqaBshdPartialLenEmptyRows",
              shape_of(1, 4, 2, 130, 200, 128, 64, 3, kBshd), spec_of(true, -1, true, true),
              kBf16),
    make_case("Block64D128Fp16MhaBhsd", shape_of(2, 2, 2, 192, 256, 128, 64, 4),
              spec_of(true, -1, false, false), kFp16),
    make_case("Block64D64Fp16MqaPartialLenPerBatch", shape_of(2, 2, 1, 190, 250, 64, 64, 4),
              spec_of(true, -1, true, true, true), kFp16),
    make_case("Block64D64Bf16GqaBshdFixedCount", shape_of(1, 6, 3, 100, 320, 64, 64, 5, kBshd),
              spec_of(false, -1, false, false), kBf16),
    // contiguous tensors (no row padding)
    make_case("Block128D128Bf16Contiguous", shape_of(1, 2, 1, 200, 256, 128, 128, 2),
              spec_of(true, -1, false, true), kBf16, 0.f, 0),
    // a negative scale (the softmax tracks the minimum dot product)
    make_case("Block128D128Bf16NegativeScale", shape_of(1, 2, 2, 200, 256, 128, 128, 2),
              spec_of(true, -1, false, true), kBf16, -0.2f),
    // more than 128 blocks in a row (the kernel stages the block list 128 slots at a time)
    make_case("Block64D64Bf16RowOf150Blocks", shape_of(1, 1, 1, 64, 64 * 150, 64, 64, 150),
              spec_of(false, 150, false, true), kBf16),
    // every row empty
    make_case("Block128D128Bf16CountZero", shape_of(1, 2, 2, 200, 256, 128, 128, 2),
              spec_of(false, 0, false, false), kBf16),
};

class GpuBsaForward : public ::testing::TestWithParam<GpuBsaCase> {};

TEST_P(GpuBsaForward, MatchesReference) {
  SA_SKIP_WITHOUT_GPU();
  const GpuBsaCase& c = GetParam();
  const BsaShape& s = c.shape;
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  BsaPattern pat = random_bsa_pattern(s, c.spec, rng);
  BsaTensors t = make_bsa_tensors(s, c.dtype, rng);
  if (c.spec.empty_rows) {
    ASSERT_TRUE(pat.has_empty_row(s));
  }

  sa_bsa_options options = sa_bsa_options_default();
  options.scale = c.scale;
  options.layout = s.layout;
  options.block_size = s.block;
  options.count = pat.has_count ? -1 : pat.fixed_count;

  // ---- GPU: CUDA tensors, o and lse poisoned, automatic implementation choice ----
  const int64_t guard = 64 * s.Dv;
  DeviceTensor q(t.q, c.pad, 0), k(t.k, c.pad, 0), v(t.v, c.pad, 0), o(t.o, c.pad, guard);
  DeviceTensor lse(t.lse, 0, 64);
  DeviceTensor index(pat.q2k_index, 0, 0);
  HostTensor none_host(SA_DTYPE_INT32, {1});
  DeviceTensor count(pat.has_count ? pat.q2k_count : none_host, 0, 0);
  DeviceTensor block_len(pat.has_block_len ? pat.kv_block_len : none_host, 0, 0);
  ASSERT_TRUE(q.ok() && k.ok() && v.ok() && o.ok() && lse.ok() && index.ok() && count.ok() &&
              block_len.ok());

  sa_bsa_fwd_args args{};
  args.q = q.view();
  args.k = k.view();
  args.v = v.view();
  args.o = o.view();
  args.lse = lse.view();
  args.sparsity.q2k_index = index.view();
  args.sparsity.q2k_count = pat.has_count ? count.view() : sa_tensor_none();
  args.sparsity.kv_block_len = pat.has_block_len ? block_len.view() : sa_tensor_none();
  args.options = options;
  // This suite tests the portable path on every GPU (on sm_90, AUTO would pick the Hopper path,
  // which has its own suite).
  args.options.impl = SA_IMPL_PORTABLE;
  sa_impl used = SA_IMPL_AUTO;
  sa_context ctx = sa_context_default();
  ctx.impl_used = &used;
  ASSERT_EQ(sa_bsa_forward(&args, &ctx), SA_OK) << sa_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(used, SA_IMPL_PORTABLE);
  HostTensor o_gpu(c.dtype, t.o.shape()), lse_gpu(SA_DTYPE_FP32, t.lse.shape());
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
  const double tol = c.dtype == SA_DTYPE_FP16 ? 2e-3 : 1e-2;
  const double err = rel_l2(got, want);
  EXPECT_LT(err, tol) << "rel L2 of o";
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

INSTANTIATE_TEST_SUITE_P(Cases, GpuBsaForward, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<GpuBsaCase>& info) {
                           return info.param.name;
                         });

// A head dim the portable forward does not serve is refused with its reason, not run.
TEST(GpuBsaForwardSupport, RefusesUnsupportedHeadDim) {
  SA_SKIP_WITHOUT_GPU();
  const BsaShape s = shape_of(1, 1, 1, 64, 64, 96, 64, 1);
  std::mt19937_64 rng(7);
  BsaPattern pat = random_bsa_pattern(s, spec_of(false, 1, false, false), rng);
  BsaTensors t = make_bsa_tensors(s, SA_DTYPE_BF16, rng);
  DeviceTensor q(t.q, 0, 0), k(t.k, 0, 0), v(t.v, 0, 0), o(t.o, 0, 0), lse(t.lse, 0, 0);
  DeviceTensor index(pat.q2k_index, 0, 0);
  ASSERT_TRUE(q.ok() && k.ok() && v.ok() && o.ok() && lse.ok() && index.ok());
  sa_bsa_fwd_args args{};
  args.q = q.view();
  args.k = k.view();
  args.v = v.view();
  args.o = o.view();
  args.lse = lse.view();
  args.sparsity.q2k_index = index.view();
  args.sparsity.q2k_count = sa_tensor_none();
  args.sparsity.kv_block_len = sa_tensor_none();
  args.options = sa_bsa_options_default();
  args.options.block_size = 64;
  args.options.impl = SA_IMPL_PORTABLE;
  EXPECT_EQ(sa_bsa_forward(&args, nullptr), SA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(sa_last_error()).find("D = 96, D_v = 96"), std::string::npos)
      << sa_last_error();
}

}  // namespace
}  // namespace sa_test
