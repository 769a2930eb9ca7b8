// Validation of BSA forward and backward arguments (SPEC 1 and 3).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "api/tensor_checks.hpp"
#include "api/validate.hpp"
#include "common/narrow.hpp"

namespace sa::api {
namespace {

constexpr std::initializer_list<sa_dtype> kInt32 = {SA_DTYPE_INT32};
constexpr std::initializer_list<sa_dtype> kFp32 = {SA_DTYPE_FP32};

// [B, H, S, D] or [B, S, H, D] -> BHSD-ordered strides.
Bhsd to_bhsd(const sa_tensor& t, sa_layout layout) {
  Bhsd v;
  v.data = t.data;
  v.sb = t.strides[0];
  if (layout == SA_LAYOUT_BHSD) {
    v.sh = t.strides[1];
    v.ss = t.strides[2];
  } else {
    v.ss = t.strides[1];
    v.sh = t.strides[2];
  }
  v.sd = t.strides[3];
  return v;
}

struct Bhsd4 {
  int64_t b, h, s, d;
};
// Packed (THD) tensors: [T, H, D] reads as a batch of one (b = 1) whose S axis is T.
Bhsd4 dims_of_thd(const sa_tensor& t) { return {1, t.shape[1], t.shape[0], t.shape[2]}; }
Bhsd to_bhsd_thd(const sa_tensor& t) {
  Bhsd v;
  v.data = t.data;
  v.sb = 0;  // every sequence indexes its tokens globally (SeqSpan::q0, k0)
  v.ss = t.strides[0];
  v.sh = t.strides[1];
  v.sd = t.strides[2];
  return v;
}

Bhsd4 dims_of(const sa_tensor& t, sa_layout layout) {
  if (layout == SA_LAYOUT_BHSD) return {t.shape[0], t.shape[1], t.shape[2], t.shape[3]};
  return {t.shape[0], t.shape[2], t.shape[1], t.shape[3]};
}

const char* layout_name(sa_layout l) { return l == SA_LAYOUT_BHSD ? "BHSD" : "BSHD"; }

// When q2k_index's shape fits q read in the other layout, the likely cause of a shape error:
// e.g. [B, S, H, D] tensors passed with the default layout BHSD.
std::string other_layout_hint(const sa_tensor& q, sa_layout layout, const sa_tensor& qi,
                              int32_t block) {
  const sa_layout other = layout == SA_LAYOUT_BHSD ? SA_LAYOUT_BSHD : SA_LAYOUT_BHSD;
  const Bhsd4 d = dims_of(q, other);
  if (d.s < 1 || qi.shape[0] != d.b || qi.shape[1] != d.h ||
      qi.shape[2] != ceil_div_i64(d.s, block))
    return "";
  return std::string("; read in layout ") + layout_name(other) + " (options.layout), q's shape " +
         shape_str(q) + " would match: is the layout right?";
}

// Checks a [B, H, S, D]-like tensor against expected sizes in the call's layout.
void check_attn_shape(const sa_tensor& t, const char* name, sa_layout layout, Bhsd4 want,
                      const char* shape_doc) {
  Bhsd4 got = dims_of(t, layout);
  SA_CHECK_ARG(got.b == want.b && got.h == want.h && got.s == want.s && got.d == want.d,
               name << ": expected shape " << shape_doc << " = "
                    << (layout == SA_LAYOUT_BHSD ? "[" : "[") << want.b << ", "
                    << (layout == SA_LAYOUT_BHSD ? want.h : want.s) << ", "
                    << (layout == SA_LAYOUT_BHSD ? want.s : want.h) << ", " << want.d
                    << "] in layout " << layout_name(layout) << ", got " << shape_str(t));
}

using Common = CheckedCommon<BsaDims, BsaMeta>;

void check_options(const sa_bsa_options& o) {
  SA_CHECK_ARG(enum_bits(o.layout) == SA_LAYOUT_BHSD || enum_bits(o.layout) == SA_LAYOUT_BSHD,
               "options.layout: expected SA_LAYOUT_BHSD or SA_LAYOUT_BSHD, got "
                   << enum_bits(o.layout));
  SA_CHECK_ARG(o.block_size == 64 || o.block_size == 128,
               "options.block_size: expected 64 or 128, got " << o.block_size);
  check_scale(o.scale, "1/sqrt(D)");
  SA_CHECK_ARG(o.bucket_size >= 0,
               "options.bucket_size: expected >= 0 (0 = automatic), got " << o.bucket_size);
  SA_CHECK_ARG(enum_bits(o.impl) >= SA_IMPL_AUTO && enum_bits(o.impl) <= SA_IMPL_SM90,
               "options.impl: unknown implementation " << enum_bits(o.impl));
}

const char* mask_name(int32_t m) {
  switch (m) {
    case SA_MASK_NONE: return "SA_MASK_NONE";
    case SA_MASK_CAUSAL: return "SA_MASK_CAUSAL";
    case SA_MASK_WINDOW: return "SA_MASK_WINDOW";
    case SA_MASK_CAUSAL_WINDOW: return "SA_MASK_CAUSAL_WINDOW";
  }
  return "an unknown mask";
}

// a + b saturated to int64 (b >= 0 or b <= 0 arbitrary; the results are clamped anyway).
int64_t saturating_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  return b > 0 ? INT64_MAX : INT64_MIN;
}

// options.mask and its parameters (SPEC 4) -> the band lo <= s - i <= hi, clamped to [-Sq, Skv].
TokenMask resolve_mask(const sa_bsa_options& o, const BsaDims& d, bool varlen,
                       bool* offset_per_seq) {
  const int32_t kind = enum_bits(o.mask);
  SA_CHECK_ARG(kind >= SA_MASK_NONE && kind <= SA_MASK_CAUSAL_WINDOW,
               "options.mask: expected SA_MASK_NONE, SA_MASK_CAUSAL, SA_MASK_WINDOW or "
               "SA_MASK_CAUSAL_WINDOW, got " << kind);
  const bool window = kind == SA_MASK_WINDOW || kind == SA_MASK_CAUSAL_WINDOW;
  SA_CHECK_ARG(o.window_left >= 0 && o.window_right >= 0,
               "options.window_left, options.window_right: expected >= 0, got "
                   << o.window_left << ", " << o.window_right);
  SA_CHECK_ARG(window || o.window_left == 0,
               "options.window_left: " << o.window_left << " is set but options.mask = "
                                       << mask_name(kind) << " has no window (use "
                                       << "SA_MASK_WINDOW or SA_MASK_CAUSAL_WINDOW)");
  SA_CHECK_ARG(kind == SA_MASK_WINDOW || o.window_right == 0,
               "options.window_right: " << o.window_right << " is set but options.mask = "
                   << mask_name(kind)
                   << (kind == SA_MASK_CAUSAL_WINDOW
                           ? " already hides every key after the diagonal (expected 0)"
                           : " has no window (use SA_MASK_WINDOW)"));
  SA_CHECK_ARG(kind != SA_MASK_NONE || (o.causal_offset_given == 0 && o.causal_offset == 0),
               "options.causal_offset: set (causal_offset_given = " << o.causal_offset_given
                   << ", causal_offset = " << o.causal_offset
                   << ") but options.mask = SA_MASK_NONE uses no offset");
  SA_CHECK_ARG(o.causal_offset_given != 0 || o.causal_offset == 0,
               "options.causal_offset: " << o.causal_offset
                   << " is ignored unless options.causal_offset_given is nonzero (0 means the "
                   << "default S_kv - S_q): set causal_offset_given = 1");
  TokenMask m;
  if (kind == SA_MASK_NONE) return m;
  if (varlen) {
    // Per sequence (BsaMeta::mask_of): the band relative to the sequence's own offset (its
    // skv - sq by default, else the given one), clamped to +-(T_q + T_kv). That clamp changes
    // no answer: a sequence's offset and its own clamp range lie within [-T_q, T_kv].
    const int64_t c = o.causal_offset_given != 0 ? o.causal_offset : 0;
    int64_t lo = INT64_MIN, hi = INT64_MAX;
    if (kind == SA_MASK_CAUSAL || kind == SA_MASK_CAUSAL_WINDOW) hi = c;
    if (kind == SA_MASK_WINDOW) hi = saturating_add(c, o.window_right);
    if (window) lo = saturating_add(c, -o.window_left);
    const int64_t bound = d.Sq + d.Skv;
    m.on = true;
    m.lo = std::min(std::max(lo, -bound), bound);
    m.hi = std::min(std::max(hi, -bound), bound);
    *offset_per_seq = o.causal_offset_given == 0;
    return m;
  }
  const int64_t c = o.causal_offset_given != 0 ? o.causal_offset : d.Skv - d.Sq;
  int64_t lo = INT64_MIN, hi = INT64_MAX;
  if (kind == SA_MASK_CAUSAL || kind == SA_MASK_CAUSAL_WINDOW) hi = c;
  if (kind == SA_MASK_WINDOW) hi = saturating_add(c, o.window_right);
  if (window) lo = saturating_add(c, -o.window_left);
  auto clamp = [&](int64_t x) { return std::min(std::max(x, -d.Sq), d.Skv); };
  m.on = true;
  m.lo = clamp(lo);
  m.hi = clamp(hi);
  return m;
}

bool is_varlen(const sa_bsa_options& o) {
  return o.cu_seqlens_q.data != nullptr || o.cu_seqlens_k.data != nullptr;
}

const char* const kThdHint =
    " (packed batches: options.cu_seqlens_q/k are given, so attention tensors are [T, H, D])";

// Packed batches (SPEC 4): the shapes of cu_seqlens_q/k and the metadata's first dims. Their
// values live on the tensors' device and are not read here: the reference checks them on every
// call, the GPU paths with options.validate (docs/bsa.md, "Packed batches").
void check_cu_seqlens(const sa_bsa_options& opt, const sa_tensor& qi, BsaDims& d, Common& c) {
  SA_CHECK_ARG(opt.cu_seqlens_q.data != nullptr && opt.cu_seqlens_k.data != nullptr,
               "options.cu_seqlens_" << (opt.cu_seqlens_q.data ? "k" : "q")
                   << ": absent while options.cu_seqlens_" << (opt.cu_seqlens_q.data ? "q" : "k")
                   << " is given: a packed batch needs both");
  check_tensor(opt.cu_seqlens_q, "options.cu_seqlens_q", {1, kInt32, false, false}, c.place);
  check_tensor(opt.cu_seqlens_k, "options.cu_seqlens_k", {1, kInt32, false, false}, c.place);
  const int64_t n = opt.cu_seqlens_q.shape[0];
  SA_CHECK_ARG(n >= 2, "options.cu_seqlens_q: expected shape [B + 1] with B >= 1 sequences, got "
                           << shape_str(opt.cu_seqlens_q));
  SA_CHECK_ARG(opt.cu_seqlens_k.shape[0] == n,
               "options.cu_seqlens_k: expected shape [B + 1] = [" << n
                   << "] (that of options.cu_seqlens_q), got " << shape_str(opt.cu_seqlens_k));
  SA_CHECK_ARG(fits_i32(d.Sq) && fits_i32(d.Skv),
               "q, k: T_q = " << d.Sq << ", T_kv = " << d.Skv
                              << " tokens: cu_seqlens are int32, so at most 2147483647");
  d.B = n - 1;
  SA_CHECK_ARG(qi.shape[0] == d.B && qi.shape[1] == d.Hq && qi.shape[2] >= 1,
               "sparsity.q2k_index: expected shape [B, H_q, N_q_max, K_max] = ["
                   << d.B << ", " << d.Hq << ", N_q_max >= 1, K_max] (B from cu_seqlens_q; "
                   << "N_q_max >= ceil(S_q / block_size) of every sequence), got "
                   << shape_str(qi));
  d.Nq = qi.shape[2];  // N_q_max: bounds each sequence's query blocks (checked with its values)
  // Nkv stays ceil(T_kv / block): no sequence has more KV blocks.
  c.meta.cu_seqlens_q = static_cast<const int32_t*>(opt.cu_seqlens_q.data);
  c.meta.cu_seqlens_k = static_cast<const int32_t*>(opt.cu_seqlens_k.data);
  c.meta.cu_stride_q = opt.cu_seqlens_q.strides[0];
  c.meta.cu_stride_k = opt.cu_seqlens_k.strides[0];
}

// q, k, v and the sparsity metadata: what forward and backward share.
Common check_inputs(const sa_tensor& q, const sa_tensor& k, const sa_tensor& v,
                    const sa_bsa_sparsity& sp, const sa_bsa_options& opt) {
  check_options(opt);
  Common c;
  const sa_layout L = opt.layout;
  const bool varlen = is_varlen(opt);
  const int rank = varlen ? 3 : 4;
  for (auto [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    SA_CHECK_ARG(!varlen || t->data == nullptr || t->rank == 3,
                 name << ": expected rank 3 [T, H, D], got rank " << t->rank << " "
                      << shape_str(*t) << kThdHint);
    check_tensor(*t, name, {rank, {}, true, false}, c.place);
  }
  check_same_dtype(k, "k", q, "q");
  check_same_dtype(v, "v", q, "q");
  Bhsd4 dq = varlen ? dims_of_thd(q) : dims_of(q, L);
  Bhsd4 dk = varlen ? dims_of_thd(k) : dims_of(k, L);
  Bhsd4 dv = varlen ? dims_of_thd(v) : dims_of(v, L);
  SA_CHECK_ARG(dq.b >= 1 && dq.h >= 1 && dq.s >= 1 && dq.d >= 1,
               "q: every dimension must be >= 1, got " << shape_str(q));
  SA_CHECK_ARG(dk.b == dq.b, "k: batch must equal q's batch " << dq.b << ", got " << dk.b
                                                                << " (shape " << shape_str(k)
                                                                << ")");
  SA_CHECK_ARG(dk.h >= 1 && dk.s >= 1, "k: every dimension must be >= 1, got " << shape_str(k));
  SA_CHECK_ARG(dq.h % dk.h == 0, "k: H_kv = " << dk.h << " must divide H_q = " << dq.h);
  SA_CHECK_ARG(dk.d == dq.d, "k: head dim must equal q's D = " << dq.d << ", got " << dk.d);
  SA_CHECK_ARG(dv.b == dq.b && dv.h == dk.h && dv.s == dk.s,
               "v: expected the batch, heads and S_kv of k (" << shape_str(k) << "), got "
                                                              << shape_str(v));
  SA_CHECK_ARG(dv.d >= 1, "v: D_v must be >= 1");

  BsaDims& d = c.dims;
  d.B = dq.b;
  d.Hq = dq.h;
  d.Hkv = dk.h;
  d.Sq = dq.s;
  d.Skv = dk.s;
  d.D = dq.d;
  d.Dv = dv.d;
  d.block = opt.block_size;
  d.Nq = ceil_div_i64(d.Sq, d.block);
  d.Nkv = ceil_div_i64(d.Skv, d.block);

  check_tensor(sp.q2k_index, "sparsity.q2k_index", {4, kInt32, false, false}, c.place);
  const sa_tensor& qi = sp.q2k_index;
  if (varlen) check_cu_seqlens(opt, qi, d, c);
  SA_CHECK_ARG(varlen || (qi.shape[0] == d.B && qi.shape[1] == d.Hq && qi.shape[2] == d.Nq),
               "sparsity.q2k_index: expected shape [B, H_q, N_q, K_max] = ["
                   << d.B << ", " << d.Hq << ", " << d.Nq
                   << ", K_max] (N_q = ceil(S_q / block_size)), got " << shape_str(qi)
                   << other_layout_hint(q, L, qi, d.block));
  SA_CHECK_ARG(qi.shape[3] >= 1, "sparsity.q2k_index: K_max must be >= 1, got " << qi.shape[3]);
  d.Kmax = qi.shape[3];
  c.meta.q2k_index = int_view(qi);

  if (check_optional(sp.q2k_count, "sparsity.q2k_count", {3, kInt32, false, false}, c.place)) {
    const sa_tensor& qc = sp.q2k_count;
    SA_CHECK_ARG(qc.shape[0] == d.B && qc.shape[1] == d.Hq && qc.shape[2] == d.Nq,
                 "sparsity.q2k_count: expected shape [B, H_q, N_q] = [" << d.B << ", " << d.Hq
                     << ", " << d.Nq << "], got " << shape_str(qc));
    c.meta.q2k_count = int_view(qc);
  } else {
    SA_CHECK_ARG(opt.count == -1 || (opt.count >= 0 && opt.count <= d.Kmax),
                 "options.count: expected -1 (K_max) or a value in [0, " << d.Kmax
                     << "] when sparsity.q2k_count is absent, got " << opt.count);
  }
  // count -1 reads all K_max entries of every row; counts are int32.
  SA_CHECK_ARG(sp.q2k_count.data != nullptr || opt.count != -1 || fits_i32(d.Kmax),
               "sparsity.q2k_index: K_max = " << d.Kmax << " entries per row (options.count = -1 "
                   << "reads them all) exceeds the int32 range of a count; give q2k_count or a "
                   << "count in [0, 2147483647]");
  c.meta.fixed_count =
      opt.count == -1 ? (fits_i32(d.Kmax) ? static_cast<int32_t>(d.Kmax) : 0) : opt.count;

  const sa_tensor& bl = sp.kv_block_len;
  SA_CHECK_ARG(!varlen || bl.data == nullptr,
               "sparsity.kv_block_len: not taken with packed batches (options.cu_seqlens_q/k): "
               "each sequence's length already cuts its last KV block; leave it absent");
  if (bl.data != nullptr) {
    SA_CHECK_ARG(bl.rank == 1 || bl.rank == 2,
                 "sparsity.kv_block_len: expected rank 1 [N_kv] or rank 2 [B, N_kv], got rank "
                     << bl.rank);
    check_tensor(bl, "sparsity.kv_block_len", {bl.rank, kInt32, false, false}, c.place);
    if (bl.rank == 1) {
      SA_CHECK_ARG(bl.shape[0] == d.Nkv, "sparsity.kv_block_len: expected shape [N_kv] = ["
                                             << d.Nkv << "] (N_kv = ceil(S_kv / block_size)), got "
                                             << shape_str(bl));
      c.meta.kv_block_len.data = static_cast<const int32_t*>(bl.data);
      c.meta.kv_block_len.stride[0] = 0;
      c.meta.kv_block_len.stride[1] = bl.strides[0];
    } else {
      SA_CHECK_ARG(bl.shape[0] == d.B && bl.shape[1] == d.Nkv,
                   "sparsity.kv_block_len: expected shape [B, N_kv] = ["
                       << d.B << ", " << d.Nkv << "], got " << shape_str(bl));
      c.meta.kv_block_len = int_view(bl);
    }
  }

  c.meta.mask = resolve_mask(opt, d, varlen, &c.meta.mask_offset_per_seq);

  c.scale = opt.scale == 0.f ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.D)))
                             : opt.scale;
  return c;
}

