// Test-only helpers of the indexer's GPU suites (tests/test_gpu_indexer*.cpp): bf16 cases with
// key patterns that make ties, device copies of a case's inputs, and the public-API calls of
// scores, top-k and the loss with options.impl forced. Header-only.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/tuning.hpp"
#include "gpu_test_util.hpp"
#include "indexer_case.hpp"
#include "test_util.hpp"

namespace sa_test {

// How k_I is filled (q_I, w random as make_indexer_case draws them unless noted).
enum class IndexerKeys {
  kRandom,      // uniform [-1, 1]
  kTied,        // every key the same row: every score of a query equal (ties everywhere)
  kDuplicates,  // key 2i + 1 a copy of key 2i: pairwise ties
  kIncreasing,  // q_I, w > 0 and key s = c (s + 1) / S_kv with c > 0: scores rise with s, every
                // key beats the k-th best so far (the top-k kernel's worst case)
  kZero         // every key 0: every score 0
};

inline IndexerShape indexer_shape(int64_t Sq, int64_t Skv, int64_t HI) {
  IndexerShape s;
  s.Sq = Sq;
  s.Skv = Skv;
  s.HI = HI;
  s.DI = 128;
  return s;
}

// A bf16 case (w fp32) with keys of `keys`; `nan_w_rows`: w of every 7th query (t % 7 == 3) :=
// NaN, so that all its scores are NaN (ranked last, ties by key).
inline IndexerCase make_gpu_indexer_case(const IndexerShape& shape, IndexerRanges ranges,
                                         IndexerKeys keys, bool nan_w_rows, uint64_t seed) {
  IndexerCase c = make_indexer_case(shape, ranges, SA_DTYPE_BF16, seed);
  const int64_t D = shape.DI;
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  switch (keys) {
    case IndexerKeys::kRandom:
      break;
    case IndexerKeys::kTied:
      for (int64_t s = 1; s < shape.Skv; ++s)
        for (int64_t x = 0; x < D; ++x) c.k_I.set(s * D + x, c.k_I.get(x));
      break;
    case IndexerKeys::kDuplicates:
      for (int64_t s = 1; s < shape.Skv; s += 2)
        for (int64_t x = 0; x < D; ++x) c.k_I.set(s * D + x, c.k_I.get((s - 1) * D + x));
      break;
    case IndexerKeys::kIncreasing: {
      std::vector<double> dir(static_cast<size_t>(D));
      for (double& v : dir) v = 0.5 + 0.5 * std::fabs(u(rng));
      for (int64_t i = 0; i < c.q_I.numel(); ++i) c.q_I.set(i, 0.25 + 0.75 * std::fabs(u(rng)));
      for (int64_t i = 0; i < c.w.numel(); ++i) c.w.set(i, 0.1 + std::fabs(u(rng)));
      for (int64_t s = 0; s < shape.Skv; ++s)
        for (int64_t x = 0; x < D; ++x)
          c.k_I.set(s * D + x, dir[static_cast<size_t>(x)] * double(s + 1) / double(shape.Skv));
      break;
    }
    case IndexerKeys::kZero:
      c.k_I.fill(0.0);
      break;
  }
  if (nan_w_rows)
    for (int64_t t = 3; t < shape.Sq; t += 7)
      for (int64_t j = 0; j < shape.HI; ++j) c.w.set(t * shape.HI + j, NAN);
  return c;
}

// Device copies of a case's indexer inputs; q_I, k_I and w rows `pad` elements wider.
struct GpuIndexerInputs {
  DeviceTensor q_I, k_I, w, k_start, k_end;
  bool has_range;
  GpuIndexerInputs(const IndexerCase& c, int64_t pad)
      : q_I(c.q_I, pad, 0), k_I(c.k_I, pad, 0), w(c.w, pad, 0), k_start(c.k_start, 0, 0),
        k_end(c.k_end, 0, 0), has_range(c.has_range) {}
  bool ok() const { return q_I.ok() && k_I.ok() && w.ok() && k_start.ok() && k_end.ok(); }
  sa_tensor start() const { return has_range ? k_start.view() : sa_tensor_none(); }
  sa_tensor end() const { return has_range ? k_end.view() : sa_tensor_none(); }
};

// An int32 device output of `n` elements followed by a guard of `guard` elements; everything
// starts as kUnwritten, which no output value can be (values are -1 or a key, a count < 2^31 -
// 128): after a run, the guard must still hold it and the tensor must not.
class DeviceInts {
 public:
  static constexpr int32_t kUnwritten = static_cast<int32_t>(0xabababab);
  DeviceInts(int64_t n, int64_t guard) : n_(n), guard_(guard), buf_((n + guard) * 4) {}
  bool ok() const { return buf_.ok(); }
  void* get() const { return buf_.get(); }
  bool reset() { return cudaMemset(buf_.get(), 0xab, buf_.bytes()) == cudaSuccess; }
  // The tensor's values; fails when a guard element was written or a tensor element was not.
  ::testing::AssertionResult download(std::vector<int32_t>* values) const {
    std::vector<int32_t> all(static_cast<size_t>(n_ + guard_));
    if (cudaMemcpy(all.data(), buf_.get(), buf_.bytes(), cudaMemcpyDeviceToHost) != cudaSuccess)
      return ::testing::AssertionFailure() << "cudaMemcpy failed";
    for (int64_t i = 0; i < n_ + guard_; ++i) {
      const bool unwritten = all[static_cast<size_t>(i)] == kUnwritten;
      if (i < n_ && unwritten)
        return ::testing::AssertionFailure() << "element " << i << " was not written";
      if (i >= n_ && !unwritten)
        return ::testing::AssertionFailure() << "guard element " << i - n_ << " was written";
    }
    values->assign(all.begin(), all.begin() + n_);
    return ::testing::AssertionSuccess();
  }

