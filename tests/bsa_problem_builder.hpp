// Test-only helpers for block-sparse attention (SPEC 1): shapes, random sparsity patterns, host
// tensors in either layout, validated-problem structs built by hand (so tests can call an
// implementation without the public API), and an independent dense oracle that runs plain
// softmax attention under the densified [S_q, S_kv] mask.
//
//   BsaShape shape;  shape.Hq = 4;  shape.Hkv = 2;  ...
//   std::mt19937_64 rng(1);
//   BsaPattern pat = random_bsa_pattern(shape, BsaPatternSpec{}, rng);
//   BsaTensors t = make_bsa_tensors(shape, SA_DTYPE_FP64, rng);
//   sa::BsaFwdProblem p = make_bsa_fwd_problem(shape, SA_DTYPE_FP64, pat, t);
//   DenseAttention want = dense_masked_attention(shape, pat, t, p.scale);
//
// Header-only; GPU tests reuse it (copy the host tensors to the device and swap the pointers).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/problem.hpp"
#include "test_util.hpp"
#include "testing/bhsd_layout.hpp"

namespace sa_test {

// ---- shape -----------------------------------------------------------------------------------
struct BsaShape {
  int64_t B = 1, Hq = 2, Hkv = 2, Sq = 128, Skv = 128, D = 16, Dv = 16;
  int32_t block = 64;
  int64_t Kmax = 2;
  sa_layout layout = SA_LAYOUT_BHSD;

  int64_t Nq() const { return (Sq + block - 1) / block; }
  int64_t Nkv() const { return (Skv + block - 1) / block; }
  int64_t group() const { return Hq / Hkv; }
  sa::BsaDims dims() const {
    sa::BsaDims d;
    d.B = B;
    d.Hq = Hq;
    d.Hkv = Hkv;
    d.Sq = Sq;
    d.Skv = Skv;
    d.D = D;
    d.Dv = Dv;
    d.block = block;
    d.Nq = Nq();
    d.Nkv = Nkv();
    d.Kmax = Kmax;
    return d;
  }
};

// Layout helpers (testing/bhsd_layout.hpp): bsa_physical_shape, bsa_index, bhsd_doubles.
using sa_testing::bhsd_doubles;
using sa_testing::bsa_index;
using sa_testing::bsa_physical_shape;

// BHSD-ordered strides of a contiguous host tensor stored in `layout`.
inline sa::Bhsd bhsd_view(HostTensor& t, sa_layout layout) {
  const std::vector<int64_t>& s = t.shape();
  sa::Bhsd v;
  v.data = t.data();
  v.sd = 1;
  if (layout == SA_LAYOUT_BSHD) {  // [B, S, H, X]
    v.sh = s[3];
    v.ss = s[2] * s[3];
    v.sb = s[1] * s[2] * s[3];
  } else {  // [B, H, S, X]
    v.ss = s[3];
    v.sh = s[2] * s[3];
    v.sb = s[1] * s[2] * s[3];
  }
  return v;
}

// ---- sparsity pattern ------------------------------------------------------------------------
struct BsaPatternSpec {
  bool per_row_count = true;       // give q2k_count; otherwise one count for every row
  int32_t fixed_count = -1;        // the count when !per_row_count; -1 means Kmax
  bool empty_rows = false;         // (per-row counts) some rows list no block; row (0,0,0) is one
  int64_t unattended_block = -1;   // a KV block that no row lists; -1: none forced
  bool kv_block_len = false;       // give kv_block_len, KV block 0 partial, others random
  bool kv_block_len_per_batch = false;  // [B, Nkv] rather than [Nkv]
};

struct BsaPattern {
  HostTensor q2k_index;      // [B, Hq, Nq, Kmax] int32; slots past a row's count hold garbage
  HostTensor q2k_count;      // [B, Hq, Nq] int32, when has_count
  bool has_count = false;
  int32_t fixed_count = 0;   // the count of every row when !has_count
  HostTensor kv_block_len;   // [Nkv] or [B, Nkv] int32, when has_block_len
  bool has_block_len = false;