// lse: [B, H_q, S_q], or [H_q, T_q] for packed batches (FlashAttention's varlen layout).
void check_lse(const sa_tensor& lse, const char* name, const BsaDims& d, bool varlen, bool output,
               DevicePlace& place) {
  if (varlen) {
    check_tensor(lse, name, {2, kFp32, false, output}, place);
    SA_CHECK_ARG(lse.shape[0] == d.Hq && lse.shape[1] == d.Sq,
                 name << ": expected shape [H_q, T_q] = [" << d.Hq << ", " << d.Sq
                      << "] (packed batches), got " << shape_str(lse));
    return;
  }
  check_tensor(lse, name, {3, kFp32, false, output}, place);
  SA_CHECK_ARG(lse.shape[0] == d.B && lse.shape[1] == d.Hq && lse.shape[2] == d.Sq,
               name << ": expected shape [B, H_q, S_q] = [" << d.B << ", " << d.Hq << ", " << d.Sq
                    << "], got " << shape_str(lse));
}
void set_lse(const sa_tensor& lse, bool varlen, int64_t* stride) {
  if (varlen) {
    stride[0] = 0;
    stride[1] = lse.strides[0];
    stride[2] = lse.strides[1];
  } else {
    for (int i = 0; i < 3; ++i) stride[i] = lse.strides[i];
  }
}

