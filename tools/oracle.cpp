#include "oracle.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

namespace sa_tool {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double dot(const double* a, const double* b, int64_t n) {
  double acc = 0.0;
  for (int64_t c = 0; c < n; ++c) acc += a[c] * b[c];
  return acc;
}

// log(exp(a) + exp(b)) for any a, b in [-inf, +inf].
double log_add_exp(double a, double b) {
  if (a == -kInf) return b;
  if (b == -kInf) return a;
  if (a == kInf || b == kInf) return kInf;
  return std::max(a, b) + std::log1p(std::exp(-std::fabs(a - b)));
}

// ---- BSA ----------------------------------------------------------------------------------------
// The densified mask of (b, h): mask[i * S + j] = 1 iff query token i attends key j, i.e. key j
// lies in one of the KV blocks listed for query block i / block (blocks are full, the last one
// cut at S_kv).
std::vector<uint8_t> bsa_mask(const BsaProblem& p, int64_t b, int64_t h) {
  const BsaShape& s = p.shape;
  std::vector<uint8_t> mask(static_cast<size_t>(s.S * s.S), 0);
  for (int64_t m = 0; m < s.Nq(); ++m) {
    for (int64_t slot = 0; slot < s.count(); ++slot) {
      const int64_t n = p.block_at(b, h, m, slot);
      for (int64_t i = m * s.block; i < std::min((m + 1) * s.block, s.S); ++i)
        for (int64_t j = n * s.block; j < std::min((n + 1) * s.block, s.S); ++j)
          mask[static_cast<size_t>(i * s.S + j)] = 1;
    }
  }
  return mask;
}

// Start of head h of batch b in a logical [B, H, S, X] array.
size_t head_at(const BsaShape& s, int64_t H, int64_t b, int64_t h, int64_t X) {
  return static_cast<size_t>(((b * H + h) * s.S) * X);
}

// Softmax row i of head (b, h) under the mask: prob[j] (0 for masked keys); returns the LSE
// (-inf for a row with no key, then every prob is 0).
double bsa_softmax_row(const BsaShape& s, const double* q, const double* k, const uint8_t* mask_row,
                       std::vector<double>& prob) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  double mx = -kInf;
  for (int64_t j = 0; j < s.S; ++j) {
    prob[static_cast<size_t>(j)] = mask_row[j] ? scale * dot(q, k + j * s.D, s.D) : -kInf;
    mx = std::max(mx, prob[static_cast<size_t>(j)]);
  }
  if (mx == -kInf) {
    std::fill(prob.begin(), prob.end(), 0.0);
    return -kInf;
  }
  double sum = 0.0;
  for (double l : prob) sum += std::exp(l - mx);  // exp(-inf) = 0
  const double lse = mx + std::log(sum);
  for (double& l : prob) l = std::exp(l - lse);
  return lse;
}

// Forward of head (b, h): o [S, D_v] and lse [S] of that head.
void bsa_head_forward(const BsaProblem& p, const BsaDenseInputs& x,
                      const std::vector<uint8_t>& mask, int64_t b, int64_t h, double* o,
                      double* lse) {
  const BsaShape& s = p.shape;
  const int64_t hk = h / s.group();
  const double* q = &x.q[head_at(s, s.Hq, b, h, s.D)];
  const double* k = &x.k[head_at(s, s.Hkv, b, hk, s.D)];
  const double* v = &x.v[head_at(s, s.Hkv, b, hk, s.D)];
  std::vector<double> prob(static_cast<size_t>(s.S));
  for (int64_t i = 0; i < s.S; ++i) {
    lse[i] = bsa_softmax_row(s, q + i * s.D, k, &mask[static_cast<size_t>(i * s.S)], prob);
    double* oi = o + i * s.D;
    std::fill(oi, oi + s.D, 0.0);
    for (int64_t j = 0; j < s.S; ++j) {
      const double pj = prob[static_cast<size_t>(j)];
      if (pj != 0.0)
        for (int64_t c = 0; c < s.D; ++c) oi[c] += pj * v[j * s.D + c];
    }
  }
}

