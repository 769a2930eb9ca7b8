// Validation of DSA forward and backward arguments (SPEC 2 and 3).
#include <cmath>
#include <cstdint>

#include "api/tensor_checks.hpp"
#include "api/validate.hpp"

namespace sa::api {
namespace {

constexpr std::initializer_list<sa_dtype> kInt32 = {SA_DTYPE_INT32};
constexpr std::initializer_list<sa_dtype> kFp32 = {SA_DTYPE_FP32};

using Common = CheckedCommon<DsaDims, DsaMeta>;

Common check_inputs(const sa_tensor& q, const sa_tensor& kv, const sa_tensor& topk_idx,
                    const sa_tensor& topk_length, const sa_tensor& sink,
                    const sa_dsa_options& opt) {
  check_scale(opt.scale, "1/sqrt(D_qk)");
  SA_CHECK_ARG(enum_bits(opt.impl) >= SA_IMPL_AUTO && enum_bits(opt.impl) <= SA_IMPL_SM90,
               "options.impl: unknown implementation " << enum_bits(opt.impl));
  Common c;
  check_tensor(q, "q", {3, {}, true, false}, c.place);
  check_tensor(kv, "kv", {2, {}, true, false}, c.place);
  check_same_dtype(kv, "kv", q, "q");
  DsaDims& d = c.dims;
  d.Sq = q.shape[0];
  d.H = q.shape[1];
  d.Dqk = q.shape[2];
  d.Skv = kv.shape[0];
  SA_CHECK_ARG(d.Sq >= 1 && d.H >= 1 && d.Dqk >= 1,
               "q: expected shape [S_q, H, D_qk] with every dimension >= 1, got "
                   << shape_str(q));
  SA_CHECK_ARG(d.Skv >= 1, "kv: S_kv must be >= 1, got " << shape_str(kv));
  SA_CHECK_ARG(kv.shape[1] == d.Dqk, "kv: expected shape [S_kv, D_qk] with D_qk = "
                                         << d.Dqk << " (from q), got " << shape_str(kv));
  d.Dv = opt.d_v == 0 ? 512 : opt.d_v;
  SA_CHECK_ARG(opt.d_v != 0 || d.Dv <= d.Dqk,
               "options.d_v: not set (0), so it defaults to 512, more than D_qk = "
                   << d.Dqk << " (from q): set d_v to a value in [1, " << d.Dqk << "]");
  SA_CHECK_ARG(d.Dv >= 1 && d.Dv <= d.Dqk, "options.d_v: expected a value in [1, D_qk = "
                                               << d.Dqk << "] (0 for 512), got " << d.Dv);

  check_tensor(topk_idx, "topk_idx", {2, kInt32, false, false}, c.place);
  SA_CHECK_ARG(topk_idx.shape[0] == d.Sq && topk_idx.shape[1] >= 1,
               "topk_idx: expected shape [S_q, topk] = [" << d.Sq << ", topk >= 1], got "
                                                          << shape_str(topk_idx));
  d.topk = topk_idx.shape[1];
  SA_CHECK_ARG(d.topk <= INT32_MAX, "topk_idx: topk = " << d.topk << " slots per row, more than "
                                        << "2147483647 (slots and lengths are int32)");
  c.meta.topk_idx = int_view(topk_idx);
  if (check_optional(topk_length, "topk_length", {1, kInt32, false, false}, c.place)) {
    SA_CHECK_ARG(topk_length.shape[0] == d.Sq, "topk_length: expected shape [S_q] = ["
                                                   << d.Sq << "], got "
                                                   << shape_str(topk_length));
    c.meta.topk_length = int_view(topk_length);
  }
  if (check_optional(sink, "sink", {1, kFp32, false, false}, c.place)) {
    SA_CHECK_ARG(sink.shape[0] == d.H,
                 "sink: expected shape [H] = [" << d.H << "], got " << shape_str(sink));
    c.meta.sink = static_cast<const float*>(sink.data);
    c.meta.sink_stride = sink.strides[0];
  }
  c.scale = opt.scale == 0.f ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.Dqk)))
                             : opt.scale;
  return c;
}