  int32_t count(int64_t b, int64_t h, int64_t m) const {
    if (!has_count) return fixed_count;
    const std::vector<int64_t>& s = q2k_count.shape();
    return q2k_count.i32()[(b * s[1] + h) * s[2] + m];
  }
  int32_t& index(int64_t b, int64_t h, int64_t m, int64_t slot) {
    const std::vector<int64_t>& s = q2k_index.shape();
    return q2k_index.i32()[((b * s[1] + h) * s[2] + m) * s[3] + slot];
  }
  int32_t index(int64_t b, int64_t h, int64_t m, int64_t slot) const {
    const std::vector<int64_t>& s = q2k_index.shape();
    return q2k_index.i32()[((b * s[1] + h) * s[2] + m) * s[3] + slot];
  }
  // Valid keys of KV block n of batch b (SPEC default: full blocks, the last one cut at Skv).
  int64_t block_len(const BsaShape& shape, int64_t b, int64_t n) const {
    if (has_block_len) {
      const bool per_batch = kv_block_len.shape().size() == 2;
      return kv_block_len.i32()[per_batch ? b * shape.Nkv() + n : n];
    }
    return std::min<int64_t>(shape.block, shape.Skv - n * shape.block);
  }
  bool has_empty_row(const BsaShape& shape) const {
    for (int64_t b = 0; b < shape.B; ++b)
      for (int64_t h = 0; h < shape.Hq; ++h)
        for (int64_t m = 0; m < shape.Nq(); ++m)
          if (count(b, h, m) == 0) return true;
    return false;
  }

  // Views for a validated problem (they point into this pattern's tensors).
  sa::BsaMeta meta() const {
    sa::BsaMeta meta;
    const std::vector<int64_t>& is = q2k_index.shape();
    meta.q2k_index.data = q2k_index.i32();
    meta.q2k_index.stride[0] = is[1] * is[2] * is[3];
    meta.q2k_index.stride[1] = is[2] * is[3];
    meta.q2k_index.stride[2] = is[3];
    meta.q2k_index.stride[3] = 1;
    if (has_count) {
      const std::vector<int64_t>& cs = q2k_count.shape();
      meta.q2k_count.data = q2k_count.i32();
      meta.q2k_count.stride[0] = cs[1] * cs[2];
      meta.q2k_count.stride[1] = cs[2];
      meta.q2k_count.stride[2] = 1;
    }
    meta.fixed_count = fixed_count;
    if (has_block_len) {
      const bool per_batch = kv_block_len.shape().size() == 2;
      meta.kv_block_len.data = kv_block_len.i32();
      meta.kv_block_len.stride[0] = per_batch ? kv_block_len.shape()[1] : 0;
      meta.kv_block_len.stride[1] = 1;
    }
    return meta;
  }
  // CPU views for the public API (options.count must be fixed_count when !has_count).
  sa_bsa_sparsity sparsity() {
    sa_bsa_sparsity s{q2k_index.view(), sa_tensor_none(), sa_tensor_none()};
    if (has_count) s.q2k_count = q2k_count.view();
    if (has_block_len) s.kv_block_len = kv_block_len.view();
    return s;
  }
};

// A random pattern: each row lists distinct blocks in random order; slots past the count hold
// out-of-range garbage (only the prefix may be read).
inline BsaPattern random_bsa_pattern(const BsaShape& shape, const BsaPatternSpec& spec,
                                     std::mt19937_64& rng) {
  const int64_t Nq = shape.Nq(), Nkv = shape.Nkv(), Kmax = shape.Kmax;
  BsaPattern p;
  p.q2k_index = HostTensor(SA_DTYPE_INT32, {shape.B, shape.Hq, Nq, Kmax});
  p.has_count = spec.per_row_count;
  p.fixed_count = static_cast<int32_t>(spec.fixed_count < 0 ? Kmax : spec.fixed_count);
  if (p.has_count) p.q2k_count = HostTensor(SA_DTYPE_INT32, {shape.B, shape.Hq, Nq});

  std::vector<int32_t> candidates;
  for (int32_t n = 0; n < Nkv; ++n)
    if (n != spec.unattended_block) candidates.push_back(n);
  const int64_t most = std::min<int64_t>(Kmax, static_cast<int64_t>(candidates.size()));
  if (!p.has_count && p.fixed_count > most) {
    ADD_FAILURE() << "random_bsa_pattern: fixed count " << p.fixed_count << " > " << most
                  << " distinct blocks";
    p.fixed_count = static_cast<int32_t>(most);
  }

  std::uniform_int_distribution<int64_t> count_dist(0, most);
  std::uniform_int_distribution<int> quarter(0, 3);
  for (int64_t b = 0; b < shape.B; ++b) {
    for (int64_t h = 0; h < shape.Hq; ++h) {
      for (int64_t m = 0; m < Nq; ++m) {
        int64_t c = p.fixed_count;
        if (p.has_count) {
          c = count_dist(rng);
          if (spec.empty_rows && (quarter(rng) == 0 || (b == 0 && h == 0 && m == 0))) c = 0;
          if (!spec.empty_rows && c == 0) c = most;  // empty rows only where asked for
          p.q2k_count.i32()[(b * shape.Hq + h) * Nq + m] = static_cast<int32_t>(c);
        }
        std::shuffle(candidates.begin(), candidates.end(), rng);
        for (int64_t slot = 0; slot < Kmax; ++slot)
          p.index(b, h, m, slot) =
              slot < c ? candidates[static_cast<size_t>(slot)] : static_cast<int32_t>(Nkv + 7);
      }
    }
  }

  if (spec.kv_block_len) {
    p.has_block_len = true;
    const int64_t rows = spec.kv_block_len_per_batch ? shape.B : 1;
    p.kv_block_len = spec.kv_block_len_per_batch ? HostTensor(SA_DTYPE_INT32, {shape.B, Nkv})
                                                 : HostTensor(SA_DTYPE_INT32, {Nkv});
    std::uniform_int_distribution<int32_t> len_dist(1, shape.block);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t n = 0; n < Nkv; ++n) {
        int32_t len = quarter(rng) == 0 ? shape.block : len_dist(rng);
        if (n == 0) len = shape.block - 5 - static_cast<int32_t>(r);  // always a partial block
        p.kv_block_len.i32()[r * Nkv + n] = len;
      }
    }
  }
  return p;
}