 private:
  int64_t n_, guard_;
  DeviceBuffer buf_;
};

// Row t's top-k over `scores` ([S_q, S_kv], -inf outside the range) by SPEC 5's rule: the k keys
// of the range with the largest values (ties to the smaller key, NaN last), in key order, then -1.
// Returns min(k, |range|).
inline int64_t select_topk(const IndexerCase& c, const std::vector<float>& scores, int64_t t,
                           int64_t k, std::vector<int32_t>* row) {
  const int64_t Skv = c.shape.Skv;
  std::vector<int64_t> keys;
  for (int64_t s = c.begin(t); s < c.end(t); ++s) keys.push_back(s);
  auto score = [&](int64_t s) { return scores[static_cast<size_t>(t * Skv + s)]; };
  const auto before = [&](int64_t a, int64_t b) {
    const float x = score(a), y = score(b);
    const bool xn = std::isnan(x), yn = std::isnan(y);
    if (xn != yn) return yn;
    if (!xn && x != y) return x > y;
    return a < b;
  };
  const int64_t n = std::min<int64_t>(k, static_cast<int64_t>(keys.size()));
  std::partial_sort(keys.begin(), keys.begin() + n, keys.end(), before);
  std::sort(keys.begin(), keys.begin() + n);
  row->assign(static_cast<size_t>(k), -1);
  for (int64_t i = 0; i < n; ++i) (*row)[static_cast<size_t>(i)] = static_cast<int32_t>(keys[i]);
  return n;
}

// sa_indexer_scores through the public API (options.impl = `impl`) into `scores`.
inline sa_status run_indexer_scores(const GpuIndexerInputs& d, const DeviceTensor& scores,
                                    const sa_indexer_options& options, sa_impl* used) {
  sa_indexer_scores_args a = sa_indexer_scores_args_default();
  a.q_I = d.q_I.view();
  a.k_I = d.k_I.view();
  a.w = d.w.view();
  a.k_start = d.start();
  a.k_end = d.end();
  a.scores = scores.view();
  a.options = options;
  sa_context ctx = sa_context_default();
  ctx.impl_used = used;
  return sa_indexer_scores(&a, &ctx);
}

// The fp64 reference's scores of the same (bf16) values, as fp32 [S_q, S_kv].
inline std::vector<float> reference_scores(IndexerCase& c, const sa_indexer_options& options) {
  HostTensor q64 = to_fp64(c.q_I), k64 = to_fp64(c.k_I);
  HostTensor out(SA_DTYPE_FP32, {c.shape.Sq, c.shape.Skv});
  out.poison();
  sa_indexer_scores_args a = sa_indexer_scores_args_default();
  a.q_I = q64.view();
  a.k_I = k64.view();
  a.w = c.w.view();
  a.k_start = c.has_range ? c.k_start.view() : sa_tensor_none();
  a.k_end = c.has_range ? c.k_end.view() : sa_tensor_none();
  a.scores = out.view();
  a.options = options;
  a.options.impl = SA_IMPL_REFERENCE;
  EXPECT_EQ(sa_indexer_scores(&a, nullptr), SA_OK) << sa_last_error();
  std::vector<float> v(static_cast<size_t>(out.numel()));
  std::memcpy(v.data(), out.data(), v.size() * 4);
  return v;
}

// Options with `impl` forced and `scale_I` (0: 1/sqrt(D_I)).
inline sa_indexer_options indexer_options(sa_impl impl, float scale_I) {
  sa_indexer_options o = sa_indexer_options_default();
  o.scale_I = scale_I;
  o.impl = impl;
  return o;
}

// The largest finite |value| of `v` (at least 1e-30).
inline double max_finite(const std::vector<float>& v) {
  double m = 1e-30;
  for (float x : v)
    if (std::isfinite(x)) m = std::max(m, std::fabs(double(x)));
  return m;
}

// The dense scores of case `c` through the public API with `options` (device copies with rows 8
// elements wider and NaN guards, NaN-poisoned output), as fp32; `want_impl`: the implementation
// that must have run.
inline ::testing::AssertionResult gpu_scores(IndexerCase& c, const sa_indexer_options& options,
                                             sa_impl want_impl, std::vector<float>* result) {
  GpuIndexerInputs d(c, 8);
  HostTensor out(SA_DTYPE_FP32, {c.shape.Sq, c.shape.Skv});
  out.poison();
  DeviceTensor scores(out, 8, 64);
  if (!d.ok() || !scores.ok()) return ::testing::AssertionFailure() << "device copies failed";
  sa_impl used = SA_IMPL_AUTO;
  if (run_indexer_scores(d, scores, options, &used) != SA_OK)
    return ::testing::AssertionFailure() << "sa_indexer_scores: " << sa_last_error();
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess)
    return ::testing::AssertionFailure() << "kernel failed: " << cudaGetErrorString(err);
  if (used != want_impl)
    return ::testing::AssertionFailure() << "ran " << sa_impl_name(used) << ", not "
                                         << sa_impl_name(want_impl);
  ::testing::AssertionResult r = scores.download(out);
  if (!r) return r << " (scores)";
  result->resize(static_cast<size_t>(out.numel()));
  std::memcpy(result->data(), out.data(), result->size() * 4);
  return ::testing::AssertionSuccess();
}


