// fp64 CPU reference of block-sparse attention (SPEC section 1).
//
// Straight from the formulas, one query token at a time:
//   keys(b, h, i)  = the valid keys of the blocks listed for query block m = i / block, in list
//                    order, that the token mask shows to i (SPEC 4; every one with mask none);
//                    key j of block n is valid iff j - n*block < block_len(b, n) and j < Skv
//   s_j            = scale * <q_i, k_j>                         (in double)
//   lse            = log sum_j exp(s_j)       (natural log; -inf for a row with no keys)
//   o_i            = sum_j exp(s_j - lse) v_j (0 for a row with no keys)
// Backward, with P recomputed from the PROVIDED lse and Delta from the PROVIDED o:
//   P_j  = min(exp(s_j - lse), 1)   (a probability; the cap only removes the overflow that the
//                                    fp32 rounding of a huge lse would cause, see softmax_prob)
//   dS_j = P_j (<dO_i, v_j> - Delta_i),  dq_i = scale sum_j dS_j k_j,
//   dk_j += scale dS_j q_i,  dv_j += P_j dO_i   (summed over the query heads of a GQA group).
// Gradients are accumulated in zero-initialised double buffers, then every element is stored, so
// KV blocks nobody attends and padded keys get exactly 0.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/error.hpp"
#include "common/host_numeric.hpp"
#include "reference/reference.hpp"

namespace sa::reference {

namespace {

// The keys (token indices along S_kv) that query block m of (b, h) attends, in list order.
std::vector<int64_t> row_keys(const BsaDims& d, const BsaMeta& meta, int64_t b, int64_t h,
                              int64_t m) {
  std::vector<int64_t> keys;
  const int32_t count = meta.count(b, h, m);
  for (int32_t slot = 0; slot < count; ++slot) {
    const int64_t n = meta.q2k_index.at(b, h, m, slot);
    const int64_t first = n * d.block;
    const int64_t len = meta.block_len(b, n, d);
    for (int64_t j = first; j < first + len && j < d.Skv; ++j) keys.push_back(j);
  }
  return keys;
}

// The keys of `block_keys` (a query block's row) that the token mask shows to query token i.
std::vector<int64_t> visible_keys(const std::vector<int64_t>& block_keys, const TokenMask& mask,
                                  int64_t i) {
  if (!mask.on) return block_keys;
  std::vector<int64_t> keys;
  for (int64_t j : block_keys)
    if (mask.visible(i, j)) keys.push_back(j);
  return keys;
}

double load(const Bhsd& t, sa_dtype dtype, int64_t b, int64_t h, int64_t s, int64_t x) {
  return load_as_double(t.data, dtype, t.offset(b, h, s, x));
}

// scale * <q[b, h, i, :], k[b, hk, j, :]>
template <class Problem>
double score(const Problem& p, int64_t b, int64_t h, int64_t hk, int64_t i, int64_t j) {
  double dot = 0.0;
  for (int64_t x = 0; x < p.dims.D; ++x)
    dot += load(p.q, p.dtype, b, h, i, x) * load(p.k, p.dtype, b, hk, j, x);
  return static_cast<double>(p.scale) * dot;
}

int64_t lse_offset(const int64_t* stride, int64_t b, int64_t h, int64_t s) {
  return b * stride[0] + h * stride[1] + s * stride[2];
}

// Dense [B, H, S, X] double buffer, zero-initialised.
struct Acc {
  int64_t H, S, X;
  std::vector<double> v;
  Acc(int64_t B, int64_t H_, int64_t S_, int64_t X_)
      : H(H_), S(S_), X(X_), v(static_cast<size_t>(B * H_ * S_ * X_), 0.0) {}
  double& at(int64_t b, int64_t h, int64_t s, int64_t x) {
    return v[static_cast<size_t>(((b * H + h) * S + s) * X + x)];
  }
  void store(const Bhsd& t, sa_dtype dtype, int64_t B) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t s = 0; s < S; ++s)
          for (int64_t x = 0; x < X; ++x)
            store_from_double(t.data, dtype, t.offset(b, h, s, x), at(b, h, s, x));
  }
};

}  // namespace