// ---- tensors ---------------------------------------------------------------------------------
struct BsaTensors {
  HostTensor q, k, v;     // inputs, random in [-1, 1]
  HostTensor o, lse;      // forward outputs, poisoned with NaN
  HostTensor dout;        // random in [-1, 1]
  HostTensor dq, dk, dv;  // backward outputs, poisoned with NaN
};

inline BsaTensors make_bsa_tensors(const BsaShape& s, sa_dtype dtype, std::mt19937_64& rng) {
  BsaTensors t;
  t.q = HostTensor(dtype, bsa_physical_shape(s.layout, s.B, s.Hq, s.Sq, s.D));
  t.k = HostTensor(dtype, bsa_physical_shape(s.layout, s.B, s.Hkv, s.Skv, s.D));
  t.v = HostTensor(dtype, bsa_physical_shape(s.layout, s.B, s.Hkv, s.Skv, s.Dv));
  t.o = HostTensor(dtype, bsa_physical_shape(s.layout, s.B, s.Hq, s.Sq, s.Dv));
  t.lse = HostTensor(SA_DTYPE_FP32, {s.B, s.Hq, s.Sq});
  t.dout = HostTensor(dtype, bsa_physical_shape(s.layout, s.B, s.Hq, s.Sq, s.Dv));
  t.dq = HostTensor(dtype, t.q.shape());
  t.dk = HostTensor(dtype, t.k.shape());
  t.dv = HostTensor(dtype, t.v.shape());
  t.q.fill_uniform(rng);
  t.k.fill_uniform(rng);
  t.v.fill_uniform(rng);
  t.dout.fill_uniform(rng);
  t.o.poison();
  t.lse.poison();
  t.dq.poison();
  t.dk.poison();
  t.dv.poison();
  return t;
}

// ---- validated problems, built by hand -------------------------------------------------------
inline float default_scale(const BsaShape& s) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.D)));
}

inline sa::BsaFwdProblem make_bsa_fwd_problem(const BsaShape& s, sa_dtype dtype,
                                              const BsaPattern& pat, BsaTensors& t,
                                              float scale = 0.f) {
  sa::BsaFwdProblem p;
  p.dims = s.dims();
  p.dtype = dtype;
  p.device = SA_DEVICE_CPU;
  p.scale = scale != 0.f ? scale : default_scale(s);
  p.options = sa_bsa_options{};
  p.options.scale = p.scale;
  p.options.layout = s.layout;
  p.options.block_size = s.block;
  p.options.count = pat.has_count ? -1 : pat.fixed_count;
  p.options.impl = SA_IMPL_REFERENCE;
  p.meta = pat.meta();
  p.q = bhsd_view(t.q, s.layout);
  p.k = bhsd_view(t.k, s.layout);
  p.v = bhsd_view(t.v, s.layout);
  p.o = bhsd_view(t.o, s.layout);
  p.lse = static_cast<float*>(t.lse.data());
  p.lse_stride[0] = s.Hq * s.Sq;
  p.lse_stride[1] = s.Sq;
  p.lse_stride[2] = 1;
  return p;
}