// An attention-shaped tensor with the dtype of `like` and sizes (b, h, s, last); packed batches:
// [T, H, last] (want.b and shape_doc's batch ignored).
void check_like(const sa_tensor& t, const char* name, const sa_tensor& like,
                const char* like_name, sa_layout L, bool varlen, Bhsd4 want, bool output,
                DevicePlace& place, const char* shape_doc) {
  if (varlen) {
    SA_CHECK_ARG(t.data == nullptr || t.rank == 3, name << ": expected rank 3 [T, H, D], got rank "
                                                        << t.rank << " " << shape_str(t)
                                                        << kThdHint);
    check_tensor(t, name, {3, {}, true, output}, place);
    check_same_dtype(t, name, like, like_name);
    const Bhsd4 got = dims_of_thd(t);
    SA_CHECK_ARG(got.h == want.h && got.s == want.s && got.d == want.d,
                 name << ": expected shape [" << want.s << ", " << want.h << ", " << want.d
                      << "] (packed batches: [T, H, D]), got " << shape_str(t));
    return;
  }
  check_tensor(t, name, {4, {}, true, output}, place);
  check_same_dtype(t, name, like, like_name);
  check_attn_shape(t, name, L, want, shape_doc);
}

Bhsd view(const sa_tensor& t, sa_layout L, bool varlen) {
  return varlen ? to_bhsd_thd(t) : to_bhsd(t, L);
}

}  // namespace

