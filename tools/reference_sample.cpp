#include "reference_sample.hpp"

#include <algorithm>
#include <random>
#include <sstream>
#include <unordered_set>

#include "tool_error.hpp"

namespace sa_tool {
namespace api = sparse_attention;

namespace {

constexpr int64_t kBsaRowSamples = 8;  // query blocks
constexpr int64_t kBsaKeySamples = 2;  // KV blocks
constexpr int64_t kDsaRowSamples = 8;  // tokens
constexpr int64_t kDsaKeySamples = 4;  // keys

// min(n, total) distinct values of [0, total), in increasing order.
std::vector<int64_t> sample_distinct(int64_t total, int64_t n, std::mt19937_64& rng) {
  std::vector<int64_t> out;
  if (total <= n) {
    for (int64_t i = 0; i < total; ++i) out.push_back(i);
    return out;
  }
  std::unordered_set<int64_t> seen;
  std::uniform_int_distribution<int64_t> pick(0, total - 1);
  while (static_cast<int64_t>(out.size()) < n) {
    const int64_t i = pick(rng);
    if (seen.insert(i).second) out.push_back(i);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// As sample_distinct, but always with the last value: for BSA the last query or KV block, the one
// cut at S when S is not a multiple of the block size.
std::vector<int64_t> sample_with_last(int64_t total, int64_t n, std::mt19937_64& rng) {
  if (total <= n) return sample_distinct(total, n, rng);
  std::vector<int64_t> out = sample_distinct(total - 1, n - 1, rng);
  out.push_back(total - 1);
  return out;
}

void require(const api::Status& st, const char* what) {
  if (!st.ok())
    throw ToolError(kExitCheckFailed, std::string("the CPU reference on a sub-problem (") + what +
                                          ") failed: " + st.to_string());
}

void append(std::vector<double>& to, const sa_tensor& view) {
  const std::vector<double> v = values(view);
  to.insert(to.end(), v.begin(), v.end());
}

HostTensor nan_like(const HostTensor& t) {
  HostTensor out(t.dtype(), t.shape());
  out.fill_nan();
  return out;
}

// Elements of [b, h0, h1) x [s0, s1) of a [B, H, S] tensor.
sa_tensor lse_slice(const sa_tensor& t, int64_t b, int64_t h0, int64_t nh, int64_t s0, int64_t ns) {
  return narrow(narrow(narrow(t, 0, b, 1), 1, h0, nh), 2, s0, ns);
}

// Got and expected values of one output, gathered over the compared parts.
struct Pair {
  std::vector<double> got, want;
  void add(const sa_tensor& g, const sa_tensor& w) {
    append(got, g);
    append(want, w);
  }
};

}  // namespace

// ---- BSA ----------------------------------------------------------------------------------------
SampledComparison bsa_forward_vs_reference(BsaProblem& p, uint64_t seed) {
  return bsa_forward_vs_reference(p, seed, p.shape.mask);
}

SampledComparison bsa_forward_vs_reference(BsaProblem& p, uint64_t seed, sa_mask mask) {
  const BsaShape& s = p.shape;
  std::mt19937_64 rng(seed);
  HostTensor want_o = nan_like(p.o), want_lse = nan_like(p.lse);
  const sa_tensor q = p.q.view(), k = p.k.view(), v = p.v.view(), idx = p.q2k_index.view();
  const sa_tensor got_o = p.o.view(), got_lse = p.lse.view();
  const sa_tensor wo = want_o.view(), wl = want_lse.view();
  Pair o, lse;
  int64_t rows = 0;
  const std::vector<int64_t> picks = sample_with_last(s.B * s.Hq * s.Nq(), kBsaRowSamples, rng);
  for (int64_t r : picks) {
    const int64_t m = r % s.Nq(), h = (r / s.Nq()) % s.Hq, b = r / (s.Nq() * s.Hq);
    const int64_t s0 = m * s.block, ns = std::min<int64_t>(s.block, s.S - s0), hk = h / s.group();
    api::BsaForwardArgs a;
    a.q = s.slice(q, b, h, 1, s0, ns);
    a.k = s.slice(k, b, hk, 1, 0, s.S);
    a.v = s.slice(v, b, hk, 1, 0, s.S);
    a.sparsity.q2k_index = narrow(narrow(narrow(idx, 0, b, 1), 1, h, 1), 2, m, 1);
    if (s.causal_blocks)
      a.sparsity.q2k_count =
          narrow(narrow(narrow(p.q2k_count.view(), 0, b, 1), 1, h, 1), 2, m, 1);
    a.o = s.slice(wo, b, h, 1, s0, ns);
    a.lse = lse_slice(wl, b, h, 1, s0, ns);
    a.options = bsa_options(s);
    a.options.mask = mask;
    if (mask != SA_MASK_NONE) {
      // The sub-problem's queries start at token s0 of the whole (offset 0): its offset is s0.
      a.options.causal_offset_given = 1;
      a.options.causal_offset = s0;
    }
    a.options.impl = SA_IMPL_REFERENCE;
    require(api::bsa_forward(a), "BSA forward, one query block");
    o.add(s.slice(got_o, b, h, 1, s0, ns), a.o);
    lse.add(lse_slice(got_lse, b, h, 1, s0, ns), a.lse);
    rows += ns;
  }
  SampledComparison c;
  c.checks.push_back(rel_l2_check("o", o.got, o.want, count_nan(p.o)));
  c.checks.push_back(lse_check("lse", lse.got, lse.want, count_nan(p.lse)));
  std::ostringstream os;
  os << "fp64 CPU reference on " << picks.size() << " query blocks (b, h, m) of "
     << s.B * s.Hq * s.Nq() << ": " << rows << " of " << s.B * s.Hq * s.S << " rows";
  c.what = os.str();
  return c;
}

SampledComparison bsa_backward_vs_reference(BsaProblem& p, uint64_t seed) {
  const BsaShape& s = p.shape;
  const int64_t g = s.group();
  std::mt19937_64 rng(seed);
  HostTensor want_dq = nan_like(p.dq), want_dk = nan_like(p.dk), want_dv = nan_like(p.dv);
  const sa_tensor q = p.q.view(), k = p.k.view(), v = p.v.view(), idx = p.q2k_index.view();
  const sa_tensor o = p.o.view(), lse = p.lse.view(), dout = p.dout.view();
  Pair dq, dk, dv;

  // dq: one query block per sub-problem (its dk/dv are partial sums: discarded).
  HostTensor scratch_dk(p.dk.dtype(), s.physical(1, 1, s.S, s.D));
  HostTensor scratch_dv(p.dv.dtype(), s.physical(1, 1, s.S, s.D));
  int64_t rows = 0;
  const std::vector<int64_t> row_picks = sample_with_last(s.B * s.Hq * s.Nq(), kBsaRowSamples, rng);
  for (int64_t r : row_picks) {
    const int64_t m = r % s.Nq(), h = (r / s.Nq()) % s.Hq, b = r / (s.Nq() * s.Hq);
    const int64_t s0 = m * s.block, ns = std::min<int64_t>(s.block, s.S - s0), hk = h / g;
    api::BsaBackwardArgs a;
    a.q = s.slice(q, b, h, 1, s0, ns);
    a.k = s.slice(k, b, hk, 1, 0, s.S);
    a.v = s.slice(v, b, hk, 1, 0, s.S);
    a.o = s.slice(o, b, h, 1, s0, ns);
    a.lse = lse_slice(lse, b, h, 1, s0, ns);
    a.dout = s.slice(dout, b, h, 1, s0, ns);
    a.sparsity.q2k_index = narrow(narrow(narrow(idx, 0, b, 1), 1, h, 1), 2, m, 1);
    a.dq = s.slice(want_dq.view(), b, h, 1, s0, ns);
    a.dk = scratch_dk.view();
    a.dv = scratch_dv.view();
    a.options = bsa_options(s);
    a.options.impl = SA_IMPL_REFERENCE;
    require(api::bsa_backward(a), "BSA backward, one query block");
    dq.add(s.slice(p.dq.view(), b, h, 1, s0, ns), a.dq);
    rows += ns;
  }

  // dk, dv: one KV block per sub-problem, with every query block of the group that lists it.
  HostTensor sub_idx(SA_DTYPE_INT32, {1, g, s.Nq(), 1});  // all 0: the one KV block
  HostTensor sub_count(SA_DTYPE_INT32, {1, g, s.Nq()});
  HostTensor scratch_dq(p.dq.dtype(), s.physical(1, g, s.S, s.D));
  const std::vector<int64_t> key_picks =
      sample_with_last(s.B * s.Hkv * s.Nkv(), kBsaKeySamples, rng);
  int64_t listing_rows = 0;
  for (int64_t r : key_picks) {
    const int64_t n = r % s.Nkv(), hk = (r / s.Nkv()) % s.Hkv, b = r / (s.Nkv() * s.Hkv);
    const int64_t k0 = n * s.block, len = s.key_block_len(n);
    for (int64_t hh = 0; hh < g; ++hh) {
      for (int64_t m = 0; m < s.Nq(); ++m) {
        int32_t lists = 0;
        for (int64_t slot = 0; slot < s.count(); ++slot)
          lists |= p.block_at(b, hk * g + hh, m, slot) == n ? 1 : 0;
        sub_count.i32()[hh * s.Nq() + m] = lists;
        listing_rows += lists;
      }
    }
    api::BsaBackwardArgs a;
    a.q = s.slice(q, b, hk * g, g, 0, s.S);
    a.k = s.slice(k, b, hk, 1, k0, len);
    a.v = s.slice(v, b, hk, 1, k0, len);
    a.o = s.slice(o, b, hk * g, g, 0, s.S);
    a.lse = lse_slice(lse, b, hk * g, g, 0, s.S);
    a.dout = s.slice(dout, b, hk * g, g, 0, s.S);
    a.sparsity.q2k_index = sub_idx.view();
    a.sparsity.q2k_count = sub_count.view();
    a.dq = scratch_dq.view();
    a.dk = s.slice(want_dk.view(), b, hk, 1, k0, len);
    a.dv = s.slice(want_dv.view(), b, hk, 1, k0, len);
    a.options = bsa_options(s);
    a.options.impl = SA_IMPL_REFERENCE;
    require(api::bsa_backward(a), "BSA backward, one KV block");
    dk.add(s.slice(p.dk.view(), b, hk, 1, k0, len), a.dk);
    dv.add(s.slice(p.dv.view(), b, hk, 1, k0, len), a.dv);
  }

  SampledComparison c;
  c.checks.push_back(rel_l2_check("dq", dq.got, dq.want, count_nan(p.dq)));
  c.checks.push_back(rel_l2_check("dk", dk.got, dk.want, count_nan(p.dk)));
  c.checks.push_back(rel_l2_check("dv", dv.got, dv.want, count_nan(p.dv)));
  std::ostringstream os;
  os << "fp64 CPU reference on sub-problems: dq on " << row_picks.size() << " query blocks ("
     << rows << " of " << s.B * s.Hq * s.S << " rows); dk, dv on " << key_picks.size()
     << " KV blocks (b, h_kv, n) of " << s.B * s.Hkv * s.Nkv() << ", summed over the "
     << listing_rows << " query blocks that list them (random blocks "
     << "and the last one)";
  c.what = os.str();
  return c;
}

// ---- DSA ----------------------------------------------------------------------------------------
namespace {

// Views of token t's part of the row-indexed DSA tensors.
sa_tensor row(HostTensor& t, int64_t i) { return narrow(t.view(), 0, i, 1); }
sa_tensor optional_row(HostTensor& t, int64_t i) {
  return t.present() ? row(t, i) : sa_tensor_none();
}

}  // namespace

SampledComparison dsa_forward_vs_reference(DsaProblem& p, uint64_t seed) {
  const DsaShape& s = p.shape;
  std::mt19937_64 rng(seed);
  HostTensor want_out = nan_like(p.out), want_lse = nan_like(p.lse);
  Pair out, lse;
  const std::vector<int64_t> tokens = sample_distinct(s.Sq, kDsaRowSamples, rng);
  for (int64_t t : tokens) {
    api::DsaForwardArgs a;
    a.q = row(p.q, t);
    a.kv = p.kv.view();
    a.topk_idx = row(p.topk_idx, t);
    a.topk_length = optional_row(p.topk_length, t);
    a.sink = p.sink.view();
    a.out = row(want_out, t);
    a.lse = row(want_lse, t);
    a.options = dsa_options(s);
    a.options.impl = SA_IMPL_REFERENCE;
    require(api::dsa_forward(a), "DSA forward, one token");
    out.add(row(p.out, t), a.out);
    lse.add(row(p.lse, t), a.lse);
  }
  SampledComparison c;
  c.checks.push_back(rel_l2_check("out", out.got, out.want, count_nan(p.out)));
  c.checks.push_back(lse_check("lse", lse.got, lse.want, count_nan(p.lse)));
  std::ostringstream os;
  os << "fp64 CPU reference on " << tokens.size() << " random tokens of " << s.Sq << " (all heads)";
  c.what = os.str();
  return c;
}

SampledComparison dsa_backward_vs_reference(DsaProblem& p, uint64_t seed) {
  const DsaShape& s = p.shape;
  std::mt19937_64 rng(seed);
  HostTensor want_dq = nan_like(p.dq), want_dkv = nan_like(p.dkv), want_ds = nan_like(p.d_sink);
  HostTensor scratch_dkv(p.dkv.dtype(), p.dkv.shape());
  HostTensor scratch_ds(SA_DTYPE_FP32, {s.H});
  Pair dq, dkv, d_sink;
  auto options = [&] {
    api::DsaOptions o = dsa_options(s);
    o.impl = SA_IMPL_REFERENCE;
    return o;
  };

  // dq: one token per sub-problem (its dkv and d_sink are partial sums: discarded).
  const std::vector<int64_t> tokens = sample_distinct(s.Sq, kDsaRowSamples, rng);
  for (int64_t t : tokens) {
    api::DsaBackwardArgs a;
    a.q = row(p.q, t);
    a.kv = p.kv.view();
    a.topk_idx = row(p.topk_idx, t);
    a.topk_length = optional_row(p.topk_length, t);
    a.sink = p.sink.view();
    a.out = row(p.out, t);
    a.lse = row(p.lse, t);
    a.dout = row(p.dout, t);
    a.dq = row(want_dq, t);
    a.dkv = scratch_dkv.view();
    a.d_sink = scratch_ds.view();
    a.options = options();
    require(api::dsa_backward(a), "DSA backward, one token");
    dq.add(row(p.dq, t), a.dq);
  }

  // dkv: one key per sub-problem, kv[j] alone, with every active slot that holds it.
  std::vector<int64_t> selected;  // keys some active slot holds, each once
  {
    std::vector<bool> seen(static_cast<size_t>(s.Skv), false);
    for (int64_t t = 0; t < s.Sq; ++t)
      for (int64_t i = 0; i < s.topk; ++i)
        if (p.active(t, i) && !seen[static_cast<size_t>(p.index(t, i))]) {
          seen[static_cast<size_t>(p.index(t, i))] = true;
          selected.push_back(p.index(t, i));
        }
  }
  std::sort(selected.begin(), selected.end());
  HostTensor scratch_dq(p.dq.dtype(), p.dq.shape());
  HostTensor sub_idx(SA_DTYPE_INT32, {s.Sq, s.topk});
  const std::vector<int64_t> key_picks =
      sample_distinct(static_cast<int64_t>(selected.size()), kDsaKeySamples, rng);
  for (int64_t pick : key_picks) {
    const int64_t j = selected[static_cast<size_t>(pick)];
    for (int64_t t = 0; t < s.Sq; ++t)
      for (int64_t i = 0; i < s.topk; ++i)
        sub_idx.i32()[t * s.topk + i] = p.active(t, i) && p.index(t, i) == j ? 0 : -1;
    api::DsaBackwardArgs a;
    a.q = p.q.view();
    a.kv = row(p.kv, j);
    a.topk_idx = sub_idx.view();
    a.sink = p.sink.view();
    a.out = p.out.view();
    a.lse = p.lse.view();
    a.dout = p.dout.view();
    a.dq = scratch_dq.view();
    a.dkv = row(want_dkv, j);
    a.d_sink = scratch_ds.view();
    a.options = options();
    require(api::dsa_backward(a), "DSA backward, one key");
    dkv.add(row(p.dkv, j), a.dkv);
  }

  // d_sink: kv[0] alone, one slot for every non-empty row.
  {
    HostTensor one_slot(SA_DTYPE_INT32, {s.Sq, 1});
    for (int64_t t = 0; t < s.Sq; ++t) one_slot.i32()[t] = p.row_empty(t) ? -1 : 0;
    HostTensor one_key_dkv(p.dkv.dtype(), {1, s.Dqk});
    api::DsaBackwardArgs a;
    a.q = p.q.view();
    a.kv = row(p.kv, 0);
    a.topk_idx = one_slot.view();
    a.sink = p.sink.view();
    a.out = p.out.view();
    a.lse = p.lse.view();
    a.dout = p.dout.view();
    a.dq = scratch_dq.view();
    a.dkv = one_key_dkv.view();
    a.d_sink = want_ds.view();
    a.options = options();
    require(api::dsa_backward(a), "DSA backward, d_sink");
    d_sink.add(p.d_sink.view(), want_ds.view());
  }

  SampledComparison c;
  c.checks.push_back(rel_l2_check("dq", dq.got, dq.want, count_nan(p.dq)));
  c.checks.push_back(rel_l2_check("dkv", dkv.got, dkv.want, count_nan(p.dkv)));
  c.checks.push_back(rel_l2_check("d_sink", d_sink.got, d_sink.want, count_nan(p.d_sink)));
  std::ostringstream os;
  os << "fp64 CPU reference on sub-problems: dq on " << tokens.size() << " random tokens of "
     << s.Sq << "; dkv on " << key_picks.size() << " random selected keys of " << s.Skv
     << " (every slot that selects them); d_sink on every head from all rows";
  c.what = os.str();
  return c;
}

}  // namespace sa_tool
