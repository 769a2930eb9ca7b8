// Validation of the DSA lightning indexer's arguments (SPEC 5 and 3): scores, top-k, loss.
// Every check names the argument; CUDA tensors must also meet SPEC 5's GPU contract
// (indexer_gpu_contract), refused with SA_ERROR_UNSUPPORTED before dispatch.
#include <cmath>
#include <cstdint>
#include <limits>

#include "api/tensor_checks.hpp"
#include "api/validate.hpp"

namespace sa::api {
namespace {

constexpr std::initializer_list<sa_dtype> kInt32 = {SA_DTYPE_INT32};
constexpr std::initializer_list<sa_dtype> kFp32 = {SA_DTYPE_FP32};
constexpr std::initializer_list<sa_dtype> kFp32Or64 = {SA_DTYPE_FP32, SA_DTYPE_FP64};

using Common = CheckedCommon<IndexerDims, IndexerMeta>;

struct Checked {
  Common c;
  IndexerInputs in;
};

void check_options(const sa_indexer_options& opt, bool loss) {
  SA_CHECK_ARG(std::isfinite(opt.scale_I), "options.scale_I: expected a finite value (0 for "
                                           "1/sqrt(D_I)), got " << opt.scale_I);
  SA_CHECK_ARG(enum_bits(opt.impl) >= SA_IMPL_AUTO && enum_bits(opt.impl) <= SA_IMPL_SM90,
               "options.impl: unknown implementation " << enum_bits(opt.impl));
  if (!loss) return;
  SA_CHECK_ARG(std::isfinite(opt.scale), "options.scale: expected a finite value (0 for "
                                         "1/sqrt(D_qk)), got " << opt.scale);
  SA_CHECK_ARG(std::isfinite(opt.coeff),
               "options.coeff: expected a finite value, got " << opt.coeff);
}

void check_range_tensor(const sa_tensor& t, const char* name, const IndexerDims& d,
                        DevicePlace& place, IntView& view) {
  if (!check_optional(t, name, {1, kInt32, false, false}, place)) return;
  SA_CHECK_ARG(t.shape[0] == d.Sq,
               name << ": expected shape [S_q] = [" << d.Sq << "], got " << shape_str(t));
  view = int_view(t);
}

Checked check_inputs(const sa_tensor& q_I, const sa_tensor& k_I, const sa_tensor& w,
                     const sa_tensor& k_start, const sa_tensor& k_end,
                     const sa_indexer_options& opt, bool loss) {
  check_options(opt, loss);
  Checked r;
  Common& c = r.c;
  check_tensor(q_I, "q_I", {3, {}, true, false}, c.place);
  check_tensor(k_I, "k_I", {2, {}, true, false}, c.place);
  check_same_dtype(k_I, "k_I", q_I, "q_I");
  IndexerDims& d = c.dims;
  d.Sq = q_I.shape[0];
  d.HI = q_I.shape[1];
  d.DI = q_I.shape[2];
  d.Skv = k_I.shape[0];
  SA_CHECK_ARG(d.Sq >= 1 && d.HI >= 1 && d.DI >= 1,
               "q_I: expected shape [S_q, H_I, D_I] with every dimension >= 1, got "
                   << shape_str(q_I));
  SA_CHECK_ARG(d.Skv >= 1, "k_I: S_kv must be >= 1, got " << shape_str(k_I));
  SA_CHECK_ARG(k_I.shape[1] == d.DI, "k_I: expected shape [S_kv, D_I] with D_I = "
                                         << d.DI << " (from q_I), got " << shape_str(k_I));
  check_tensor(w, "w", {2, kFp32Or64, true, false}, c.place);
  SA_CHECK_ARG(w.shape[0] == d.Sq && w.shape[1] == d.HI,
               "w: expected shape [S_q, H_I] = [" << d.Sq << ", " << d.HI << "], got "
                                                  << shape_str(w));
  check_range_tensor(k_start, "k_start", d, c.place, c.meta.k_start);
  check_range_tensor(k_end, "k_end", d, c.place, c.meta.k_end);
  c.scale = opt.scale_I == 0.f ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.DI)))
                               : opt.scale_I;
  r.in.q_I = to_shd(q_I);
  r.in.k_I = to_shd(k_I);
  r.in.w = w.data;
  r.in.w_stride[0] = w.strides[0];
  r.in.w_stride[1] = w.strides[1];
  r.in.w_dtype = w.dtype;
  return r;
}

// A 2-D output of exact shape [rows, cols]; `doc` names the dimensions ("[S_q, S_kv]").
void check_out2(const sa_tensor& t, const char* name, std::initializer_list<sa_dtype> dtypes,
                int64_t rows, int64_t cols, DevicePlace& place, const char* doc) {
  check_tensor(t, name, {2, dtypes, true, true}, place);
  SA_CHECK_ARG(t.shape[0] == rows && t.shape[1] == cols,
               name << ": expected shape " << doc << " = [" << rows << ", " << cols << "], got "
                    << shape_str(t));
}

