// Test-only helpers for DeepSeek sparse attention (SPEC 2): shapes, contiguous host tensors of one
// case, metadata with the sparse edge cases planted on purpose, and the validated-problem structs
// built by hand (so tests can call an implementation without the public API).
//
//   DsaShape shape{/*Sq*/ 6, /*Skv*/ 16, /*H*/ 2, /*Dqk*/ 12, /*Dv*/ 8, /*topk*/ 6};
//   DsaMetaSpec spec;  spec.lengths = DsaLengths::kMixed;  spec.sink = DsaSink::kFinite;
//   DsaHostCase c = make_dsa_host_case(shape, spec, SA_DTYPE_FP64, /*seed*/ 1);
//   sa::reference::dsa_forward(c.fwd_problem());
//   if (c.slot_active(t, i)) ...   // SPEC 2's rule, written independently of DsaMeta::active
//
// Header-only; GPU tests reuse it: copy the host tensors to the device, fill a DsaPointers with
// the device addresses and call make_dsa_fwd_problem / make_dsa_bwd_problem with SA_DEVICE_CUDA.
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

namespace sa_test {

// ---- shape -----------------------------------------------------------------------------------
struct DsaShape {
  int64_t Sq = 6, Skv = 16, H = 2, Dqk = 12, Dv = 8, topk = 6;

  sa::DsaDims dims() const {
    sa::DsaDims d;
    d.Sq = Sq;
    d.Skv = Skv;
    d.H = H;
    d.Dqk = Dqk;
    d.Dv = Dv;
    d.topk = topk;
    return d;
  }
};

inline float dsa_default_scale(int64_t Dqk) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dqk)));
}

// ---- problems over contiguous tensors (host or device addresses) -----------------------------
struct DsaPointers {
  const void* q = nullptr;               // [Sq, H, Dqk]
  const void* kv = nullptr;              // [Skv, Dqk]
  const int32_t* topk_idx = nullptr;     // [Sq, topk]
  const int32_t* topk_length = nullptr;  // [Sq]; may be null
  const float* sink = nullptr;           // [H]; may be null
  void* out = nullptr;                   // [Sq, H, Dv]: forward output, backward input
  float* lse = nullptr;                  // [Sq, H]: forward output, backward input
  const void* dout = nullptr;            // [Sq, H, Dv]
  void* dq = nullptr;                    // [Sq, H, Dqk]
  void* dkv = nullptr;                   // [Skv, Dqk]
  float* d_sink = nullptr;               // [H]; may be null
};

inline sa::Shd dsa_shd3(const void* data, int64_t H, int64_t D) {  // contiguous [S, H, D]
  sa::Shd v;
  v.data = const_cast<void*>(data);
  v.ss = H * D;
  v.sh = D;
  v.sd = 1;
  return v;
}

inline sa::Shd dsa_shd2(const void* data, int64_t D) {  // contiguous [S, D]
  sa::Shd v;
  v.data = const_cast<void*>(data);
  v.ss = D;
  v.sh = 0;
  v.sd = 1;
  return v;
}

inline sa::DsaMeta make_dsa_meta(const DsaShape& s, const DsaPointers& p) {
  sa::DsaMeta m;
  m.topk_idx.data = p.topk_idx;
  m.topk_idx.stride[0] = s.topk;
  m.topk_idx.stride[1] = 1;
  m.topk_length.data = p.topk_length;
  m.topk_length.stride[0] = 1;
  m.sink = p.sink;
  m.sink_stride = 1;
  return m;
}

inline sa_dsa_options make_dsa_options(const DsaShape& s, float scale) {
  sa_dsa_options o{};
  o.scale = scale;
  o.d_v = static_cast<int32_t>(s.Dv);
  o.deterministic = 0;
  o.impl = SA_IMPL_AUTO;
  return o;
}

inline sa::DsaFwdProblem make_dsa_fwd_problem(const DsaShape& s, sa_dtype dtype, float scale,
                                              const DsaPointers& p,
                                              sa_device_type device = SA_DEVICE_CPU,
                                              int32_t device_index = 0) {
  sa::DsaFwdProblem f;
  f.dims = s.dims();
  f.dtype = dtype;
  f.device = device;
  f.device_index = device_index;
  f.scale = scale;
  f.options = make_dsa_options(s, scale);
  f.meta = make_dsa_meta(s, p);
  f.q = dsa_shd3(p.q, s.H, s.Dqk);
  f.kv = dsa_shd2(p.kv, s.Dqk);
  f.out = dsa_shd3(p.out, s.H, s.Dv);
  f.lse = p.lse;
  f.lse_stride[0] = s.H;
  f.lse_stride[1] = 1;
  return f;
}

