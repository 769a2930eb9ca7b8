// The bench's lightning-indexer operations (SPEC 5): indexer_scores, indexer_topk, indexer_loss.
//
//   sparse-attention bench --op indexer_topk --seq 32768 --indexer-heads 64 --topk 2048
//   sparse-attention bench --op indexer_loss --seq 4096 --dsa-heads 128 --dsa-dqk 576
//   sparse-attention bench --op indexer_loss --loss-mode dense --seq 8192
//
// One random problem per operation: q_I [S, H_I, 128] and k_I [S, 128] bf16 uniform in [-1, 1],
// w [S, H_I] fp32 uniform in [-1, 1], causal ranges (k_start = 0, k_end = t + 1) unless
// --causal off. The loss adds the attention's q [S, H, D_qk] and kv [S, D_qk] (bf16, uniform)
// and its lse:
//   sparse  topk_idx / topk_length from our indexer_topk on these inputs, lse from our DSA
//           forward on them (the pipeline of a DSA training step);
//   dense   lse[t, h] = log |range of t|: the dense attention's LSE for these inputs up to the
//           small mean of their scores (|s| ~ 0.3); the loss is defined for any lse, its cost
//           does not depend on the values, and the check uses the same lse.
//
// FLOPs (BENCHMARKING.md, useful work only; "pairs" are the (query, key) pairs the call reads:
// with causal ranges the triangle s <= t, S (S + 1) / 2 pairs, not S^2):
//   scores, topk  2 * H_I * D_I per in-range pair (the selection is not counted);
//   sparse loss   per active in-range top-k slot: 2 * H * D_qk (the target) + 2 * H_I * D_I (the
//                 indexer's logits) + 4 * H_I * D_I (dq_I and dk_I);
//   dense loss    the same per in-range pair.
//
// Checks before timing (outputs poisoned with NaN), against the fp64 reference through the
// public API on exact sub-problems (one query row with the whole k_I / kv):
//   scores  sampled rows: max error within 1e-4 of the largest |score|, -inf outside the range;
//   topk    sampled rows: the rule's structure (length min(k, |range|), keys increasing and in
//           range, then -1) and near-optimality against the reference's scores (a chosen key
//           scores within 2e-4 of the largest |score| below the k-th best);
//   loss    sampled rows: per-token terms, dq_I and dw rows (rel L2); with causal ranges the last
//           two keys' dk_I rows (only the last two queries reach them); loss = sum of the
//           per-token terms.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_ops.hpp"
#include "calls.hpp"
#include "demo.hpp"
#include "testing/host_tensor.hpp"
#include "tool_error.hpp"

namespace sa_tool {
namespace api = sparse_attention;

namespace {

constexpr int64_t kDI = 128;  // SPEC 5's D_I

struct IndexerBenchShape {
  int64_t S = 8192, HI = 64, topk = 2048, H = 128, Dqk = 576;
  bool causal = true;
  bool loss = false, dense = false;

