// fp64 reference of the DSA lightning indexer (SPEC section 5): scores, top-k, KL loss and its
// gradients, one query row t at a time, straight from the formulas:
//   a[t, j, s] = scale_I * <q_I[t, j], k_I[s]>
//   I[t, s]    = sum_j w[t, j] * relu(a[t, j, s])                 for s in range(t), else -inf
//   top-k      = the k keys of range(t) with the largest fp32-rounded I (ties: smaller key),
//                written in increasing key order, then -1
// Loss over the key set K_t (sparse: the row's slots in the loss, IndexerMeta::slot_in_loss;
// dense: range(t)), in the log domain so that no exp overflows:
//   log A[t, s] = logsumexp_h (scale * <q[t, h], kv[s]> - lse[t, h])   (lse = +inf: no term)
//   log p       = log A - logsumexp_{K_t} log A,   log r = I - logsumexp_{K_t} I
//   loss_t      = coeff * sum_{s in K_t, p > 0} p (log p - log r)
//   dI[t, s]    = coeff * (r - p), then through the ReLU (only where a > 0):
//   dw[t, j] += dI a,   dq_I[t, j] += dI w[t, j] scale_I k_I[s],
//   dk_I[s]  += dI w[t, j] scale_I q_I[t, j]
// A row with an empty K_t or no target mass (every log A = -inf) has loss_t = 0 and no gradient.
// Every sum is in double; dk_I is accumulated in one double buffer and stored once.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/host_numeric.hpp"
#include "reference/reference.hpp"

namespace sa::reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double dot(const double* a, const double* b, int64_t n) {
  double acc = 0.0;
  for (int64_t c = 0; c < n; ++c) acc += a[c] * b[c];
  return acc;
}

// Rows of a [S, H, D] (or [S, D]) tensor as doubles: rows(s)[h * D + c].
std::vector<double> load_rows(const Shd& x, sa_dtype dtype, int64_t S, int64_t H, int64_t D) {
  std::vector<double> v(static_cast<size_t>(S * H * D));
  for (int64_t s = 0; s < S; ++s)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t c = 0; c < D; ++c)
        v[static_cast<size_t>((s * H + h) * D + c)] =
            load_as_double(x.data, dtype, x.offset(s, h, c));
  return v;
}

// The indexer's inputs of one problem as doubles: every key, and one query row at a time.
class IndexerRows {
 public:
  IndexerRows(const IndexerDims& d, const IndexerInputs& in, sa_dtype dtype, double scale_I)
      : d_(d), in_(in), dtype_(dtype), scale_I_(scale_I),
        keys_(load_rows(in.k_I, dtype, d.Skv, 1, d.DI)),
        q_(static_cast<size_t>(d.HI * d.DI)), w_(static_cast<size_t>(d.HI)) {}

  void load_query(int64_t t) {
    for (int64_t j = 0; j < d_.HI; ++j) {
      for (int64_t c = 0; c < d_.DI; ++c)
        q_[static_cast<size_t>(j * d_.DI + c)] =
            load_as_double(in_.q_I.data, dtype_, in_.q_I.offset(t, j, c));
      w_[static_cast<size_t>(j)] =
          load_as_double(in_.w, in_.w_dtype, t * in_.w_stride[0] + j * in_.w_stride[1]);
    }
  }
  const double* key(int64_t s) const { return keys_.data() + s * d_.DI; }
  const double* query(int64_t j) const { return q_.data() + j * d_.DI; }
  double weight(int64_t j) const { return w_[static_cast<size_t>(j)]; }
  // a[t, j, s] for the loaded row t.
  double logit(int64_t j, int64_t s) const { return scale_I_ * dot(query(j), key(s), d_.DI); }
  // I[t, s] for the loaded row t.
  double score(int64_t s) const {
    double acc = 0.0;
    for (int64_t j = 0; j < d_.HI; ++j) acc += weight(j) * std::max(logit(j, s), 0.0);
    return acc;
  }