inline sa::DsaBwdProblem make_dsa_bwd_problem(const DsaShape& s, sa_dtype dtype, float scale,
                                              const DsaPointers& p,
                                              sa_device_type device = SA_DEVICE_CPU,
                                              int32_t device_index = 0) {
  sa::DsaBwdProblem b;
  b.dims = s.dims();
  b.dtype = dtype;
  b.device = device;
  b.device_index = device_index;
  b.scale = scale;
  b.options = make_dsa_options(s, scale);
  b.meta = make_dsa_meta(s, p);
  b.q = dsa_shd3(p.q, s.H, s.Dqk);
  b.kv = dsa_shd2(p.kv, s.Dqk);
  b.out = dsa_shd3(p.out, s.H, s.Dv);
  b.dout = dsa_shd3(p.dout, s.H, s.Dv);
  b.dq = dsa_shd3(p.dq, s.H, s.Dqk);
  b.dkv = dsa_shd2(p.dkv, s.Dqk);
  b.lse = p.lse;
  b.lse_stride[0] = s.H;
  b.lse_stride[1] = 1;
  b.d_sink = p.d_sink;
  b.d_sink_stride = 1;
  return b;
}

// ---- metadata edge cases ---------------------------------------------------------------------
enum class DsaSink {
  kNone,    // no sink tensor
  kFinite,  // per head in [-2, 3], multiples of 2^-10
  kLarge,   // per head in [20, 30]: finite, but takes almost all of the softmax
  kPosInf,  // +inf: out = 0
  kNegInf,  // -inf: as if no sink
  kHuge,    // 2.4e38 (finite in fp32): behaves like +inf
  kMixed    // head h: finite, +inf, -inf, huge, large, in turn
};

enum class DsaLengths {
  kNone,  // no topk_length tensor: every slot with a valid index is active
  kMixed  // row 0: 0, row 1: -3, row 2: topk + 5 (clamped), rows 66, 133, 200, ...: 0, others
          // uniform in [1, topk]
};

struct DsaMetaSpec {
  DsaLengths lengths = DsaLengths::kNone;
  // -1, Skv, INT32_MAX, INT32_MIN over the slots: one at least inside the active prefix of every
  // non-empty row, and the last row (when Sq > 3) made of invalid indices only.
  bool invalid = false;
  // Indices drawn with replacement, and the first two active slots of every row made equal.
  // Without it, rows hold distinct keys (then -1 for the slots past Skv when topk > Skv).
  bool duplicates = false;
  DsaSink sink = DsaSink::kNone;
};

inline float dsa_sink_value(DsaSink kind, int64_t h, std::mt19937_64& rng) {
  auto quantized = [&](double lo, double hi) {
    std::uniform_real_distribution<double> u(lo, hi);
    return static_cast<float>(std::round(u(rng) * 1024.0) / 1024.0);
  };
  switch (kind) {
    case DsaSink::kNone:
    case DsaSink::kNegInf: return -std::numeric_limits<float>::infinity();
    case DsaSink::kFinite: return quantized(-2.0, 3.0);
    case DsaSink::kLarge: return quantized(20.0, 30.0);
    case DsaSink::kPosInf: return std::numeric_limits<float>::infinity();
    case DsaSink::kHuge: return 2.4e38f;
    case DsaSink::kMixed: {
      const DsaSink cycle[5] = {DsaSink::kFinite, DsaSink::kPosInf, DsaSink::kNegInf,
                                DsaSink::kHuge, DsaSink::kLarge};
      return dsa_sink_value(cycle[h % 5], h, rng);
    }
  }
  return 0.f;
}

// ---- host tensors of one case ----------------------------------------------------------------
struct DsaHostCase {
  DsaShape shape;
  sa_dtype dtype = SA_DTYPE_FP64;  // of q, kv, out, dout, dq, dkv
  float scale = 0.f;
  bool has_length = false, has_sink = false;
  HostTensor q, kv;                      // random in [-1, 1]
  HostTensor topk_idx, topk_length;      // int32
  HostTensor sink;                       // fp32 [H]
  HostTensor dout;                       // random in [-1, 1]
  HostTensor out, lse, dq, dkv, d_sink;  // outputs, poisoned with NaN

  DsaPointers pointers() {
    DsaPointers p;
    p.q = q.data();
    p.kv = kv.data();
    p.topk_idx = topk_idx.i32();
    p.topk_length = has_length ? topk_length.i32() : nullptr;
    p.sink = has_sink ? static_cast<const float*>(sink.data()) : nullptr;
    p.out = out.data();
    p.lse = static_cast<float*>(lse.data());
    p.dout = dout.data();
    p.dq = dq.data();
    p.dkv = dkv.data();
    p.d_sink = static_cast<float*>(d_sink.data());
    return p;
  }
  sa::DsaFwdProblem fwd_problem() { return make_dsa_fwd_problem(shape, dtype, scale, pointers()); }
  sa::DsaBwdProblem bwd_problem() { return make_dsa_bwd_problem(shape, dtype, scale, pointers()); }

