// fp64 reference of DeepSeek sparse attention (SPEC section 2), forward and backward.
//
// One (token t, head h) row at a time, straight from the formulas:
//   s_j   = scale * <q[t, h, :D_qk], kv[j, :D_qk]>            for every active slot j of row t
//   lse   = log sum_j exp(s_j)             (sink excluded; +inf stored for an empty row)
//   L     = logaddexp(lse, sink[h])         (no sink: L = lse)
//   p_j   = exp(s_j - L), computed as exp(s_j - m) / (sum_k exp(s_k - m) (1 + exp(sink - lse)))
//           with m the row's largest score: m + log(sum) rounds to m once |m| >> 2^53 log(sum)
//           (a huge scale), and exp(s_j - L) would then give every tied key probability 1
//   out   = sum_j p_j kv[j, :D_v]
// Backward, from the provided out and lse (p_j = min(exp(s_j - L), 1), see softmax_prob):
//   delta = <out, dout>,  dP_j = <dout, kv[j, :D_v]>,  dS_j = p_j (dP_j - delta)
//   dq    = scale * sum_j dS_j kv[j, :]
//   dkv[j] += scale * dS_j q;  dkv[j, :D_v] += p_j dout     (double buffer, stored once)
//   d_sink[h] = - sum_t exp(sink[h] - L[t, h]) delta[t, h]
// Slots are terms: a key that a row lists twice contributes twice. Inactive slots (DsaMeta::active)
// are skipped before any kv access, so no index value can make this code read out of bounds.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/host_numeric.hpp"
#include "reference/reference.hpp"

namespace sa::reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// log(exp(a) + exp(b)), exact for infinite arguments (no inf - inf) and free of overflow.
double log_add_exp(double a, double b) {
  if (a == -kInf) return b;
  if (b == -kInf) return a;
  if (a == kInf || b == kInf) return kInf;
  const double m = std::max(a, b);
  return m + std::log1p(std::exp(-std::fabs(a - b)));
}

// exp(sink - L), the sink's share of the softmax, for L = log_add_exp(lse, sink) of a non-empty
// row. A sink of +inf takes everything (L = +inf too: no inf - inf); -inf (or none) takes nothing.
// Huge finite sinks need no special case: L == sink exactly, so the share is exp(0) = 1.
double sink_share(double sink, double L) {
  if (sink == -kInf) return 0.0;
  if (sink == kInf) return 1.0;
  return softmax_prob(sink, L);
}

double sink_of(const DsaMeta& meta, int64_t h) {
  return meta.sink ? static_cast<double>(meta.sink[h * meta.sink_stride]) : -kInf;
}

// The active slots of row t (one entry per slot, repeats kept) and their keys kv[j, :D_qk] as
// doubles, [n, D_qk]. Shared by the H heads of the row.
struct RowKeys {
  std::vector<int64_t> index;
  std::vector<double> key;
  int64_t n() const { return static_cast<int64_t>(index.size()); }
  const double* at(int64_t k, int64_t Dqk) const { return key.data() + k * Dqk; }
};

void gather_row(const DsaMeta& meta, const DsaDims& d, const Shd& kv, sa_dtype dtype, int64_t t,
                RowKeys& row) {
  row.index.clear();
  for (int64_t i = 0; i < d.topk; ++i)
    if (meta.active(t, i, d)) row.index.push_back(meta.topk_idx.at(t, i));
  row.key.resize(static_cast<size_t>(row.n() * d.Dqk));
  for (int64_t k = 0; k < row.n(); ++k)
    for (int64_t c = 0; c < d.Dqk; ++c)
      row.key[static_cast<size_t>(k * d.Dqk + c)] =
          load_as_double(kv.data, dtype, kv.offset(row.index[static_cast<size_t>(k)], 0, c));
}

void load_vec(const Shd& x, sa_dtype dtype, int64_t s, int64_t h, int64_t len,
              std::vector<double>& v) {
  v.resize(static_cast<size_t>(len));
  for (int64_t c = 0; c < len; ++c)
    v[static_cast<size_t>(c)] = load_as_double(x.data, dtype, x.offset(s, h, c));
}

double dot(const double* a, const double* b, int64_t n) {
  double acc = 0.0;
  for (int64_t c = 0; c < n; ++c) acc += a[c] * b[c];
  return acc;
}

}  // namespace