// Backward of head (b, h) from the dense softmax derivative, added into r.dq, r.dk, r.dv:
//   dP_j = <dO_i, v_j>, Delta_i = sum_j P_j dP_j, dS_j = P_j (dP_j - Delta_i),
//   dq_i = scale sum_j dS_j k_j, dk_j += scale dS_j q_i, dv_j += P_j dO_i.
void bsa_head_backward(const BsaProblem& p, const BsaDenseInputs& x,
                       const std::vector<uint8_t>& mask, int64_t b, int64_t h, BsaDenseResult& r) {
  const BsaShape& s = p.shape;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  const int64_t hk = h / s.group();
  const size_t qh = head_at(s, s.Hq, b, h, s.D), kh = head_at(s, s.Hkv, b, hk, s.D);
  const double* q = &x.q[qh];
  const double* k = &x.k[kh];
  const double* v = &x.v[kh];
  const double* dout = &x.dout[qh];
  std::vector<double> prob(static_cast<size_t>(s.S)), dp(static_cast<size_t>(s.S));
  for (int64_t i = 0; i < s.S; ++i) {
    bsa_softmax_row(s, q + i * s.D, k, &mask[static_cast<size_t>(i * s.S)], prob);
    double delta = 0.0;
    for (int64_t j = 0; j < s.S; ++j) {
      const size_t jj = static_cast<size_t>(j);
      dp[jj] = prob[jj] != 0.0 ? dot(dout + i * s.D, v + j * s.D, s.D) : 0.0;
      delta += prob[jj] * dp[jj];
    }
    for (int64_t j = 0; j < s.S; ++j) {
      const double pj = prob[static_cast<size_t>(j)];
      if (pj == 0.0) continue;
      const double ds = pj * (dp[static_cast<size_t>(j)] - delta);
      for (int64_t c = 0; c < s.D; ++c) {
        r.dq[qh + static_cast<size_t>(i * s.D + c)] += scale * ds * k[j * s.D + c];
        r.dk[kh + static_cast<size_t>(j * s.D + c)] += scale * ds * q[i * s.D + c];
        r.dv[kh + static_cast<size_t>(j * s.D + c)] += pj * dout[i * s.D + c];
      }
    }
  }
}

// sum(dout * o) over heads [h0, h1) of batch b.
double bsa_loss(const BsaProblem& p, const BsaDenseInputs& x, int64_t b, int64_t h0, int64_t h1) {
  const BsaShape& s = p.shape;
  std::vector<double> o(static_cast<size_t>(s.S * s.D)), lse(static_cast<size_t>(s.S));
  double loss = 0.0;
  for (int64_t h = h0; h < h1; ++h) {
    bsa_head_forward(p, x, bsa_mask(p, b, h), b, h, o.data(), lse.data());
    loss += dot(o.data(), &x.dout[head_at(s, s.Hq, b, h, s.D)], s.S * s.D);
  }
  return loss;
}

// ---- DSA ----------------------------------------------------------------------------------------
// The densified mask: mask[t * S_kv + j] = how many active slots of row t hold key j.
std::vector<int32_t> dsa_mask(const DsaProblem& p) {
  const DsaShape& s = p.shape;
  std::vector<int32_t> mask(static_cast<size_t>(s.Sq * s.Skv), 0);
  for (int64_t t = 0; t < s.Sq; ++t)
    for (int64_t i = 0; i < s.topk; ++i)
      if (p.active(t, i)) ++mask[static_cast<size_t>(t * s.Skv + p.index(t, i))];
  return mask;
}

// Softmax of row (t, h) over the keys of mask row t plus the sink.
struct DsaRow {
  bool empty = true;
  double lse = kInf;      // log sum over the keys (sink excluded)
  double p_sink = 0;      // the sink's probability
  std::vector<double> p;  // [S_kv] key probabilities (times the key's multiplicity)
};