// ---- top-k ------------------------------------------------------------------------------------
// The top-k methods the CUDA paths' tests run each case through (sm80 / sm90 indexer_topk.cu,
// internal tuning): the fused kernel; two passes with the radix select, rows staged in shared
// memory; the same in chunks of 7 query rows; unstaged; two passes with the candidates kernel;
// the same with a candidate list of 3 entries (bins of more keys take the row fallback). All give
// the same selection.
struct TopkMethod {
  const char* name;
  int32_t mode;      // Tuning::{portable,sm90}_indexer_topk
  int32_t rows;      // Tuning::indexer_topk_rows
  int32_t list_cap;  // Tuning::indexer_topk_list_cap
};
inline constexpr TopkMethod kTopkMethods[] = {
    {"fused", 1, 0, 0},
    {"two passes", 2, 0, 0},
    {"two passes, 7 rows", 2, 7, 0},
    {"two passes, unstaged", 3, 0, 0},
    {"two passes, candidates", 4, 0, 0},
    {"two passes, candidates, 5 rows, list of 3", 4, 5, 3}};

// The tuning that selects method m on the sm90 path (hopper) or the portable one.
inline sa::detail::Tuning topk_tuning(const TopkMethod& m, bool hopper) {
  sa::detail::Tuning t;
  (hopper ? t.sm90_indexer_topk : t.portable_indexer_topk) = m.mode;
  t.indexer_topk_rows = m.rows;
  t.indexer_topk_list_cap = m.list_cap;
  return t;
}

struct TopkResult {
  std::vector<int32_t> idx, len;
};