void require_gpu_contract(const std::string& why, sa_device_type device, const char* op) {
  if (device == SA_DEVICE_CUDA && !why.empty())
    SA_FAIL(SA_ERROR_UNSUPPORTED, why << ": " << op << " on CUDA tensors follows SPEC 5's GPU "
                                      << "contract (CPU tensors run the reference, which takes "
                                      << "any size and floating dtype)");
}

}  // namespace

IndexerScoresProblem make_problem(const sa_indexer_scores_args& a) {
  Checked r = check_inputs(a.q_I, a.k_I, a.w, a.k_start, a.k_end, a.options, false);
  const IndexerDims& d = r.c.dims;
  check_out2(a.scores, "scores", kFp32, d.Sq, d.Skv, r.c.place, "[S_q, S_kv]");
  IndexerScoresProblem p;
  fill_header(p, r.c, a.q_I.dtype, a.options);
  p.in = r.in;
  p.scores = static_cast<float*>(a.scores.data);
  p.scores_stride[0] = a.scores.strides[0];
  p.scores_stride[1] = a.scores.strides[1];
  require_gpu_contract(indexer_gpu_contract(p.dims, p.dtype, p.in.w_dtype), p.device,
                       "indexer_scores");
  return p;
}

IndexerTopkProblem make_problem(const sa_indexer_topk_args& a) {
  Checked r = check_inputs(a.q_I, a.k_I, a.w, a.k_start, a.k_end, a.options, false);
  IndexerDims& d = r.c.dims;
  check_tensor(a.topk_idx, "topk_idx", {2, kInt32, true, true}, r.c.place);
  SA_CHECK_ARG(a.topk_idx.shape[0] == d.Sq && a.topk_idx.shape[1] >= 1,
               "topk_idx: expected shape [S_q, topk] = [" << d.Sq << ", topk >= 1], got "
                                                          << shape_str(a.topk_idx));
  d.topk = a.topk_idx.shape[1];
  SA_CHECK_ARG(d.Skv <= std::numeric_limits<int32_t>::max(),
               "k_I: S_kv = " << d.Skv << " does not fit the int32 key indices of topk_idx");
  IndexerTopkProblem p;
  if (check_optional(a.topk_length, "topk_length", {1, kInt32, false, true}, r.c.place)) {
    SA_CHECK_ARG(a.topk_length.shape[0] == d.Sq, "topk_length: expected shape [S_q] = ["
                                                     << d.Sq << "], got "
                                                     << shape_str(a.topk_length));
    p.topk_length = static_cast<int32_t*>(a.topk_length.data);
    p.topk_length_stride = a.topk_length.strides[0];
  }
  fill_header(p, r.c, a.q_I.dtype, a.options);
  p.in = r.in;
  p.topk_idx = static_cast<int32_t*>(a.topk_idx.data);
  p.topk_idx_stride[0] = a.topk_idx.strides[0];
  p.topk_idx_stride[1] = a.topk_idx.strides[1];
  require_gpu_contract(indexer_gpu_contract(p.dims, p.dtype, p.in.w_dtype), p.device,
                       "indexer_topk");
  return p;
}