  std::string describe() const {
    std::ostringstream os;
    os << "S " << S << ", H_I " << HI << ", D_I " << kDI << (causal ? ", causal" : ", full ranges");
    if (!loss || !dense) os << ", topk " << topk;
    if (loss) os << ", attention H " << H << " D_qk " << Dqk << (dense ? ", dense" : ", sparse");
    return os.str();
  }
  std::string json() const {
    std::ostringstream os;
    os << "{\"S\": " << S << ", \"H_I\": " << HI << ", \"D_I\": " << kDI
       << ", \"causal\": " << (causal ? "true" : "false");
    if (!loss || !dense) os << ", \"topk\": " << topk;
    if (loss) os << ", \"H\": " << H << ", \"D_qk\": " << Dqk;
    os << "}";
    return os.str();
  }
};

IndexerBenchShape bench_shape(const std::string& op, const DemoOptions& o) {
  if (o.dtype != SA_DTYPE_BF16)
    throw ToolError(kExitBadArgument, "--dtype: the indexer's GPU contract is bf16 (SPEC 5)");
  IndexerBenchShape s;
  s.loss = op == "indexer_loss";
  s.dense = s.loss && o.dense_loss;
  s.S = o.seq.value_or(s.loss ? 4096 : 8192);
  s.HI = o.indexer_heads.value_or(s.HI);
  s.topk = o.topk.value_or(s.topk);
  s.H = o.dsa_heads.value_or(s.H);
  s.Dqk = o.dsa_dqk.value_or(s.Dqk);
  s.causal = o.causal;
  return s;
}

// Uniform in [lo, hi) from a generator seeded with `seed`, rounded to t's dtype.
void fill_uniform(HostTensor& t, double lo, double hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  t.fill_uniform(rng, lo, hi);
}

// Rows [r0, r0 + n) of a host tensor's view.
sa_tensor rows(HostTensor& t, int64_t r0, int64_t n) { return narrow(t.view(), 0, r0, n); }
sa_tensor rows(const sa_tensor& t, int64_t r0, int64_t n) { return narrow(t, 0, r0, n); }

// Rows [r0, r0 + n) of t as a new fp64 tensor (the reference then computes and returns fp64).
HostTensor rows_fp64(const HostTensor& t, int64_t r0, int64_t n) {
  std::vector<int64_t> shape = t.shape();
  const int64_t per_row = t.numel() / shape[0];
  shape[0] = n;
  HostTensor out(SA_DTYPE_FP64, shape);
  for (int64_t i = 0; i < n * per_row; ++i) out.set(i, t.get(r0 * per_row + i));
  return out;
}

// A device tensor's rows [r0, r0 + n) on the host.
HostTensor download_rows(const sa_tensor& dev, int64_t r0, int64_t n) {
  std::vector<int64_t> shape(dev.shape, dev.shape + dev.rank);
  shape[0] = n;
  HostTensor host(dev.dtype, shape);
  download(rows(dev, r0, n), host);
  return host;
}

// `count` distinct rows of [0, S), in increasing order, always with the last one.
std::vector<int64_t> sample_rows(int64_t S, int64_t count, uint64_t seed) {
  std::vector<int64_t> out = {S - 1};
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, S - 1);
  for (int tries = 0; static_cast<int64_t>(out.size()) < std::min(count, S) && tries < 1000; ++tries) {
    const int64_t t = pick(rng);
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The problem: host inputs (the reference's sub-problems read them), device copies, outputs.
struct IndexerBenchProblem {
  IndexerBenchShape shape;
  HostTensor q_I, k_I, w, k_start, k_end;  // ranges absent without --causal
  HostTensor q, kv, lse;                   // the loss's attention inputs
  HostTensor topk_idx, topk_length;        // the sparse loss's key lists (our top-k)
  struct {
    sa_tensor q_I, k_I, w, k_start, k_end, q, kv, lse, topk_idx, topk_length;
  } in;
  struct {
    sa_tensor scores, topk_idx, topk_length, loss, per_token, dq_I, dk_I, dw;
  } out;

  int64_t begin(int64_t) const { return 0; }  // causal and full ranges both start at key 0
  int64_t end(int64_t t) const { return shape.causal ? t + 1 : shape.S; }
  // (query, key) pairs in range.
  double range_pairs() const {
    const double S = static_cast<double>(shape.S);
    return shape.causal ? S * (S + 1) / 2 : S * S;
  }
  // Active top-k slots in range (the sparse loss's pairs).
  double active_pairs() const {
    double n = 0;
    for (int64_t t = 0; t < shape.S; ++t) {
      const int32_t len = std::min<int32_t>(topk_length.i32()[t], static_cast<int32_t>(shape.topk));
      for (int64_t i = 0; i < len; ++i) {
        const int32_t s = topk_idx.i32()[t * shape.topk + i];
        n += (s >= begin(t) && s < end(t)) ? 1 : 0;
      }
    }
    return n;
  }
};

api::IndexerScoresArgs scores_args(const IndexerBenchProblem& p) {
  api::IndexerScoresArgs a;
  a.q_I = p.in.q_I;
  a.k_I = p.in.k_I;
  a.w = p.in.w;
  a.k_start = p.in.k_start;
  a.k_end = p.in.k_end;
  a.scores = p.out.scores;
  return a;
}

api::IndexerTopkArgs topk_args(const IndexerBenchProblem& p, sa_tensor idx, sa_tensor len) {
  api::IndexerTopkArgs a;
  a.q_I = p.in.q_I;
  a.k_I = p.in.k_I;
  a.w = p.in.w;
  a.k_start = p.in.k_start;
  a.k_end = p.in.k_end;
  a.topk_idx = idx;
  a.topk_length = len;
  return a;
}

api::IndexerLossArgs loss_args(const IndexerBenchProblem& p) {
  api::IndexerLossArgs a;
  a.q_I = p.in.q_I;
  a.k_I = p.in.k_I;
  a.w = p.in.w;
  a.q = p.in.q;
  a.kv = p.in.kv;
  a.lse = p.in.lse;
  a.topk_idx = p.shape.dense ? sa_tensor_none() : p.in.topk_idx;
  a.topk_length = p.shape.dense ? sa_tensor_none() : p.in.topk_length;
  a.k_start = p.in.k_start;
  a.k_end = p.in.k_end;
  a.loss = p.out.loss;
  a.loss_per_token = p.out.per_token;
  a.dq_I = p.out.dq_I;
  a.dk_I = p.out.dk_I;
  a.dw = p.out.dw;
  return a;
}

// One run of the library's call on the device, with its queried workspace (setting up inputs).
template <class Args, class Size, class Call>
void run_once(const Args& a, Size size, Call call, DeviceArena& arena, const char* what) {
  size_t bytes = 0;
  check_call(size(a, &bytes), what);
  sa_context ctx = api::context();
  ctx.workspace = arena.allocate(bytes);
  ctx.workspace_bytes = bytes;
  check_call(call(a, ctx), what);
  synchronize();
}

std::shared_ptr<IndexerBenchProblem> make_problem(const IndexerBenchShape& sh, uint64_t seed,
                                                  DeviceArena& arena) {
  auto p = std::make_shared<IndexerBenchProblem>();
  p->shape = sh;
  const int64_t S = sh.S;
  p->q_I = HostTensor(SA_DTYPE_BF16, {S, sh.HI, kDI});
  p->k_I = HostTensor(SA_DTYPE_BF16, {S, kDI});
  p->w = HostTensor(SA_DTYPE_FP32, {S, sh.HI});
  fill_uniform(p->q_I, -1, 1, seed * 7 + 1);
  fill_uniform(p->k_I, -1, 1, seed * 7 + 2);
  fill_uniform(p->w, -1, 1, seed * 7 + 3);
  if (sh.causal) {
    p->k_start = HostTensor(SA_DTYPE_INT32, {S});
    p->k_end = HostTensor(SA_DTYPE_INT32, {S});
    for (int64_t t = 0; t < S; ++t) {
      p->k_start.i32()[t] = 0;
      p->k_end.i32()[t] = static_cast<int32_t>(t + 1);
    }
  }
  p->in.q_I = arena.upload(p->q_I);
  p->in.k_I = arena.upload(p->k_I);
  p->in.w = arena.upload(p->w);
  p->in.k_start = p->k_start.present() ? arena.upload(p->k_start) : sa_tensor_none();
  p->in.k_end = p->k_end.present() ? arena.upload(p->k_end) : sa_tensor_none();
  if (!sh.loss) return p;

  p->q = HostTensor(SA_DTYPE_BF16, {S, sh.H, sh.Dqk});
  p->kv = HostTensor(SA_DTYPE_BF16, {S, sh.Dqk});
  fill_uniform(p->q, -1, 1, seed * 7 + 4);
  fill_uniform(p->kv, -1, 1, seed * 7 + 5);
  p->in.q = arena.upload(p->q);
  p->in.kv = arena.upload(p->kv);
  p->lse = HostTensor(SA_DTYPE_FP32, {S, sh.H});
  if (sh.dense) {
    for (int64_t t = 0; t < S; ++t)
      for (int64_t h = 0; h < sh.H; ++h)
        p->lse.set(t * sh.H + h, std::log(static_cast<double>(p->end(t) - p->begin(t))));
    p->in.lse = arena.upload(p->lse);
  } else {
    // Our top-k on these inputs, then our DSA forward on it for the lse (sink excluded).
    p->in.topk_idx = arena.tensor(SA_DTYPE_INT32, {S, sh.topk});
    p->in.topk_length = arena.tensor(SA_DTYPE_INT32, {S});
    run_once(topk_args(*p, p->in.topk_idx, p->in.topk_length), api::indexer_topk_workspace_size,
             [](const auto& a, const sa_context& c) { return api::indexer_topk(a, c); }, arena,
             "indexer_topk (the sparse loss's key lists)");
    p->topk_idx = HostTensor(SA_DTYPE_INT32, {S, sh.topk});
    p->topk_length = HostTensor(SA_DTYPE_INT32, {S});
    download(p->in.topk_idx, p->topk_idx);
    download(p->in.topk_length, p->topk_length);
    api::DsaForwardArgs f;
    f.q = p->in.q;
    f.kv = p->in.kv;
    f.topk_idx = p->in.topk_idx;
    f.topk_length = p->in.topk_length;
    f.out = arena.tensor(SA_DTYPE_BF16, {S, sh.H, 512});
    f.lse = p->in.lse = arena.tensor(SA_DTYPE_FP32, {S, sh.H});
    f.options.d_v = 512;
    run_once(f, api::dsa_forward_workspace_size,
             [](const auto& a, const sa_context& c) { return api::dsa_forward(a, c); }, arena,
             "dsa_fwd (the sparse loss's lse)");
    download(p->in.lse, p->lse);
  }
  p->out.loss = arena.tensor(SA_DTYPE_FP32, {1});
  p->out.loss.rank = 0;  // a scalar
  p->out.per_token = arena.tensor(SA_DTYPE_FP32, {S});
  p->out.dq_I = arena.tensor(SA_DTYPE_BF16, {S, sh.HI, kDI});
  p->out.dk_I = arena.tensor(SA_DTYPE_BF16, {S, kDI});
  p->out.dw = arena.tensor(SA_DTYPE_FP32, {S, sh.HI});
  return p;
}

// ---- the reference on sub-problems --------------------------------------------------------------
void require(const api::Status& st, const char* what) {
  if (!st.ok())
    throw ToolError(kExitCheckFailed, std::string("the CPU reference on a sub-problem (") + what +
                                          ") failed: " + st.to_string());
}

api::IndexerOptions reference_options() {
  api::IndexerOptions o;
  o.impl = SA_IMPL_REFERENCE;
  return o;
}

// The reference's scores of row t (fp32, [1, S]).
HostTensor reference_scores_row(IndexerBenchProblem& p, int64_t t) {
  HostTensor out(SA_DTYPE_FP32, {1, p.shape.S});
  out.fill_nan();
  api::IndexerScoresArgs a;
  a.q_I = rows(p.q_I, t, 1);
  a.k_I = p.k_I.view();
  a.w = rows(p.w, t, 1);
  a.k_start = p.k_start.present() ? rows(p.k_start, t, 1) : sa_tensor_none();
  a.k_end = p.k_end.present() ? rows(p.k_end, t, 1) : sa_tensor_none();
  a.scores = out.view();
  a.options = reference_options();
  require(api::indexer_scores(a), "indexer scores, one query");
  return out;
}

void append(std::vector<double>& to, const sa_tensor& view) {
  const std::vector<double> v = values(view);
  to.insert(to.end(), v.begin(), v.end());
}

int64_t samples(const IndexerBenchShape& s) { return s.S > 32768 ? 3 : 8; }

std::vector<Check> check_scores(IndexerBenchProblem& p, uint64_t seed) {
  std::vector<double> got, want;
  int64_t nan = 0;
  for (int64_t t : sample_rows(p.shape.S, samples(p.shape), seed)) {
    HostTensor g = download_rows(p.out.scores, t, 1);
    nan += count_nan(g);
    append(got, g.view());
    HostTensor w = reference_scores_row(p, t);
    append(want, w.view());
  }
  return {max_rel_check("scores", got, want, nan, kScoreTolerance)};
}

std::vector<Check> check_topk(IndexerBenchProblem& p, uint64_t seed) {
  const int64_t k = p.shape.topk;
  HostTensor len(SA_DTYPE_INT32, {p.shape.S});
  download(p.out.topk_length, len);
  int64_t violations = 0, compared = 0;
  double regret = 0;
  for (int64_t t : sample_rows(p.shape.S, samples(p.shape), seed)) {
    HostTensor idx = download_rows(p.out.topk_idx, t, 1);
    const int32_t* row = idx.i32();
    const int64_t lo = p.begin(t), hi = p.end(t);
    const int64_t n = std::min<int64_t>(k, hi - lo);
    compared += k + 1;
    violations += len.i32()[t] != n;
    for (int64_t i = 0; i < k; ++i) {
      const bool chosen = i < n;
      violations += chosen ? (row[i] < lo || row[i] >= hi || (i > 0 && row[i] <= row[i - 1]))
                           : row[i] != -1;
    }
    // Near-optimality against the reference's scores of the row.
    HostTensor ref = reference_scores_row(p, t);
    std::vector<double> in_range;
    double largest = 1e-30;
    for (int64_t s = lo; s < hi; ++s) {
      in_range.push_back(ref.get(s));
      largest = std::max(largest, std::fabs(ref.get(s)));
    }
    if (n == 0) continue;
    std::nth_element(in_range.begin(), in_range.begin() + (n - 1), in_range.end(),
                     std::greater<double>());
    const double kth = in_range[static_cast<size_t>(n - 1)];
    for (int64_t i = 0; i < n; ++i)
      if (row[i] >= lo && row[i] < hi)
        regret = std::max(regret, (kth - ref.get(row[i])) / largest);
  }
  return {count_check("topk rule", violations, compared),
          relative_error_check("topk regret", regret, compared, kTopkRegretTolerance)};
}

// The reference on queries [r0, r0 + n) with the whole k_I and kv (fp64 copies): per-token terms,
// dq_I, dk_I (complete for the keys only these queries reach) and dw.
struct LossRows {
  HostTensor per_token, dq_I, dk_I, dw;
};

LossRows reference_loss_rows(IndexerBenchProblem& p, HostTensor& k_I64, HostTensor& kv64,
                             int64_t r0, int64_t n) {
  const IndexerBenchShape& s = p.shape;
  HostTensor q_I = rows_fp64(p.q_I, r0, n), q = rows_fp64(p.q, r0, n);
  HostTensor w = rows_fp64(p.w, r0, n);
  LossRows out{HostTensor(SA_DTYPE_FP64, {n}), HostTensor(SA_DTYPE_FP64, {n, s.HI, kDI}),
               HostTensor(SA_DTYPE_FP64, {s.S, kDI}), HostTensor(SA_DTYPE_FP64, {n, s.HI})};
  HostTensor loss(SA_DTYPE_FP64, {1});
  api::IndexerLossArgs a;
  a.q_I = q_I.view();
  a.k_I = k_I64.view();
  a.w = w.view();
  a.q = q.view();
  a.kv = kv64.view();
  a.lse = rows(p.lse, r0, n);
  if (!s.dense) {
    a.topk_idx = rows(p.topk_idx, r0, n);
    a.topk_length = rows(p.topk_length, r0, n);
  }
  a.k_start = p.k_start.present() ? rows(p.k_start, r0, n) : sa_tensor_none();
  a.k_end = p.k_end.present() ? rows(p.k_end, r0, n) : sa_tensor_none();
  a.loss = loss.view();
  a.loss.rank = 0;
  a.loss_per_token = out.per_token.view();
  a.dq_I = out.dq_I.view();
  a.dk_I = out.dk_I.view();
  a.dw = out.dw.view();
  a.options = reference_options();
  require(api::indexer_loss(a), "indexer loss, sampled queries");
  return out;
}

std::vector<Check> check_loss(IndexerBenchProblem& p, uint64_t seed) {
  const IndexerBenchShape& s = p.shape;
  HostTensor k_I64 = rows_fp64(p.k_I, 0, s.S), kv64 = rows_fp64(p.kv, 0, s.S);
  HostTensor per_token(SA_DTYPE_FP32, {s.S}), loss(SA_DTYPE_FP32, {1});
  download(p.out.per_token, per_token);
  download(p.out.loss, loss);
  std::vector<double> tok_got, tok_want, dq_got, dq_want, dw_got, dw_want, dk_got, dk_want;
  int64_t nan = count_nan(per_token);
  for (int64_t t : sample_rows(s.S, s.dense ? 4 : 6, seed)) {
    LossRows r = reference_loss_rows(p, k_I64, kv64, t, 1);
    tok_got.push_back(per_token.get(t));
    tok_want.push_back(r.per_token.get(0));
    HostTensor dq = download_rows(p.out.dq_I, t, 1), dw = download_rows(p.out.dw, t, 1);
    nan += count_nan(dq) + count_nan(dw);
    append(dq_got, dq.view());
    append(dq_want, r.dq_I.view());
    append(dw_got, dw.view());
    append(dw_want, r.dw.view());
  }
  std::vector<Check> checks = {rel_l2_check("loss/tok", tok_got, tok_want, nan),
                               rel_l2_check("dq_I", dq_got, dq_want, nan),
                               rel_l2_check("dw", dw_got, dw_want, nan)};
  if (s.causal && s.S >= 2) {
    // Keys S-2 and S-1 are in the ranges of queries S-2 and S-1 only.
    LossRows r = reference_loss_rows(p, k_I64, kv64, s.S - 2, 2);
    HostTensor dk = download_rows(p.out.dk_I, s.S - 2, 2);
    append(dk_got, dk.view());
    append(dk_want, rows(r.dk_I, s.S - 2, 2));
    checks.push_back(rel_l2_check("dk_I", dk_got, dk_want, count_nan(dk)));
  }
  // The loss is the sum of the per-token terms (both from the GPU call).
  double sum = 0, magnitude = 0;
  for (int64_t t = 0; t < s.S; ++t) {
    sum += per_token.get(t);
    magnitude += std::fabs(per_token.get(t));
  }
  checks.push_back(relative_error_check("loss=sum", std::fabs(loss.get(0) - sum) /
                                                        std::max(magnitude, 1e-30),
                                        s.S, kScoreTolerance));
  if (std::isnan(loss.get(0))) checks.back().nan = 1;
  return checks;
}

}  // namespace

OpSetup indexer_setup(const std::string& op, const DemoOptions& demo, DeviceArena& arena) {
  const IndexerBenchShape shape = bench_shape(op, demo);
  std::cout << "[" << op << "] " << shape.describe() << "\n";
  auto p = make_problem(shape, demo.seed, arena);
  OpSetup setup;
  setup.shape_json = shape.json();
  const double indexer_pair = 2.0 * static_cast<double>(shape.HI * kDI);
  const uint64_t seed = demo.seed;
  if (op == "indexer_scores") {
    setup.op = op;
    p->out.scores = arena.tensor(SA_DTYPE_FP32, {shape.S, shape.S});
    setup.flops = indexer_pair * p->range_pairs();
    setup.make = [p](const BenchVariant& v) {
      Subject s;
      s.variant = v;
      auto a = std::make_shared<api::IndexerScoresArgs>(scores_args(*p));
      apply(v, &a->options.impl, nullptr, nullptr);
      s.run = [a](const sa_context& c) { return api::indexer_scores(*a, c); };
      s.workspace_size = [a](size_t* b) { return api::indexer_scores_workspace_size(*a, b); };
      return s;
    };
    setup.check = [p, seed](Subject& s) {
      poison(p->out.scores);
      check_call(s.run(context_of(s)), s.variant.label);
      synchronize();
      const std::vector<Check> checks = check_scores(*p, seed);
      s.max_rel_l2 = worst(checks, &s.ok);
      report_failures(s, checks);
    };
  } else if (op == "indexer_topk") {
    setup.op = op;
    p->out.topk_idx = arena.tensor(SA_DTYPE_INT32, {shape.S, shape.topk});
    p->out.topk_length = arena.tensor(SA_DTYPE_INT32, {shape.S});
    setup.flops = indexer_pair * p->range_pairs();
    setup.make = [p](const BenchVariant& v) {
      Subject s;
      s.variant = v;
      auto a = std::make_shared<api::IndexerTopkArgs>(
          topk_args(*p, p->out.topk_idx, p->out.topk_length));
      apply(v, &a->options.impl, nullptr, nullptr);
      s.run = [a](const sa_context& c) { return api::indexer_topk(*a, c); };
      s.workspace_size = [a](size_t* b) { return api::indexer_topk_workspace_size(*a, b); };
      return s;
    };
    setup.check = [p, seed](Subject& s) {
      poison(p->out.topk_idx);  // all bits set: -1, which every slot past the length must hold
      poison(p->out.topk_length);
      check_call(s.run(context_of(s)), s.variant.label);
      synchronize();
      const std::vector<Check> checks = check_topk(*p, seed);
      s.max_rel_l2 = worst(checks, &s.ok);
      report_failures(s, checks);
    };
  } else {
    setup.op = shape.dense ? "indexer_loss_dense" : "indexer_loss_sparse";
    const double per_pair = 2.0 * static_cast<double>(shape.H * shape.Dqk) + 3 * indexer_pair;
    setup.flops = per_pair * (shape.dense ? p->range_pairs() : p->active_pairs());
    setup.make = [p](const BenchVariant& v) {
      Subject s;
      s.variant = v;
      auto a = std::make_shared<api::IndexerLossArgs>(loss_args(*p));
      apply(v, &a->options.impl, nullptr, &a->options.deterministic);
      s.run = [a](const sa_context& c) { return api::indexer_loss(*a, c); };
      s.workspace_size = [a](size_t* b) { return api::indexer_loss_workspace_size(*a, b); };
      return s;
    };
    setup.check = [p, seed](Subject& s) {
      for (const sa_tensor& t : {p->out.per_token, p->out.dq_I, p->out.dk_I, p->out.dw}) poison(t);
      poison(p->out.loss);
      check_call(s.run(context_of(s)), s.variant.label);
      synchronize();
      const std::vector<Check> checks = check_loss(*p, seed);
      s.max_rel_l2 = worst(checks, &s.ok);
      report_failures(s, checks);
    };
  }
  return setup;
}

}  // namespace sa_tool