  // SPEC 2, written here without DsaMeta::active: slots [0, row_length(t)) are read, and of
  // those, the ones with an index in [0, Skv) are active.
  int64_t row_length(int64_t t) const {
    if (!has_length) return shape.topk;
    const int64_t len = topk_length.i32()[t];
    return std::min<int64_t>(std::max<int64_t>(len, 0), shape.topk);
  }
  int32_t index(int64_t t, int64_t i) const { return topk_idx.i32()[t * shape.topk + i]; }
  bool slot_active(int64_t t, int64_t i) const {
    const int64_t j = index(t, i);
    return i < row_length(t) && j >= 0 && j < shape.Skv;
  }
  bool row_empty(int64_t t) const {
    for (int64_t i = 0; i < shape.topk; ++i)
      if (slot_active(t, i)) return false;
    return true;
  }
  // selected[j]: some active slot of some row holds j.
  std::vector<bool> selected_keys() const {
    std::vector<bool> sel(static_cast<size_t>(shape.Skv), false);
    for (int64_t t = 0; t < shape.Sq; ++t)
      for (int64_t i = 0; i < shape.topk; ++i)
        if (slot_active(t, i)) sel[static_cast<size_t>(index(t, i))] = true;
    return sel;
  }
  double sink_at(int64_t h) const {
    return has_sink ? sink.get(h) : -std::numeric_limits<double>::infinity();
  }
};

inline void fill_dsa_metadata(DsaHostCase& c, const DsaMetaSpec& spec, std::mt19937_64& rng) {
  const DsaShape& s = c.shape;
  c.has_length = spec.lengths == DsaLengths::kMixed;
  c.topk_idx = HostTensor(SA_DTYPE_INT32, {s.Sq, s.topk});
  c.topk_length = HostTensor(SA_DTYPE_INT32, {s.Sq});
  const int32_t bad[4] = {-1, static_cast<int32_t>(s.Skv), std::numeric_limits<int32_t>::max(),
                          std::numeric_limits<int32_t>::min()};
  std::uniform_int_distribution<int32_t> key(0, static_cast<int32_t>(s.Skv - 1));
  std::uniform_real_distribution<double> u01(0.0, 1.0);

  for (int64_t t = 0; t < s.Sq; ++t) {
    if (c.has_length) {
      int32_t len = std::uniform_int_distribution<int32_t>(1, static_cast<int32_t>(s.topk))(rng);
      if (t == 0) len = 0;
      if (t == 1) len = -3;
      if (t == 2) len = static_cast<int32_t>(s.topk + 5);
      if (t % 67 == 66) len = 0;  // empty rows far into long problems too
      c.topk_length.i32()[t] = len;
    }
    int32_t* row = c.topk_idx.i32() + t * s.topk;
    if (spec.duplicates) {
      for (int64_t i = 0; i < s.topk; ++i) row[i] = key(rng);
    } else {
      std::vector<int32_t> perm(static_cast<size_t>(s.Skv));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t i = 0; i < s.topk; ++i) row[i] = i < s.Skv ? perm[static_cast<size_t>(i)] : -1;
    }
    if (spec.invalid) {
      for (int64_t i = 0; i < s.topk; ++i)
        if (u01(rng) < 0.2) row[i] = bad[rng() % 4];
      const int64_t len = c.row_length(t);
      if (len > 0) row[t % len] = bad[t % 4];
      if (t == s.Sq - 1 && s.Sq > 3)
        for (int64_t i = 0; i < s.topk; ++i) row[i] = bad[i % 4];
    }
    if (spec.duplicates) {
      int64_t first = -1;
      for (int64_t i = 0; i < s.topk; ++i) {
        if (!c.slot_active(t, i)) continue;
        if (first < 0) {
          first = i;
        } else {
          row[i] = row[first];
          break;
        }
      }
    }
  }

  c.has_sink = spec.sink != DsaSink::kNone;
  c.sink = HostTensor(SA_DTYPE_FP32, {s.H});
  for (int64_t h = 0; h < s.H; ++h) c.sink.set(h, dsa_sink_value(spec.sink, h, rng));
}

// Random inputs, metadata per `spec`, outputs poisoned with NaN. scale 0 means 1/sqrt(Dqk).
inline DsaHostCase make_dsa_host_case(const DsaShape& shape, const DsaMetaSpec& spec,
                                      sa_dtype dtype, uint64_t seed, float scale = 0.f) {
  std::mt19937_64 rng(seed);
  DsaHostCase c;
  c.shape = shape;
  c.dtype = dtype;
  c.scale = scale != 0.f ? scale : dsa_default_scale(shape.Dqk);
  c.q = HostTensor(dtype, {shape.Sq, shape.H, shape.Dqk});
  c.kv = HostTensor(dtype, {shape.Skv, shape.Dqk});
  c.dout = HostTensor(dtype, {shape.Sq, shape.H, shape.Dv});
  c.q.fill_uniform(rng);
  c.kv.fill_uniform(rng);
  c.dout.fill_uniform(rng);
  fill_dsa_metadata(c, spec, rng);
  c.out = HostTensor(dtype, {shape.Sq, shape.H, shape.Dv});
  c.lse = HostTensor(SA_DTYPE_FP32, {shape.Sq, shape.H});
  c.dq = HostTensor(dtype, {shape.Sq, shape.H, shape.Dqk});
  c.dkv = HostTensor(dtype, {shape.Skv, shape.Dqk});
  c.d_sink = HostTensor(SA_DTYPE_FP32, {shape.H});
  for (HostTensor* t : {&c.out, &c.lse, &c.dq, &c.dkv, &c.d_sink}) t->poison();
  return c;
}

}  // namespace sa_test