 private:
  const IndexerDims& d_;
  const IndexerInputs& in_;
  sa_dtype dtype_;
  double scale_I_;
  std::vector<double> keys_;  // [Skv, DI]
  std::vector<double> q_;     // [HI, DI] of the loaded row
  std::vector<double> w_;     // [HI] of the loaded row
};

// Top-k order: larger score first, then smaller key. NaN ranks below every number (and NaNs among
// themselves by key), so that the order is strict and weak for any input.
struct Candidate {
  float score;
  int64_t key;
};
bool ranks_before(const Candidate& a, const Candidate& b) {
  const bool an = std::isnan(a.score), bn = std::isnan(b.score);
  if (an != bn) return bn;
  if (!an && a.score != b.score) return a.score > b.score;
  return a.key < b.key;
}

// log sum exp(x) over a list, -inf for an empty list or all -inf terms.
double log_sum_exp(const std::vector<double>& x) {
  double m = -kInf;
  for (double v : x) m = std::max(m, v);
  if (m == -kInf || std::isnan(m)) return m;
  double sum = 0.0;
  for (double v : x) sum += std::exp(v - m);
  return m + std::log(sum);
}

}  // namespace

void indexer_scores(const IndexerScoresProblem& p) {
  const IndexerDims& d = p.dims;
  IndexerRows rows(d, p.in, p.dtype, p.scale);
  for (int64_t t = 0; t < d.Sq; ++t) {
    rows.load_query(t);
    const int64_t b = p.meta.range_begin(t, d), e = p.meta.range_end(t, d);
    for (int64_t s = 0; s < d.Skv; ++s) {
      const float v = s >= b && s < e ? static_cast<float>(rows.score(s))
                                      : -std::numeric_limits<float>::infinity();
      p.scores[t * p.scores_stride[0] + s * p.scores_stride[1]] = v;
    }
  }
}

void indexer_topk(const IndexerTopkProblem& p) {
  const IndexerDims& d = p.dims;
  IndexerRows rows(d, p.in, p.dtype, p.scale);
  std::vector<Candidate> cand;
  for (int64_t t = 0; t < d.Sq; ++t) {
    rows.load_query(t);
    const int64_t b = p.meta.range_begin(t, d), e = p.meta.range_end(t, d);
    cand.clear();
    for (int64_t s = b; s < e; ++s) cand.push_back({static_cast<float>(rows.score(s)), s});
    const int64_t n = std::min<int64_t>(d.topk, static_cast<int64_t>(cand.size()));
    std::partial_sort(cand.begin(), cand.begin() + n, cand.end(), ranks_before);
    std::sort(cand.begin(), cand.begin() + n,
              [](const Candidate& x, const Candidate& y) { return x.key < y.key; });
    int32_t* row = p.topk_idx + t * p.topk_idx_stride[0];
    for (int64_t i = 0; i < d.topk; ++i)
      row[i * p.topk_idx_stride[1]] =
          i < n ? static_cast<int32_t>(cand[static_cast<size_t>(i)].key) : -1;
    if (p.topk_length) p.topk_length[t * p.topk_length_stride] = static_cast<int32_t>(n);
  }
}