void check_bsa_metadata(const BsaDims& d, const BsaMeta& meta) {
  // Rows in (b, h, m) order; within a row the count first, then the slots in order; then the
  // block lengths in (b, n) order. The first bad entry in this order is reported.
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.Hq; ++h) {
      for (int64_t m = 0; m < d.Nq; ++m) {
        if (meta.q2k_count.data) {
          const int32_t c = meta.q2k_count.at(b, h, m);
          SA_CHECK(c >= 0 && c <= d.Kmax, SA_ERROR_INVALID_METADATA,
                   "sparsity.q2k_count[b=" << b << ", h=" << h << ", m=" << m << "] = " << c
                                  << ": expected [0, " << d.Kmax << "]");
        }
        const int32_t count = meta.count(b, h, m);
        for (int32_t slot = 0; slot < count; ++slot) {
          const int32_t n = meta.q2k_index.at(b, h, m, slot);
          SA_CHECK(n >= 0 && n < d.Nkv, SA_ERROR_INVALID_METADATA,
                   "sparsity.q2k_index[b=" << b << ", h=" << h << ", m=" << m << ", slot=" << slot
                                  << "] = " << n << ": expected a KV block in [0, " << d.Nkv
                                  << ")");
          for (int32_t prev = 0; prev < slot; ++prev) {
            SA_CHECK(meta.q2k_index.at(b, h, m, prev) != n, SA_ERROR_INVALID_METADATA,
                     "sparsity.q2k_index[b=" << b << ", h=" << h << ", m=" << m << ", slot=" << slot
                                    << "] = " << n << " repeats slot " << prev
                                    << ": entries of a row must be distinct");
          }
        }
      }
    }
  }
  if (meta.kv_block_len.data) {
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t n = 0; n < d.Nkv; ++n) {
        const int32_t len = meta.kv_block_len.at(b, n);
        SA_CHECK(len >= 1 && len <= d.block, SA_ERROR_INVALID_METADATA,
                 "sparsity.kv_block_len[b=" << b << ", n=" << n << "] = " << len << ": expected [1, "
                                   << d.block << "]");
      }
    }
  }
}

void bsa_forward(const BsaFwdProblem& p) {
  const BsaDims& d = p.dims;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.Hq; ++h) {
      const int64_t hk = h / d.group();
      for (int64_t m = 0; m < d.Nq; ++m) {
        const std::vector<int64_t> block_keys = row_keys(d, p.meta, b, h, m);
        for (int64_t i = m * d.block; i < (m + 1) * d.block && i < d.Sq; ++i) {
          const std::vector<int64_t> keys = visible_keys(block_keys, p.meta.mask, i);
          std::vector<double> out(static_cast<size_t>(d.Dv), 0.0);
          double lse = neg_inf;
          if (!keys.empty()) {
            std::vector<double> s(keys.size());
            double mx = neg_inf;
            for (size_t t = 0; t < keys.size(); ++t) {
              s[t] = score(p, b, h, hk, i, keys[t]);
              mx = std::max(mx, s[t]);
            }
            double sum = 0.0;
            for (double st : s) sum += std::exp(st - mx);
            lse = mx + std::log(sum);
            for (size_t t = 0; t < keys.size(); ++t) {
              const double prob = std::exp(s[t] - lse);
              for (int64_t x = 0; x < d.Dv; ++x)
                out[static_cast<size_t>(x)] += prob * load(p.v, p.dtype, b, hk, keys[t], x);
            }
          }
          for (int64_t x = 0; x < d.Dv; ++x)
            store_from_double(p.o.data, p.dtype, p.o.offset(b, h, i, x),
                              out[static_cast<size_t>(x)]);
          p.lse[lse_offset(p.lse_stride, b, h, i)] = static_cast<float>(lse);
        }
      }
    }
  }
}

void bsa_backward(const BsaBwdProblem& p) {
  const BsaDims& d = p.dims;
  Acc dq(d.B, d.Hq, d.Sq, d.D);
  Acc dk(d.B, d.Hkv, d.Skv, d.D);
  Acc dv(d.B, d.Hkv, d.Skv, d.Dv);
  const double scale = static_cast<double>(p.scale);
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.Hq; ++h) {
      const int64_t hk = h / d.group();
      for (int64_t m = 0; m < d.Nq; ++m) {
        const std::vector<int64_t> block_keys = row_keys(d, p.meta, b, h, m);
        if (block_keys.empty()) continue;  // empty row: dq = 0, no contribution
        for (int64_t i = m * d.block; i < (m + 1) * d.block && i < d.Sq; ++i) {
          const std::vector<int64_t> keys = visible_keys(block_keys, p.meta.mask, i);
          if (keys.empty()) continue;  // the mask hides every key: dq = 0, no contribution
          const double lse = p.lse[lse_offset(p.lse_stride, b, h, i)];
          if (std::isinf(lse) && lse < 0) continue;  // empty row by its LSE
          double delta = 0.0;
          for (int64_t x = 0; x < d.Dv; ++x)
            delta += load(p.dout, p.dtype, b, h, i, x) * load(p.o, p.dtype, b, h, i, x);
          for (int64_t j : keys) {
            const double prob = softmax_prob(score(p, b, h, hk, i, j), lse);
            double dp = 0.0;
            for (int64_t x = 0; x < d.Dv; ++x)
              dp += load(p.dout, p.dtype, b, h, i, x) * load(p.v, p.dtype, b, hk, j, x);
            const double ds = prob * (dp - delta);
            for (int64_t x = 0; x < d.D; ++x) {
              dq.at(b, h, i, x) += scale * ds * load(p.k, p.dtype, b, hk, j, x);
              dk.at(b, hk, j, x) += scale * ds * load(p.q, p.dtype, b, h, i, x);
            }
            for (int64_t x = 0; x < d.Dv; ++x)
              dv.at(b, hk, j, x) += prob * load(p.dout, p.dtype, b, h, i, x);
          }
        }
      }
    }
  }
  dq.store(p.dq, p.dtype, d.B);
  dk.store(p.dk, p.dtype, d.B);
  dv.store(p.dv, p.dtype, d.B);
}

}  // namespace sa::reference