// sa_indexer_topk through the public API with `options` and the queried workspace, full of
// garbage; outputs start as DeviceInts::kUnwritten; `want_impl`: the implementation that must
// have run (sa_context.impl_used).
inline ::testing::AssertionResult gpu_topk(const GpuIndexerInputs& d, const IndexerCase& c,
                                           int64_t k, bool with_length,
                                           const sa_indexer_options& options, sa_impl want_impl,
                                           TopkResult* result) {
  DeviceInts idx(c.shape.Sq * k, 64), len(c.shape.Sq, 16);
  if (!idx.ok() || !len.ok() || !idx.reset() || !len.reset())
    return ::testing::AssertionFailure() << "device outputs failed";
  sa_indexer_topk_args a = sa_indexer_topk_args_default();
  a.q_I = d.q_I.view();
  a.k_I = d.k_I.view();
  a.w = d.w.view();
  a.k_start = d.start();
  a.k_end = d.end();
  a.topk_idx = view_of(idx.get(), SA_DTYPE_INT32, {c.shape.Sq, k}, SA_DEVICE_CUDA);
  a.topk_length =
      with_length ? view_of(len.get(), SA_DTYPE_INT32, {c.shape.Sq}, SA_DEVICE_CUDA)
                  : sa_tensor_none();
  a.options = options;
  size_t bytes = 0;
  if (sa_indexer_topk_workspace_size(&a, &bytes) != SA_OK)
    return ::testing::AssertionFailure() << "workspace size: " << sa_last_error();
  DeviceBuffer ws(bytes);
  if (!ws.ok() || (bytes > 0 && cudaMemset(ws.get(), 0xff, bytes) != cudaSuccess))
    return ::testing::AssertionFailure() << "workspace allocation failed";
  sa_context ctx = sa_context_default();
  ctx.workspace = ws.get();
  ctx.workspace_bytes = bytes;
  sa_impl used = SA_IMPL_AUTO;
  ctx.impl_used = &used;
  if (sa_indexer_topk(&a, &ctx) != SA_OK)
    return ::testing::AssertionFailure() << "sa_indexer_topk: " << sa_last_error();
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess)
    return ::testing::AssertionFailure() << "kernel failed: " << cudaGetErrorString(err);
  if (used != want_impl)
    return ::testing::AssertionFailure() << "ran " << sa_impl_name(used) << ", not "
                                         << sa_impl_name(want_impl);
  ::testing::AssertionResult r = idx.download(&result->idx);
  if (!r) return r << " (topk_idx)";
  if (with_length) {
    r = len.download(&result->len);
    if (!r) return r << " (topk_length)";
  }
  return ::testing::AssertionSuccess();
}