void indexer_loss(const IndexerLossProblem& p) {
  const IndexerDims& d = p.dims;
  const double scale_I = p.scale, scale = p.attn_scale, coeff = p.options.coeff;
  IndexerRows rows(d, p.in, p.dtype, scale_I);
  const std::vector<double> kv = load_rows(p.kv, p.attn_dtype, d.Skv, 1, d.Dqk);
  std::vector<double> dk(p.has_grad() ? static_cast<size_t>(d.Skv * d.DI) : 0, 0.0);
  std::vector<double> q(static_cast<size_t>(d.H * d.Dqk)), lse(static_cast<size_t>(d.H));
  std::vector<double> dq(static_cast<size_t>(d.HI * d.DI)), dw(static_cast<size_t>(d.HI));
  std::vector<int64_t> keys;
  std::vector<double> log_a, score, head_terms(static_cast<size_t>(d.H));
  double total = 0.0;

  for (int64_t t = 0; t < d.Sq; ++t) {
    // K_t, one entry per term.
    keys.clear();
    if (p.meta.sparse()) {
      for (int64_t i = 0; i < d.topk; ++i)
        if (p.meta.slot_in_loss(t, i, d)) keys.push_back(p.meta.topk_idx.at(t, i));
    } else {
      for (int64_t s = p.meta.range_begin(t, d); s < p.meta.range_end(t, d); ++s)
        keys.push_back(s);
    }
    const size_t n = keys.size();

    // The target (log A) and the indexer scores over K_t.
    double row_loss = 0.0;
    std::fill(dq.begin(), dq.end(), 0.0);
    std::fill(dw.begin(), dw.end(), 0.0);
    log_a.assign(n, -kInf);
    score.assign(n, 0.0);
    if (n > 0) {
      for (int64_t h = 0; h < d.H; ++h) {
        lse[static_cast<size_t>(h)] = p.lse[t * p.lse_stride[0] + h * p.lse_stride[1]];
        for (int64_t c = 0; c < d.Dqk; ++c)
          q[static_cast<size_t>(h * d.Dqk + c)] =
              load_as_double(p.q.data, p.attn_dtype, p.q.offset(t, h, c));
      }
      rows.load_query(t);
      for (size_t k = 0; k < n; ++k) {
        const double* key = kv.data() + keys[k] * d.Dqk;
        for (int64_t h = 0; h < d.H; ++h) {
          const double l = lse[static_cast<size_t>(h)];
          head_terms[static_cast<size_t>(h)] =
              l == kInf ? -kInf : scale * dot(q.data() + h * d.Dqk, key, d.Dqk) - l;
        }
        log_a[k] = log_sum_exp(head_terms);
        score[k] = rows.score(keys[k]);
      }
    }
    const double log_za = log_sum_exp(log_a);
    if (n > 0 && log_za != -kInf) {
      const double log_zi = log_sum_exp(score);
      for (size_t k = 0; k < n; ++k) {
        const double log_p = log_a[k] - log_za, log_r = score[k] - log_zi;
        const double pk = std::exp(log_p), rk = std::exp(log_r);
        if (pk > 0.0) row_loss += pk * (log_p - log_r);
        if (!p.has_grad()) continue;
        const double g = coeff * (rk - pk);
        double* dk_s = dk.data() + keys[k] * d.DI;
        const double* k_s = rows.key(keys[k]);
        for (int64_t j = 0; j < d.HI; ++j) {
          const double a = rows.logit(j, keys[k]);
          if (!(a > 0.0)) continue;
          dw[static_cast<size_t>(j)] += g * a;
          const double gq = g * rows.weight(j) * scale_I;
          const double* q_j = rows.query(j);
          double* dq_j = dq.data() + j * d.DI;
          for (int64_t c = 0; c < d.DI; ++c) {
            dq_j[c] += gq * k_s[c];
            dk_s[c] += gq * q_j[c];
          }
        }
      }
      row_loss *= coeff;
    }
    total += row_loss;
    if (p.loss_per_token)
      store_from_double(p.loss_per_token, p.loss_dtype, t * p.loss_per_token_stride, row_loss);
    if (p.has_grad()) {
      for (int64_t j = 0; j < d.HI; ++j) {
        for (int64_t c = 0; c < d.DI; ++c)
          store_from_double(p.dq_I.data, p.dtype, p.dq_I.offset(t, j, c),
                            dq[static_cast<size_t>(j * d.DI + c)]);
        store_from_double(p.dw, p.in.w_dtype, t * p.dw_stride[0] + j * p.dw_stride[1],
                          dw[static_cast<size_t>(j)]);
      }
    }
  }

  store_from_double(p.loss, p.loss_dtype, 0, total);
  if (p.has_grad()) {
    for (int64_t s = 0; s < d.Skv; ++s)
      for (int64_t c = 0; c < d.DI; ++c)
        store_from_double(p.dk_I.data, p.dtype, p.dk_I.offset(s, 0, c),
                          dk[static_cast<size_t>(s * d.DI + c)]);
  }
}

}  // namespace sa::reference