BsaFwdProblem make_problem(const sa_bsa_fwd_args& a) {
  Common c = check_inputs(a.q, a.k, a.v, a.sparsity, a.options);
  const BsaDims& d = c.dims;
  const sa_layout L = a.options.layout;
  const bool vl = c.meta.varlen();
  check_like(a.o, "o", a.q, "q", L, vl, {d.B, d.Hq, d.Sq, d.Dv}, true, c.place,
             "[B, H_q, S_q, D_v]");
  check_lse(a.lse, "lse", d, vl, true, c.place);

  BsaFwdProblem p;
  fill_header(p, c, a.q.dtype, a.options);
  p.q = view(a.q, L, vl);
  p.k = view(a.k, L, vl);
  p.v = view(a.v, L, vl);
  p.o = view(a.o, L, vl);
  p.lse = static_cast<float*>(a.lse.data);
  set_lse(a.lse, vl, p.lse_stride);
  return p;
}

BsaBwdProblem make_problem(const sa_bsa_bwd_args& a) {
  Common c = check_inputs(a.q, a.k, a.v, a.sparsity, a.options);
  const BsaDims& d = c.dims;
  const sa_layout L = a.options.layout;
  const bool vl = c.meta.varlen();
  check_like(a.o, "o", a.q, "q", L, vl, {d.B, d.Hq, d.Sq, d.Dv}, false, c.place,
             "[B, H_q, S_q, D_v]");
  check_lse(a.lse, "lse", d, vl, false, c.place);
  check_like(a.dout, "dout", a.q, "q", L, vl, {d.B, d.Hq, d.Sq, d.Dv}, false, c.place,
             "[B, H_q, S_q, D_v]");
  check_like(a.dq, "dq", a.q, "q", L, vl, {d.B, d.Hq, d.Sq, d.D}, true, c.place,
             "[B, H_q, S_q, D]");
  check_like(a.dk, "dk", a.k, "k", L, vl, {d.B, d.Hkv, d.Skv, d.D}, true, c.place,
             "[B, H_kv, S_kv, D]");
  check_like(a.dv, "dv", a.v, "v", L, vl, {d.B, d.Hkv, d.Skv, d.Dv}, true, c.place,
             "[B, H_kv, S_kv, D_v]");

  BsaBwdProblem p;
  fill_header(p, c, a.q.dtype, a.options);
  p.q = view(a.q, L, vl);
  p.k = view(a.k, L, vl);
  p.v = view(a.v, L, vl);
  p.o = view(a.o, L, vl);
  p.dout = view(a.dout, L, vl);
  p.dq = view(a.dq, L, vl);
  p.dk = view(a.dk, L, vl);
  p.dv = view(a.dv, L, vl);
  p.lse = static_cast<const float*>(a.lse.data);
  set_lse(a.lse, vl, p.lse_stride);
  return p;
}

}  // namespace sa::api