inline sa::BsaBwdProblem make_bsa_bwd_problem(const BsaShape& s, sa_dtype dtype,
                                              const BsaPattern& pat, BsaTensors& t,
                                              float scale = 0.f) {
  sa::BsaBwdProblem p;
  p.dims = s.dims();
  p.dtype = dtype;
  p.device = SA_DEVICE_CPU;
  p.scale = scale != 0.f ? scale : default_scale(s);
  p.options = sa_bsa_options{};
  p.options.scale = p.scale;
  p.options.layout = s.layout;
  p.options.block_size = s.block;
  p.options.count = pat.has_count ? -1 : pat.fixed_count;
  p.options.impl = SA_IMPL_REFERENCE;
  p.meta = pat.meta();
  p.q = bhsd_view(t.q, s.layout);
  p.k = bhsd_view(t.k, s.layout);
  p.v = bhsd_view(t.v, s.layout);
  p.o = bhsd_view(t.o, s.layout);
  p.dout = bhsd_view(t.dout, s.layout);
  p.dq = bhsd_view(t.dq, s.layout);
  p.dk = bhsd_view(t.dk, s.layout);
  p.dv = bhsd_view(t.dv, s.layout);
  p.lse = static_cast<const float*>(t.lse.data());
  p.lse_stride[0] = s.Hq * s.Sq;
  p.lse_stride[1] = s.Sq;
  p.lse_stride[2] = 1;
  return p;
}

// ---- dense oracle ----------------------------------------------------------------------------
// The densified mask of (b, h): mask[i * Skv + j] is 1 iff query token i attends key j, i.e. key
// j lies in a block listed for block i / bs and within that block's valid length.
inline std::vector<uint8_t> dense_bsa_mask(const BsaShape& s, const BsaPattern& pat, int64_t b,
                                           int64_t h) {
  std::vector<uint8_t> mask(static_cast<size_t>(s.Sq * s.Skv), 0);
  for (int64_t i = 0; i < s.Sq; ++i) {
    const int64_t m = i / s.block;
    for (int64_t slot = 0; slot < pat.count(b, h, m); ++slot) {
      const int64_t n = pat.index(b, h, m, slot);
      for (int64_t j = 0; j < s.Skv; ++j)
        if (j / s.block == n && j % s.block < pat.block_len(s, b, n))
          mask[static_cast<size_t>(i * s.Skv + j)] = 1;
    }
  }
  return mask;
}

struct DenseAttention {
  std::vector<double> o;    // [B, Hq, Sq, Dv] (logical order)
  std::vector<double> lse;  // [B, Hq, Sq]; -inf for a row with no key
};

// Plain masked softmax attention in double over the densified mask.
inline DenseAttention dense_masked_attention(const BsaShape& s, const BsaPattern& pat,
                                             const BsaTensors& t, float scale) {
  const std::vector<double> q = bhsd_doubles(t.q, s.layout);
  const std::vector<double> k = bhsd_doubles(t.k, s.layout);
  const std::vector<double> v = bhsd_doubles(t.v, s.layout);
  DenseAttention out;
  out.o.assign(static_cast<size_t>(s.B * s.Hq * s.Sq * s.Dv), 0.0);
  out.lse.assign(static_cast<size_t>(s.B * s.Hq * s.Sq), -INFINITY);
  std::vector<double> logits(static_cast<size_t>(s.Skv));
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.Hq; ++h) {
      const int64_t hk = h / s.group();
      const std::vector<uint8_t> mask = dense_bsa_mask(s, pat, b, h);
      for (int64_t i = 0; i < s.Sq; ++i) {
        const double* qi = &q[static_cast<size_t>(((b * s.Hq + h) * s.Sq + i) * s.D)];
        double mx = -INFINITY;
        for (int64_t j = 0; j < s.Skv; ++j) {
          double& l = logits[static_cast<size_t>(j)];
          l = -INFINITY;
          if (!mask[static_cast<size_t>(i * s.Skv + j)]) continue;
          const double* kj = &k[static_cast<size_t>(((b * s.Hkv + hk) * s.Skv + j) * s.D)];
          double dot = 0.0;
          for (int64_t x = 0; x < s.D; ++x) dot += qi[x] * kj[x];
          l = static_cast<double>(scale) * dot;
          mx = std::max(mx, l);
        }
        if (mx == -INFINITY) continue;  // no key: o = 0, lse = -inf
        double sum = 0.0;
        for (double l : logits) sum += std::exp(l - mx);  // exp(-inf) = 0
        const double lse = mx + std::log(sum);
        out.lse[static_cast<size_t>((b * s.Hq + h) * s.Sq + i)] = lse;
        double* oi = &out.o[static_cast<size_t>(((b * s.Hq + h) * s.Sq + i) * s.Dv)];
        for (int64_t j = 0; j < s.Skv; ++j) {
          const double pj = std::exp(logits[static_cast<size_t>(j)] - lse);
          if (pj == 0.0) continue;
          const double* vj = &v[static_cast<size_t>(((b * s.Hkv + hk) * s.Skv + j) * s.Dv)];
          for (int64_t x = 0; x < s.Dv; ++x) oi[x] += pj * vj[x];
        }
      }
    }
  }
  return out;
}

}  // namespace sa_test