DsaRow dsa_row(const DsaProblem& p, const DsaDenseInputs& x, const std::vector<int32_t>& mask,
               int64_t t, int64_t h) {
  const DsaShape& s = p.shape;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.Dqk));
  const double* q = &x.q[static_cast<size_t>((t * s.H + h) * s.Dqk)];
  const int32_t* count = &mask[static_cast<size_t>(t * s.Skv)];
  DsaRow r;
  r.p.assign(static_cast<size_t>(s.Skv), 0.0);
  std::vector<double> logit(static_cast<size_t>(s.Skv), -kInf);
  double mx = -kInf;
  for (int64_t j = 0; j < s.Skv; ++j) {
    if (count[j] == 0) continue;
    logit[static_cast<size_t>(j)] = scale * dot(q, &x.kv[static_cast<size_t>(j * s.Dqk)], s.Dqk);
    mx = std::max(mx, logit[static_cast<size_t>(j)]);
  }
  if (mx == -kInf) return r;  // empty row: out = 0, lse = +inf, no gradient
  r.empty = false;
  double sum = 0.0;
  for (int64_t j = 0; j < s.Skv; ++j)
    sum += count[j] * std::exp(logit[static_cast<size_t>(j)] - mx);
  r.lse = mx + std::log(sum);
  const double sink = x.sink[static_cast<size_t>(h)];
  const double L = log_add_exp(r.lse, sink);
  if (L == kInf) {  // sink = +inf takes everything
    r.p_sink = 1.0;
    return r;
  }
  for (int64_t j = 0; j < s.Skv; ++j)
    r.p[static_cast<size_t>(j)] = count[j] * std::exp(logit[static_cast<size_t>(j)] - L);
  r.p_sink = sink == -kInf ? 0.0 : std::exp(sink - L);
  return r;
}

// sum(dout * out) over rows [t0, t1), all heads.
double dsa_loss(const DsaProblem& p, const DsaDenseInputs& x, const std::vector<int32_t>& mask,
                int64_t t0, int64_t t1) {
  const DsaShape& s = p.shape;
  double loss = 0.0;
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t h = 0; h < s.H; ++h) {
      const DsaRow r = dsa_row(p, x, mask, t, h);
      const double* dout = &x.dout[static_cast<size_t>((t * s.H + h) * s.Dv)];
      for (int64_t j = 0; j < s.Skv; ++j) {
        const double pj = r.p[static_cast<size_t>(j)];
        if (pj != 0.0) loss += pj * dot(dout, &x.kv[static_cast<size_t>(j * s.Dqk)], s.Dv);
      }
    }
  }
  return loss;
}

// Adds one central difference of `loss` in x[e] against grad to the error sums.
void add_difference(std::vector<double>& x, size_t e, double grad,
                    const std::function<double()>& loss, double& err2, double& ref2) {
  const double x0 = x[e];
  const double h = 1e-4 * std::max(1.0, std::fabs(x0));
  x[e] = x0 + h;
  const double up = loss();
  x[e] = x0 - h;
  const double down = loss();
  x[e] = x0;
  const double fd = (up - down) / (2.0 * h);
  err2 += (fd - grad) * (fd - grad);
  ref2 += fd * fd;
}

double rel_error(double err2, double ref2) {
  if (err2 == 0.0) return 0.0;
  return std::sqrt(err2) / std::max(std::sqrt(ref2), 1e-300);
}

}  // namespace

// ---- BSA ----------------------------------------------------------------------------------------
BsaDenseInputs bsa_dense_inputs(const BsaProblem& p) {
  return {p.logical(p.q), p.logical(p.k), p.logical(p.v), p.logical(p.dout)};
}

BsaDenseResult bsa_dense_attention(const BsaProblem& p, const BsaDenseInputs& x, bool backward) {
  const BsaShape& s = p.shape;
  BsaDenseResult r;
  r.o.assign(static_cast<size_t>(s.B * s.Hq * s.S * s.D), 0.0);
  r.lse.assign(static_cast<size_t>(s.B * s.Hq * s.S), 0.0);
  if (backward) {
    r.dq.assign(r.o.size(), 0.0);
    r.dk.assign(static_cast<size_t>(s.B * s.Hkv * s.S * s.D), 0.0);
    r.dv.assign(r.dk.size(), 0.0);
  }
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.Hq; ++h) {
      const std::vector<uint8_t> mask = bsa_mask(p, b, h);
      bsa_head_forward(p, x, mask, b, h, &r.o[head_at(s, s.Hq, b, h, s.D)],
                       &r.lse[head_at(s, s.Hq, b, h, 1)]);
      if (backward) bsa_head_backward(p, x, mask, b, h, r);
    }
  }
  return r;
}