IndexerLossProblem make_problem(const sa_indexer_loss_args& a) {
  Checked r = check_inputs(a.q_I, a.k_I, a.w, a.k_start, a.k_end, a.options, true);
  Common& c = r.c;
  IndexerDims& d = c.dims;

  // The attention target: q [S_q, H, D_qk], kv [S_kv, D_qk], lse [S_q, H].
  check_tensor(a.q, "q", {3, {}, true, false}, c.place);
  check_tensor(a.kv, "kv", {2, {}, true, false}, c.place);
  check_same_dtype(a.kv, "kv", a.q, "q");
  d.H = a.q.shape[1];
  d.Dqk = a.q.shape[2];
  SA_CHECK_ARG(a.q.shape[0] == d.Sq && d.H >= 1 && d.Dqk >= 1,
               "q: expected shape [S_q, H, D_qk] with S_q = " << d.Sq << " (from q_I) and H, "
                                                              << "D_qk >= 1, got "
                                                              << shape_str(a.q));
  SA_CHECK_ARG(a.kv.shape[0] == d.Skv && a.kv.shape[1] == d.Dqk,
               "kv: expected shape [S_kv, D_qk] = [" << d.Skv << ", " << d.Dqk
                                                     << "] (S_kv from k_I, D_qk from q), got "
                                                     << shape_str(a.kv));
  check_tensor(a.lse, "lse", {2, kFp32, false, false}, c.place);
  SA_CHECK_ARG(a.lse.shape[0] == d.Sq && a.lse.shape[1] == d.H,
               "lse: expected shape [S_q, H] = [" << d.Sq << ", " << d.H << "], got "
                                                  << shape_str(a.lse));

  // The mode: sparse with topk_idx, dense without.
  if (check_optional(a.topk_idx, "topk_idx", {2, kInt32, false, false}, c.place)) {
    SA_CHECK_ARG(a.topk_idx.shape[0] == d.Sq && a.topk_idx.shape[1] >= 1,
                 "topk_idx: expected shape [S_q, topk] = [" << d.Sq << ", topk >= 1], got "
                                                            << shape_str(a.topk_idx));
    d.topk = a.topk_idx.shape[1];
    c.meta.topk_idx = int_view(a.topk_idx);
    if (check_optional(a.topk_length, "topk_length", {1, kInt32, false, false}, c.place)) {
      SA_CHECK_ARG(a.topk_length.shape[0] == d.Sq, "topk_length: expected shape [S_q] = ["
                                                       << d.Sq << "], got "
                                                       << shape_str(a.topk_length));
      c.meta.topk_length = int_view(a.topk_length);
    }
  } else {
    SA_CHECK_ARG(a.topk_length.data == nullptr,
                 "topk_length: given without topk_idx; dense mode (no topk_idx) has no top-k "
                 "slots to cut");
  }

  // Outputs.
  IndexerLossProblem p;
  check_tensor(a.loss, "loss", {0, kFp32Or64, true, true}, c.place);
  p.loss = a.loss.data;
  p.loss_dtype = a.loss.dtype;
  if (check_optional(a.loss_per_token, "loss_per_token", {1, {}, false, true}, c.place)) {
    check_same_dtype(a.loss_per_token, "loss_per_token", a.loss, "loss");
    SA_CHECK_ARG(a.loss_per_token.shape[0] == d.Sq, "loss_per_token: expected shape [S_q] = ["
                                                        << d.Sq << "], got "
                                                        << shape_str(a.loss_per_token));
    p.loss_per_token = a.loss_per_token.data;
    p.loss_per_token_stride = a.loss_per_token.strides[0];
  }
  const bool grads[3] = {a.dq_I.data != nullptr, a.dk_I.data != nullptr, a.dw.data != nullptr};
  const char* names[3] = {"dq_I", "dk_I", "dw"};
  for (int i = 0; i < 3; ++i)
    SA_CHECK_ARG(grads[i] == grads[0],
                 names[i] << ": the gradients dq_I, dk_I and dw are given together or not at all "
                          << "(dq_I is " << (grads[0] ? "given" : "absent") << ", " << names[i]
                          << " is " << (grads[i] ? "given" : "absent") << ")");
  if (grads[0]) {
    check_tensor(a.dq_I, "dq_I", {3, {}, true, true}, c.place);
    check_same_dtype(a.dq_I, "dq_I", a.q_I, "q_I");
    SA_CHECK_ARG(a.dq_I.shape[0] == d.Sq && a.dq_I.shape[1] == d.HI && a.dq_I.shape[2] == d.DI,
                 "dq_I: expected shape [S_q, H_I, D_I] = [" << d.Sq << ", " << d.HI << ", "
                                                            << d.DI << "], got "
                                                            << shape_str(a.dq_I));
    check_out2(a.dk_I, "dk_I", {}, d.Skv, d.DI, c.place, "[S_kv, D_I]");
    check_same_dtype(a.dk_I, "dk_I", a.k_I, "k_I");
    check_out2(a.dw, "dw", kFp32Or64, d.Sq, d.HI, c.place, "[S_q, H_I]");
    check_same_dtype(a.dw, "dw", a.w, "w");
    p.dq_I = to_shd(a.dq_I);
    p.dk_I = to_shd(a.dk_I);
    p.dw = a.dw.data;
    p.dw_stride[0] = a.dw.strides[0];
    p.dw_stride[1] = a.dw.strides[1];
  }

  fill_header(p, c, a.q_I.dtype, a.options);
  p.in = r.in;
  p.q = to_shd(a.q);
  p.kv = to_shd(a.kv);
  p.attn_dtype = a.q.dtype;
  p.attn_scale = a.options.scale == 0.f
                     ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.Dqk)))
                     : a.options.scale;
  p.lse = static_cast<const float*>(a.lse.data);
  p.lse_stride[0] = a.lse.strides[0];
  p.lse_stride[1] = a.lse.strides[1];
  require_gpu_contract(indexer_gpu_contract(p), p.device, "indexer_loss");
  return p;
}

}  // namespace sa::api