void check_shd(const sa_tensor& t, const char* name, const sa_tensor& like, const char* like_name,
               int64_t s, int64_t h, int64_t dd, bool output, DevicePlace& place,
               const char* doc) {
  check_tensor(t, name, {3, {}, true, output}, place);
  check_same_dtype(t, name, like, like_name);
  SA_CHECK_ARG(t.shape[0] == s && t.shape[1] == h && t.shape[2] == dd,
               name << ": expected shape " << doc << " = [" << s << ", " << h << ", " << dd
                    << "], got " << shape_str(t));
}

void check_lse(const sa_tensor& lse, const char* name, const DsaDims& d, bool output,
               DevicePlace& place) {
  check_tensor(lse, name, {2, kFp32, false, output}, place);
  SA_CHECK_ARG(lse.shape[0] == d.Sq && lse.shape[1] == d.H,
               name << ": expected shape [S_q, H] = [" << d.Sq << ", " << d.H << "], got "
                    << shape_str(lse));
}

}  // namespace

DsaFwdProblem make_problem(const sa_dsa_fwd_args& a) {
  Common c = check_inputs(a.q, a.kv, a.topk_idx, a.topk_length, a.sink, a.options);
  const DsaDims& d = c.dims;
  check_shd(a.out, "out", a.q, "q", d.Sq, d.H, d.Dv, true, c.place, "[S_q, H, d_v]");
  check_lse(a.lse, "lse", d, true, c.place);
  DsaFwdProblem p;
  fill_header(p, c, a.q.dtype, a.options);
  p.q = to_shd(a.q);
  p.kv = to_shd(a.kv);
  p.out = to_shd(a.out);
  p.lse = static_cast<float*>(a.lse.data);
  p.lse_stride[0] = a.lse.strides[0];
  p.lse_stride[1] = a.lse.strides[1];
  return p;
}

DsaBwdProblem make_problem(const sa_dsa_bwd_args& a) {
  Common c = check_inputs(a.q, a.kv, a.topk_idx, a.topk_length, a.sink, a.options);
  const DsaDims& d = c.dims;
  check_shd(a.out, "out", a.q, "q", d.Sq, d.H, d.Dv, false, c.place, "[S_q, H, d_v]");
  check_lse(a.lse, "lse", d, false, c.place);
  check_shd(a.dout, "dout", a.q, "q", d.Sq, d.H, d.Dv, false, c.place, "[S_q, H, d_v]");
  check_shd(a.dq, "dq", a.q, "q", d.Sq, d.H, d.Dqk, true, c.place, "[S_q, H, D_qk]");
  check_tensor(a.dkv, "dkv", {2, {}, true, true}, c.place);
  check_same_dtype(a.dkv, "dkv", a.kv, "kv");
  SA_CHECK_ARG(a.dkv.shape[0] == d.Skv && a.dkv.shape[1] == d.Dqk,
               "dkv: expected shape [S_kv, D_qk] = [" << d.Skv << ", " << d.Dqk << "], got "
                                                      << shape_str(a.dkv));
  DsaBwdProblem p;
  if (check_optional(a.d_sink, "d_sink", {1, kFp32, false, true}, c.place)) {
    SA_CHECK_ARG(a.d_sink.shape[0] == d.H,
                 "d_sink: expected shape [H] = [" << d.H << "], got " << shape_str(a.d_sink));
    p.d_sink = static_cast<float*>(a.d_sink.data);
    p.d_sink_stride = a.d_sink.strides[0];
  }
  fill_header(p, c, a.q.dtype, a.options);
  p.q = to_shd(a.q);
  p.kv = to_shd(a.kv);
  p.out = to_shd(a.out);
  p.dout = to_shd(a.dout);
  p.dq = to_shd(a.dq);
  p.dkv = to_shd(a.dkv);
  p.lse = static_cast<const float*>(a.lse.data);
  p.lse_stride[0] = a.lse.strides[0];
  p.lse_stride[1] = a.lse.strides[1];
  return p;
}

}  // namespace sa::api