void dsa_forward(const DsaFwdProblem& p) {
  const DsaDims& d = p.dims;
  const double scale = p.scale;
  RowKeys row;
  std::vector<double> q, s, out(static_cast<size_t>(d.Dv));

  for (int64_t t = 0; t < d.Sq; ++t) {
    gather_row(p.meta, d, p.kv, p.dtype, t, row);
    for (int64_t h = 0; h < d.H; ++h) {
      std::fill(out.begin(), out.end(), 0.0);
      double lse = kInf;  // FlashMLA's convention for an empty row
      if (row.n() > 0) {
        load_vec(p.q, p.dtype, t, h, d.Dqk, q);
        s.resize(static_cast<size_t>(row.n()));
        double m = -kInf;
        for (int64_t k = 0; k < row.n(); ++k) {
          s[static_cast<size_t>(k)] = scale * dot(q.data(), row.at(k, d.Dqk), d.Dqk);
          m = std::max(m, s[static_cast<size_t>(k)]);
        }
        double sum = 0.0;
        for (double sk : s) sum += std::exp(sk - m);
        lse = m + std::log(sum);
        // sum exp(L - lse) = sum (1 + exp(sink - lse)): no sink adds nothing; a sink of +inf
        // (or one so large that the exponential overflows) makes it +inf and every p_j 0.
        const double sink = sink_of(p.meta, h);
        const double norm = sink == -kInf ? sum : sum * (1.0 + std::exp(sink - lse));
        for (int64_t k = 0; k < row.n(); ++k) {
          const double pk = std::exp(s[static_cast<size_t>(k)] - m) / norm;
          const double* v = row.at(k, d.Dqk);
          for (int64_t c = 0; c < d.Dv; ++c) out[static_cast<size_t>(c)] += pk * v[c];
        }
      }
      for (int64_t c = 0; c < d.Dv; ++c)
        store_from_double(p.out.data, p.dtype, p.out.offset(t, h, c), out[static_cast<size_t>(c)]);
      p.lse[t * p.lse_stride[0] + h * p.lse_stride[1]] = static_cast<float>(lse);
    }
  }
}

void dsa_backward(const DsaBwdProblem& p) {
  const DsaDims& d = p.dims;
  const double scale = p.scale;
  std::vector<double> dkv(static_cast<size_t>(d.Skv * d.Dqk), 0.0);
  std::vector<double> d_sink(static_cast<size_t>(d.H), 0.0);
  RowKeys row;
  std::vector<double> q, out, dout, dq(static_cast<size_t>(d.Dqk));

  for (int64_t t = 0; t < d.Sq; ++t) {
    gather_row(p.meta, d, p.kv, p.dtype, t, row);
    for (int64_t h = 0; h < d.H; ++h) {
      std::fill(dq.begin(), dq.end(), 0.0);
      const double lse = p.lse[t * p.lse_stride[0] + h * p.lse_stride[1]];
      // An empty row (no active slot; the forward stored lse = +inf) has no gradient at all.
      if (row.n() > 0 && lse != kInf) {
        load_vec(p.q, p.dtype, t, h, d.Dqk, q);
        load_vec(p.out, p.dtype, t, h, d.Dv, out);
        load_vec(p.dout, p.dtype, t, h, d.Dv, dout);
        const double delta = dot(out.data(), dout.data(), d.Dv);
        const double sink = sink_of(p.meta, h);
        const double L = log_add_exp(lse, sink);
        for (int64_t k = 0; k < row.n(); ++k) {
          const double* key = row.at(k, d.Dqk);
          const double pk = softmax_prob(scale * dot(q.data(), key, d.Dqk), L);
          const double dS = pk * (dot(dout.data(), key, d.Dv) - delta);
          double* dkv_j = dkv.data() + row.index[static_cast<size_t>(k)] * d.Dqk;
          for (int64_t c = 0; c < d.Dqk; ++c) {
            dq[static_cast<size_t>(c)] += scale * dS * key[c];
            dkv_j[c] += scale * dS * q[static_cast<size_t>(c)];
          }
          for (int64_t c = 0; c < d.Dv; ++c) dkv_j[c] += pk * dout[static_cast<size_t>(c)];
        }
        d_sink[static_cast<size_t>(h)] -= sink_share(sink, L) * delta;
      }
      for (int64_t c = 0; c < d.Dqk; ++c)
        store_from_double(p.dq.data, p.dtype, p.dq.offset(t, h, c), dq[static_cast<size_t>(c)]);
    }
  }

  for (int64_t j = 0; j < d.Skv; ++j)
    for (int64_t c = 0; c < d.Dqk; ++c)
      store_from_double(p.dkv.data, p.dtype, p.dkv.offset(j, 0, c),
                        dkv[static_cast<size_t>(j * d.Dqk + c)]);
  if (p.d_sink) {
    for (int64_t h = 0; h < d.H; ++h)
      p.d_sink[h * p.d_sink_stride] =
          p.meta.sink ? static_cast<float>(d_sink[static_cast<size_t>(h)]) : 0.0f;
  }
}

}  // namespace sa::reference