FiniteDifferenceCheck bsa_finite_differences(const BsaProblem& p, const BsaDenseInputs& x0,
                                             const BsaDenseResult& grads, int per_tensor,
                                             uint64_t seed) {
  const BsaShape& s = p.shape;
  std::mt19937_64 rng(seed);
  BsaDenseInputs x = x0;
  double err2 = 0, ref2 = 0;
  FiniteDifferenceCheck out;
  auto pick = [&](int64_t n) { return std::uniform_int_distribution<int64_t>(0, n - 1)(rng); };
  for (int e = 0; e < per_tensor; ++e) {
    // q[b, h, i, c]: only head h of batch b changes.
    const int64_t b = pick(s.B), h = pick(s.Hq);
    const size_t qe = head_at(s, s.Hq, b, h, s.D) + static_cast<size_t>(pick(s.S * s.D));
    add_difference(
        x.q, qe, grads.dq[qe], [&] { return bsa_loss(p, x, b, h, h + 1); }, err2, ref2);
    // k and v [b, hk, j, c]: the query heads of KV head hk change.
    const int64_t bk = pick(s.B), hk = pick(s.Hkv);
    const size_t ke = head_at(s, s.Hkv, bk, hk, s.D) + static_cast<size_t>(pick(s.S * s.D));
    auto group_loss = [&] { return bsa_loss(p, x, bk, hk * s.group(), (hk + 1) * s.group()); };
    add_difference(x.k, ke, grads.dk[ke], group_loss, err2, ref2);
    add_difference(x.v, ke, grads.dv[ke], group_loss, err2, ref2);
    out.elements += 3;
  }
  out.rel_error = rel_error(err2, ref2);
  return out;
}

// ---- DSA ----------------------------------------------------------------------------------------
DsaDenseInputs dsa_dense_inputs(const DsaProblem& p) {
  const std::vector<double> no_sink(static_cast<size_t>(p.shape.H), -kInf);
  auto all = [](const HostTensor& t) {
    std::vector<double> v(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.get(i);
    return v;
  };
  return {all(p.q), all(p.kv), all(p.dout), p.sink.present() ? all(p.sink) : no_sink};
}

// Backward per row (t, h), from the dense softmax derivative with the sink as a value-less key:
//   dP_j = <dout, kv_j[:D_v]>, Delta = sum_j p_j dP_j, dS_j = p_j (dP_j - Delta),
//   dq = scale sum_j dS_j kv_j, dkv_j += scale dS_j q, dkv_j[:D_v] += p_j dout,
//   d_sink[h] -= p_sink Delta.
DsaDenseResult dsa_dense_attention(const DsaProblem& p, const DsaDenseInputs& x, bool backward) {
  const DsaShape& s = p.shape;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.Dqk));
  const std::vector<int32_t> mask = dsa_mask(p);
  DsaDenseResult r;
  r.out.assign(static_cast<size_t>(s.Sq * s.H * s.Dv), 0.0);
  r.lse.assign(static_cast<size_t>(s.Sq * s.H), 0.0);
  if (backward) {
    r.dq.assign(static_cast<size_t>(s.Sq * s.H * s.Dqk), 0.0);
    r.dkv.assign(static_cast<size_t>(s.Skv * s.Dqk), 0.0);
    r.d_sink.assign(static_cast<size_t>(s.H), 0.0);
  }
  std::vector<double> dp(static_cast<size_t>(s.Skv));
  for (int64_t t = 0; t < s.Sq; ++t) {
    for (int64_t h = 0; h < s.H; ++h) {
      const DsaRow row = dsa_row(p, x, mask, t, h);
      const size_t th = static_cast<size_t>(t * s.H + h);
      r.lse[th] = row.lse;
      double* out = &r.out[th * static_cast<size_t>(s.Dv)];
      for (int64_t j = 0; j < s.Skv; ++j) {
        const double pj = row.p[static_cast<size_t>(j)];
        if (pj != 0.0)
          for (int64_t c = 0; c < s.Dv; ++c)
            out[c] += pj * x.kv[static_cast<size_t>(j * s.Dqk + c)];
      }
      if (!backward || row.empty) continue;
      const double* dout = &x.dout[th * static_cast<size_t>(s.Dv)];
      const double* q = &x.q[th * static_cast<size_t>(s.Dqk)];
      double delta = 0.0;
      for (int64_t j = 0; j < s.Skv; ++j) {
        const double pj = row.p[static_cast<size_t>(j)];
        dp[static_cast<size_t>(j)] =
            pj != 0.0 ? dot(dout, &x.kv[static_cast<size_t>(j * s.Dqk)], s.Dv) : 0.0;
        delta += pj * dp[static_cast<size_t>(j)];
      }
      double* dq = &r.dq[th * static_cast<size_t>(s.Dqk)];
      for (int64_t j = 0; j < s.Skv; ++j) {
        const double pj = row.p[static_cast<size_t>(j)];
        if (pj == 0.0) continue;
        const double ds = pj * (dp[static_cast<size_t>(j)] - delta);
        const double* kv = &x.kv[static_cast<size_t>(j * s.Dqk)];
        double* dkv = &r.dkv[static_cast<size_t>(j * s.Dqk)];
        for (int64_t c = 0; c < s.Dqk; ++c) {
          dq[c] += scale * ds * kv[c];
          dkv[c] += scale * ds * q[c];
        }
        for (int64_t c = 0; c < s.Dv; ++c) dkv[c] += pj * dout[c];
      }
      r.d_sink[static_cast<size_t>(h)] -= row.p_sink * delta;
    }
  }
  return r;
}

