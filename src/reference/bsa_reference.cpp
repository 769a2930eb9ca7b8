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
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/host_numeric.hpp"
#include "common/narrow.hpp"
#include "reference/reference.hpp"

namespace sa::reference {

namespace {

// The keys (local token indices of sequence `s` along S_kv) that query block m of (b, h)
// attends, in list order.
std::vector<int64_t> row_keys(const BsaDims& d, const BsaMeta& meta, const SeqSpan& s, int64_t b,
                              int64_t h, int64_t m) {
  std::vector<int64_t> keys;
  const int32_t count = meta.count(b, h, m);
  for (int32_t slot = 0; slot < count; ++slot) {
    const int64_t n = meta.q2k_index.at(b, h, m, slot);
    const int64_t first = n * d.block;
    const int64_t len = meta.block_len(b, n, d, s);
    for (int64_t j = first; j < first + len && j < s.skv; ++j) keys.push_back(j);
  }
  return keys;
}

// Query blocks of sequence s (a dense batch: Nq).
int64_t query_blocks(const BsaDims& d, const SeqSpan& s) { return ceil_div_i64(s.sq, d.block); }

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
  Acc(int64_t B, int64_t H_, int64_t S_, int64_t X_)  // packed batches: B = 1, S = T
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

// Packed batches: cu_seqlens (first 0, non-decreasing, last = total tokens), in that order,
// q then k; then each sequence's query blocks against N_q_max.
void check_cu_seqlens(const BsaDims& d, const BsaMeta& meta) {
  for (int side = 0; side < 2; ++side) {
    const int32_t* cu = side == 0 ? meta.cu_seqlens_q : meta.cu_seqlens_k;
    const int64_t stride = side == 0 ? meta.cu_stride_q : meta.cu_stride_k;
    const int64_t total = side == 0 ? d.Sq : d.Skv;
    const char* name = side == 0 ? "options.cu_seqlens_q" : "options.cu_seqlens_k";
    const char* what = side == 0 ? "T_q (q's first dim)" : "T_kv (k's first dim)";
    SA_CHECK(cu[0] == 0, SA_ERROR_INVALID_METADATA,
             name << "[0] = " << cu[0] << ": expected 0");
    for (int64_t b = 0; b < d.B; ++b) {
      const int32_t lo = cu[b * stride], hi = cu[(b + 1) * stride];
      SA_CHECK(hi >= lo, SA_ERROR_INVALID_METADATA,
               name << "[" << b + 1 << "] = " << hi << " < " << name << "[" << b << "] = " << lo
                    << ": offsets must not decrease");
    }
    SA_CHECK(cu[d.B * stride] == total, SA_ERROR_INVALID_METADATA,
             name << "[" << d.B << "] = " << cu[d.B * stride] << ": expected " << what << " = "
                  << total);
  }
  for (int64_t b = 0; b < d.B; ++b) {
    const SeqSpan s = meta.seq(b, d);
    SA_CHECK(ceil_div_i64(s.sq, d.block) <= d.Nq, SA_ERROR_INVALID_METADATA,
             "options.cu_seqlens_q: sequence " << b << " has S_q = " << s.sq << ", "
                 << ceil_div_i64(s.sq, d.block) << " query blocks of " << d.block
                 << ", more than sparsity.q2k_index's N_q_max = " << d.Nq);
  }
}

void check_bsa_metadata(const BsaDims& d, const BsaMeta& meta) {
  // Packed batches: cu_seqlens first (check_cu_seqlens). Rows in (b, h, m) order (packed: the
  // sequence's query blocks only; later rows are never read); within a row the count first,
  // then the slots in order; then the block lengths in (b, n) order. The first bad entry in
  // this order is reported.
  if (meta.varlen()) check_cu_seqlens(d, meta);
  for (int64_t b = 0; b < d.B; ++b) {
    const SeqSpan s = meta.seq(b, d);
    const int64_t nq = meta.varlen() ? ceil_div_i64(s.sq, d.block) : d.Nq;
    const int64_t nkv = meta.varlen() ? ceil_div_i64(s.skv, d.block) : d.Nkv;
    for (int64_t h = 0; h < d.Hq; ++h) {
      for (int64_t m = 0; m < nq; ++m) {
        if (meta.q2k_count.data) {
          const int32_t c = meta.q2k_count.at(b, h, m);
          SA_CHECK(c >= 0 && c <= d.Kmax, SA_ERROR_INVALID_METADATA,
                   "sparsity.q2k_count[b=" << b << ", h=" << h << ", m=" << m << "] = " << c
                                  << ": expected [0, " << d.Kmax << "]");
        }
        const int32_t count = meta.count(b, h, m);
        for (int32_t slot = 0; slot < count; ++slot) {
          const int32_t n = meta.q2k_index.at(b, h, m, slot);
          SA_CHECK(n >= 0 && n < nkv, SA_ERROR_INVALID_METADATA,
                   "sparsity.q2k_index[b=" << b << ", h=" << h << ", m=" << m << ", slot=" << slot
                                  << "] = " << n << ": expected a KV block in [0, " << nkv
                                  << ")" << (meta.varlen() ? " (local to sequence " : "")
                                  << (meta.varlen() ? std::to_string(b) + ", S_kv = " +
                                                          std::to_string(s.skv) + ")"
                                                    : std::string()));
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
    const SeqSpan sq = p.meta.seq(b, d);
    const TokenMask mask = p.meta.mask_of(sq);
    for (int64_t h = 0; h < d.Hq; ++h) {
      const int64_t hk = h / d.group();
      for (int64_t m = 0; m < query_blocks(d, sq); ++m) {
        const std::vector<int64_t> block_keys = row_keys(d, p.meta, sq, b, h, m);
        for (int64_t i = m * d.block; i < (m + 1) * d.block && i < sq.sq; ++i) {
          const std::vector<int64_t> keys = visible_keys(block_keys, mask, i);
          std::vector<double> out(static_cast<size_t>(d.Dv), 0.0);
          double lse = neg_inf;
          if (!keys.empty()) {
            std::vector<double> s(keys.size());
            double mx = neg_inf;
            for (size_t t = 0; t < keys.size(); ++t) {
              s[t] = score(p, b, h, hk, sq.q0 + i, sq.k0 + keys[t]);
              mx = std::max(mx, s[t]);
            }
            double sum = 0.0;
            for (double st : s) sum += std::exp(st - mx);
            lse = mx + std::log(sum);
            // exp(s - lse) as exp(s - mx) / sum: mx + log(sum) rounds to mx once |mx| >>
            // 2^53 log(sum) (a huge scale), which would give every tied key probability 1.
            for (size_t t = 0; t < keys.size(); ++t) {
              const double prob = std::exp(s[t] - mx) / sum;
              for (int64_t x = 0; x < d.Dv; ++x)
                out[static_cast<size_t>(x)] +=
                    prob * load(p.v, p.dtype, b, hk, sq.k0 + keys[t], x);
            }
          }
          for (int64_t x = 0; x < d.Dv; ++x)
            store_from_double(p.o.data, p.dtype, p.o.offset(b, h, sq.q0 + i, x),
                              out[static_cast<size_t>(x)]);
          p.lse[lse_offset(p.lse_stride, b, h, sq.q0 + i)] = static_cast<float>(lse);
        }
      }
    }
  }
}

void bsa_backward(const BsaBwdProblem& p) {
  const BsaDims& d = p.dims;
  // Packed batches: one buffer over all tokens (the tensors' sb is 0), indexed globally.
  const bool vl = p.meta.varlen();
  const int64_t AB = vl ? 1 : d.B;
  Acc dq(AB, d.Hq, d.Sq, d.D);
  Acc dk(AB, d.Hkv, d.Skv, d.D);
  Acc dv(AB, d.Hkv, d.Skv, d.Dv);
  const double scale = static_cast<double>(p.scale);
  for (int64_t b = 0; b < d.B; ++b) {
    const SeqSpan sq = p.meta.seq(b, d);
    const TokenMask mask = p.meta.mask_of(sq);
    const int64_t ab = vl ? 0 : b;
    for (int64_t h = 0; h < d.Hq; ++h) {
      const int64_t hk = h / d.group();
      for (int64_t m = 0; m < query_blocks(d, sq); ++m) {
        const std::vector<int64_t> block_keys = row_keys(d, p.meta, sq, b, h, m);
        if (block_keys.empty()) continue;  // empty row: dq = 0, no contribution
        for (int64_t li = m * d.block; li < (m + 1) * d.block && li < sq.sq; ++li) {
          const std::vector<int64_t> keys = visible_keys(block_keys, mask, li);
          if (keys.empty()) continue;  // the mask hides every key: dq = 0, no contribution
          const int64_t i = sq.q0 + li;  // the token along the tensors' S axis
          const double lse = p.lse[lse_offset(p.lse_stride, b, h, i)];
          if (std::isinf(lse) && lse < 0) continue;  // empty row by its LSE
          double delta = 0.0;
          for (int64_t x = 0; x < d.Dv; ++x)
            delta += load(p.dout, p.dtype, b, h, i, x) * load(p.o, p.dtype, b, h, i, x);
          for (int64_t lj : keys) {
            const int64_t j = sq.k0 + lj;
            const double prob = softmax_prob(score(p, b, h, hk, i, j), lse);
            double dp = 0.0;
            for (int64_t x = 0; x < d.Dv; ++x)
              dp += load(p.dout, p.dtype, b, h, i, x) * load(p.v, p.dtype, b, hk, j, x);
            const double ds = prob * (dp - delta);
            for (int64_t x = 0; x < d.D; ++x) {
              dq.at(ab, h, i, x) += scale * ds * load(p.k, p.dtype, b, hk, j, x);
              dk.at(ab, hk, j, x) += scale * ds * load(p.q, p.dtype, b, h, i, x);
            }
            for (int64_t x = 0; x < d.Dv; ++x)
              dv.at(ab, hk, j, x) += prob * load(p.dout, p.dtype, b, h, i, x);
          }
        }
      }
    }
  }
  dq.store(p.dq, p.dtype, AB);
  dk.store(p.dk, p.dtype, AB);
  dv.store(p.dv, p.dtype, AB);
}

}  // namespace sa::reference