// The check of S = 131072, k 2048, H_I 64, causal (see test_gpu_indexer.cpp) through `options`
// (options.impl names the path; sa_context.impl_used must say `want_impl`).
// max_workspace: the most workspace the call may ask (0: S_q k int32s, the fused kernels' bound).
inline void check_topk_s131072_k2048_causal(const sa_indexer_options& options, sa_impl want_impl,
                                            size_t max_workspace = 0) {
  const int64_t S = 131072, HI = 64, D = 128, k = 2048;
  // Inputs from a cheap hash (1 G bf16 values for q_I): uniform in [-1, 1).
  auto value = [](uint64_t i) {
    uint64_t z = i * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
    z ^= z >> 29;
    return static_cast<float>((z >> 40) * (2.0 / 16777216.0) - 1.0);
  };
  std::vector<uint16_t> q(static_cast<size_t>(S * HI * D)), kk(static_cast<size_t>(S * D));
  for (size_t i = 0; i < q.size(); ++i) q[i] = sa::float_to_bf16_bits(value(i));
  for (size_t i = 0; i < kk.size(); ++i)
    kk[i] = sa::float_to_bf16_bits(value(i + (uint64_t{1} << 40)));
  std::vector<float> w(static_cast<size_t>(S * HI));
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f + value(i + (uint64_t{1} << 41));
  std::vector<int32_t> ends(static_cast<size_t>(S));
  for (int64_t t = 0; t < S; ++t) ends[static_cast<size_t>(t)] = static_cast<int32_t>(t + 1);

  DeviceBuffer dq(q.size() * 2), dk(kk.size() * 2), dw(w.size() * 4), dend(ends.size() * 4),
      didx(static_cast<size_t>(S * k) * 4), dlen(static_cast<size_t>(S) * 4);
  for (const DeviceBuffer* b : {&dq, &dk, &dw, &dend, &didx, &dlen}) ASSERT_TRUE(b->ok());
  ASSERT_EQ(cudaMemcpy(dq.get(), q.data(), dq.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dk.get(), kk.data(), dk.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dw.get(), w.data(), dw.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dend.get(), ends.data(), dend.bytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemset(didx.get(), 0xab, didx.bytes()), cudaSuccess);
  sa_indexer_topk_args a = sa_indexer_topk_args_default();
  a.q_I = view_of(dq.get(), SA_DTYPE_BF16, {S, HI, D}, SA_DEVICE_CUDA);
  a.k_I = view_of(dk.get(), SA_DTYPE_BF16, {S, D}, SA_DEVICE_CUDA);
  a.w = view_of(dw.get(), SA_DTYPE_FP32, {S, HI}, SA_DEVICE_CUDA);
  a.k_start = sa_tensor_none();
  a.k_end = view_of(dend.get(), SA_DTYPE_INT32, {S}, SA_DEVICE_CUDA);
  a.topk_idx = view_of(didx.get(), SA_DTYPE_INT32, {S, k}, SA_DEVICE_CUDA);
  a.topk_length = view_of(dlen.get(), SA_DTYPE_INT32, {S}, SA_DEVICE_CUDA);
  a.options = options;
  size_t bytes = 0;
  ASSERT_EQ(sa_indexer_topk_workspace_size(&a, &bytes), SA_OK) << sa_last_error();
  EXPECT_LE(bytes, max_workspace > 0 ? max_workspace : static_cast<size_t>(S * k) * 4)
      << "workspace beyond its bound";
  DeviceBuffer ws(bytes);
  ASSERT_TRUE(ws.ok());
  sa_context ctx = sa_context_default();
  ctx.workspace = ws.get();
  ctx.workspace_bytes = bytes;
  sa_impl used = SA_IMPL_AUTO;
  ctx.impl_used = &used;
  ASSERT_EQ(sa_indexer_topk(&a, &ctx), SA_OK) << sa_last_error();
  ASSERT_EQ(used, want_impl) << "ran " << sa_impl_name(used);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<int32_t> idx(static_cast<size_t>(S * k)), len(static_cast<size_t>(S));
  ASSERT_EQ(cudaMemcpy(idx.data(), didx.get(), didx.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(len.data(), dlen.get(), dlen.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int64_t t = 0; t < S; ++t) {
    const int32_t* row = idx.data() + t * k;
    const int64_t n = std::min<int64_t>(k, t + 1);
    ASSERT_EQ(len[static_cast<size_t>(t)], n) << "topk_length of row " << t;
    for (int64_t i = 0; i < k; ++i) {
      if (i < n) {
        ASSERT_TRUE(row[i] >= 0 && row[i] <= t && (i == 0 || row[i] > row[i - 1]))
            << "row " << t << " slot " << i << ": " << row[i];
      } else {
        ASSERT_EQ(row[i], -1) << "row " << t << " slot " << i;
      }
    }
  }
  // Sample rows against fp64 scores of the same values.
  const float scale_I = static_cast<float>(1.0 / std::sqrt(double(D)));
  for (int64_t t : {int64_t{2047}, int64_t{70000}, S - 1}) {
    std::vector<double> sc(static_cast<size_t>(t + 1));
    double maxabs = 1e-30;
    for (int64_t s = 0; s <= t; ++s) {
      double total = 0.0;
      for (int64_t j = 0; j < HI; ++j) {
        double dot = 0.0;
        for (int64_t x = 0; x < D; ++x)
          dot += double(sa::bf16_bits_to_float(q[static_cast<size_t>((t * HI + j) * D + x)])) *
                 double(sa::bf16_bits_to_float(kk[static_cast<size_t>(s * D + x)]));
        total += double(w[static_cast<size_t>(t * HI + j)]) * std::max(0.0, scale_I * dot);
      }
      sc[static_cast<size_t>(s)] = total;
      maxabs = std::max(maxabs, std::fabs(total));
    }
    std::vector<double> sorted(sc);
    const int64_t n = std::min<int64_t>(k, t + 1);
    std::nth_element(sorted.begin(), sorted.begin() + (n - 1), sorted.end(),
                     std::greater<double>());
    const double kth = sorted[static_cast<size_t>(n - 1)];
    for (int64_t i = 0; i < n; ++i)
      ASSERT_GE(sc[static_cast<size_t>(idx[static_cast<size_t>(t * k + i)])], kth - 2e-4 * maxabs)
          << "row " << t << " slot " << i;
  }
}

}  // namespace sa_test