FiniteDifferenceCheck dsa_finite_differences(const DsaProblem& p, const DsaDenseInputs& x0,
                                             const DsaDenseResult& grads, int per_tensor,
                                             uint64_t seed) {
  const DsaShape& s = p.shape;
  const std::vector<int32_t> mask = dsa_mask(p);
  std::mt19937_64 rng(seed);
  DsaDenseInputs x = x0;
  double err2 = 0, ref2 = 0;
  FiniteDifferenceCheck out;
  auto pick = [&](int64_t n) { return std::uniform_int_distribution<int64_t>(0, n - 1)(rng); };
  auto all_rows = [&] { return dsa_loss(p, x, mask, 0, s.Sq); };
  // Keys some row selects (a gradient of exactly 0 tests little).
  std::vector<int64_t> selected;
  for (int64_t j = 0; j < s.Skv; ++j)
    for (int64_t t = 0; t < s.Sq; ++t)
      if (mask[static_cast<size_t>(t * s.Skv + j)] > 0) {
        selected.push_back(j);
        break;
      }
  for (int e = 0; e < per_tensor; ++e) {
    // q[t, h, c]: only row t changes.
    const int64_t t = pick(s.Sq);
    const size_t qe = static_cast<size_t>(t * s.H * s.Dqk + pick(s.H * s.Dqk));
    add_difference(
        x.q, qe, grads.dq[qe], [&] { return dsa_loss(p, x, mask, t, t + 1); }, err2, ref2);
    ++out.elements;
    if (!selected.empty()) {  // kv[j, c]: key and (c < D_v) value of every row that selects j
      const int64_t j = selected[static_cast<size_t>(pick(static_cast<int64_t>(selected.size())))];
      const size_t ke = static_cast<size_t>(j * s.Dqk + pick(s.Dqk));
      add_difference(x.kv, ke, grads.dkv[ke], all_rows, err2, ref2);
      ++out.elements;
    }
    if (p.sink.present()) {
      const size_t h = static_cast<size_t>(pick(s.H));
      add_difference(x.sink, h, grads.d_sink[h], all_rows, err2, ref2);
      ++out.elements;
    }
  }
  out.rel_error = rel_error(err2, ref2);
  return out;
}

}  // namespace sa_tool
