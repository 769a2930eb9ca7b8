// Validation through the public API (SPEC 3): a bad argument of any of the four operations gets
// an error before anything runs -- the right status code, a message that names the argument and
// says what was expected -- and no output (indeed no buffer at all) is touched.
//
// Every rejection case starts from a small valid call on CPU tensors, poisons the outputs with
// NaN, breaks exactly one thing and makes the call three ways: the *_workspace_size query, the C
// entry point and the C++ wrapper. It then checks the code, the message and every byte of every
// buffer of the call. The positive side: valid calls (contiguous, strided BSHD views, broadcast
// metadata, absent optional tensors) return SA_OK, report the reference implementation, need no
// workspace and write every output element.
//
// Tables of cases:  BsaValidation/BsaRejects.*   DsaValidation/DsaRejects.*
#include <gtest/gtest.h>

#include <cctype>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "api/enum_bits.hpp"
#include "sparse_attention/sparse_attention.h"
#include "sparse_attention/sparse_attention.hpp"
#include "test_util.hpp"

#ifndef SA_HAVE_SM90  // set by CMake like the library's
#define SA_HAVE_SM90 0
#endif

namespace {

namespace sa_cpp = sparse_attention;
using sa_test::HostTensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
// Out-of-range enum values, as a C caller may store them: written as bits here and read as bits
// (sa::api::enum_bits, the library's own reader): in C++, converting such a value to the enum
// type, or reading it through that type, is undefined.
template <class E>
void store_bits(E& field, int32_t v) {
  static_assert(sizeof(E) == sizeof v);
  std::memcpy(&field, &v, sizeof v);
}
using sa::api::enum_bits;
constexpr int32_t kImplSentinel = 77;  // impl_used before a call: no implementation has it

enum class Op { kForward, kBackward };
constexpr int kFwd = 1, kBwd = 2, kBoth = kFwd | kBwd;

// ---- buffers and views ------------------------------------------------------------------------

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

// Offsets (in elements) of every element of a view, in row-major order of its logical shape.
std::vector<int64_t> view_offsets(const sa_tensor& t) {
  std::vector<int64_t> offs{0};
  for (int d = 0; d < t.rank; ++d) {
    std::vector<int64_t> next;
    for (int64_t o : offs)
      for (int64_t i = 0; i < t.shape[d]; ++i) next.push_back(o + i * t.strides[d]);
    offs.swap(next);
  }
  return offs;
}

::testing::AssertionResult has_substr(const std::string& msg, const std::string& want) {
  if (msg.find(want) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << want << "\"";
}

// The buffers of one call, the argument fields that view them, and which of them are outputs.
// Fields point into the derived class's argument structs: neither copyable nor movable.
class Call {
 public:
  Call() = default;
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  virtual ~Call() = default;

  virtual sa_status run(const sa_context* ctx) const = 0;
  virtual sa_status workspace_size(size_t* bytes) const = 0;
  virtual sa_cpp::Status run_cpp(const sa_context& ctx) const = 0;
  virtual const char* op_name() const = 0;

  bool has(const std::string& name) const { return fields_.count(name) != 0; }
  sa_tensor& t(const std::string& name) {
    auto it = fields_.find(name);
    if (it == fields_.end()) {
      ADD_FAILURE() << "this call has no tensor '" << name << "'";
      static sa_tensor dummy = sa_tensor_none();
      return dummy;
    }
    return *it->second;
  }
  HostTensor& host(const std::string& name) { return *hosts_.at(name); }
  bool is_output(const std::string& name) const {
    for (const std::string& o : outputs_)
      if (o == name) return true;
    return false;
  }
  const std::vector<std::string>& outputs() const { return outputs_; }

  // `name` now views a fresh contiguous buffer of this physical shape and dtype: random values
  // for a floating input, NaN for an output, zeros for int32.
  sa_tensor& replace(const std::string& name, sa_dtype dtype, std::vector<int64_t> shape) {
    HostTensor& h = alloc(dtype, std::move(shape), is_output(name));
    t(name) = h.view();
    hosts_[name] = &h;
    return t(name);
  }
  sa_tensor& retype(const std::string& name, sa_dtype dtype) {
    return replace(name, dtype, host(name).shape());
  }
  sa_tensor& reshape(const std::string& name, std::vector<int64_t> shape) {
    return replace(name, t(name).dtype, std::move(shape));
  }
  // The same logical shape, but the last dimension has stride 2.
  sa_tensor& stride_last(const std::string& name) {
    const sa_tensor old = t(name);
    std::vector<int64_t> parent(old.shape, old.shape + old.rank);
    parent.back() *= 2;
    sa_tensor& v = replace(name, old.dtype, parent);
    for (int d = 0; d < old.rank; ++d) v.shape[d] = old.shape[d];
    v.strides[old.rank - 1] = 2;
    return v;
  }
  // Dimension `dim` walked backwards: the data pointer moves to the last element along it so the
  // view stays inside its buffer.
  sa_tensor& negate_stride(const std::string& name, int dim) {
    sa_tensor& v = t(name);
    v.data = static_cast<char*>(v.data) +
             (v.shape[dim] - 1) * v.strides[dim] * sa::dtype_size(v.dtype);
    v.strides[dim] = -v.strides[dim];
    return v;
  }
  // A non-contiguous view with the same values: every dimension but the first is padded in its
  // parent buffer (the last by 3 elements, the others by 1), so no stride is the contiguous one.
  sa_tensor& restride(const std::string& name) {
    const sa_tensor old = t(name);
    HostTensor& src = host(name);
    std::vector<int64_t> parent(old.shape, old.shape + old.rank);
    for (int d = 1; d < old.rank; ++d) parent[d] += d == old.rank - 1 ? 3 : 1;
    HostTensor& p = alloc(old.dtype, parent, is_output(name));
    sa_tensor v = p.view();
    std::vector<int64_t> strides = contiguous_strides(parent);
    for (int d = 0; d < old.rank; ++d) {
      v.shape[d] = old.shape[d];
      v.strides[d] = strides[d];
    }
    if (!is_output(name)) {
      const std::vector<int64_t> from = view_offsets(old), to = view_offsets(v);
      for (size_t i = 0; i < from.size(); ++i) p.set(to[i], src.get(from[i]));
    }
    t(name) = v;
    hosts_[name] = &p;
    return t(name);
  }

  std::vector<std::vector<uint8_t>> snapshot() const {
    std::vector<std::vector<uint8_t>> s;
    for (const HostTensor& h : buffers_) s.push_back(h.bytes());
    return s;
  }
  ::testing::AssertionResult unchanged(const std::vector<std::vector<uint8_t>>& before) const {
    size_t i = 0;
    for (const HostTensor& h : buffers_) {
      if (h.bytes() != before[i]) {
        std::string who = "an unnamed buffer";
        for (const auto& [name, ptr] : hosts_)
          if (ptr == &h) who = "the buffer of '" + name + "'";
        return ::testing::AssertionFailure() << who << " was modified by a rejected call";
      }
      ++i;
    }
    return ::testing::AssertionSuccess();
  }
  // Every element that an output view covers holds a value (no NaN left from the poison).
  ::testing::AssertionResult outputs_written() {
    for (const std::string& name : outputs_) {
      const sa_tensor& v = t(name);
      if (v.data == nullptr) continue;  // an absent optional output
      HostTensor& h = host(name);
      for (int64_t off : view_offsets(v))
        if (std::isnan(h.get(off)))
          return ::testing::AssertionFailure() << name << ": element at offset " << off
                                               << " was not written (NaN)";
    }
    return ::testing::AssertionSuccess();
  }

 protected:
  HostTensor& alloc(sa_dtype dtype, std::vector<int64_t> shape, bool output) {
    buffers_.emplace_back(dtype, std::move(shape));
    HostTensor& h = buffers_.back();
    if (dtype != SA_DTYPE_INT32) {
      if (output)
        h.poison();
      else
        h.fill_uniform(rng_, -1.0, 1.0);
    }
    return h;
  }
  void bind(const std::string& name, sa_tensor* field, HostTensor& h, bool output) {
    *field = h.view();
    fields_[name] = field;
    hosts_[name] = &h;
    if (output) outputs_.push_back(name);
  }

  std::mt19937_64 rng_{20240601};
  std::deque<HostTensor> buffers_;  // stable addresses
  std::map<std::string, sa_tensor*> fields_;
  std::map<std::string, HostTensor*> hosts_;
  std::vector<std::string> outputs_;
};

std::string with_op(std::string s, const char* op) {
  const std::string key = "{op}";
  for (size_t p = s.find(key); p != std::string::npos; p = s.find(key)) s.replace(p, key.size(), op);
  return s;
}

// The heart of every rejection case: the code and the message through all three entry points,
// and not a byte changed anywhere.
void expect_rejected(Call& c, sa_status code, const std::vector<std::string>& expect) {
  const std::vector<std::vector<uint8_t>> before = c.snapshot();

  size_t bytes = 12345;
  const sa_status ws = c.workspace_size(&bytes);
  const std::string ws_msg = sa_last_error();
  if (code == SA_ERROR_INVALID_METADATA) {
    // Metadata values are read by the implementation when it runs, not by the size query.
    EXPECT_EQ(ws, SA_OK) << ws_msg;
    EXPECT_EQ(bytes, 0u);
  } else {
    EXPECT_EQ(ws, code) << "workspace_size returned " << sa_status_name(ws) << ": " << ws_msg;
    EXPECT_EQ(bytes, 12345u) << "workspace_size wrote *bytes on failure";
    for (const std::string& s : expect) EXPECT_TRUE(has_substr(ws_msg, with_op(s, c.op_name())));
  }

  sa_impl used;
  store_bits(used, kImplSentinel);
  sa_context ctx = sa_context_default();
  ctx.impl_used = &used;
  const sa_status st = c.run(&ctx);
  const std::string msg = sa_last_error();
  EXPECT_EQ(st, code) << "got " << sa_status_name(st) << ": " << msg;
  for (const std::string& s : expect) EXPECT_TRUE(has_substr(msg, with_op(s, c.op_name())));
  EXPECT_EQ(enum_bits(used), kImplSentinel) << "a failed call wrote context.impl_used";
  ::testing::Test::RecordProperty("message", msg);  // in --gtest_output=xml, for review
  if (code != SA_ERROR_INVALID_METADATA) {
    EXPECT_EQ(ws_msg, msg);
  }

  const sa_cpp::Status s = c.run_cpp(ctx);
  EXPECT_EQ(s.code(), code);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message(), msg);
  EXPECT_EQ(s.to_string(), std::string(sa_status_name(code)) + ": " + msg);

  EXPECT_TRUE(c.unchanged(before));
}

// A valid call: SA_OK through all three entry points, the reference ran, no workspace, no error
// message left, every output element written.
void expect_accepted(Call& c) {
  size_t bytes = 12345;
  ASSERT_EQ(c.workspace_size(&bytes), SA_OK) << sa_last_error();
  EXPECT_EQ(bytes, 0u) << "the CPU reference needs no workspace";
  sa_impl used;
  store_bits(used, kImplSentinel);
  sa_context ctx = sa_context_default();
  ctx.impl_used = &used;
  ASSERT_EQ(c.run(&ctx), SA_OK) << sa_last_error();
  EXPECT_STREQ(sa_last_error(), "");
  EXPECT_EQ(enum_bits(used), SA_IMPL_REFERENCE);
  EXPECT_TRUE(c.outputs_written());
  const sa_cpp::Status s = c.run_cpp(ctx);
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(s.to_string(), "SA_OK");
}

// ---- BSA ------------------------------------------------------------------------------------------

struct BsaConfig {
  sa_dtype dtype = SA_DTYPE_FP32;
  sa_layout layout = SA_LAYOUT_BHSD;
  int64_t Sq = 128, Skv = 128;
};

// B = 1, H_q = 2, H_kv = 1 (GQA), D = 16, D_v = 8, block 64, K_max = 2, with q2k_count and
// kv_block_len given. Row (h, m) lists KV blocks {m % N_kv, (m + 1) % N_kv}; head 1 uses one block
// on even rows. KV block 0 has 50 valid keys, the last one is cut at S_kv.
class BsaCall : public Call {
 public:
  static constexpr int64_t kB = 1, kHq = 2, kHkv = 1, kD = 16, kDv = 8, kKmax = 2;
  static constexpr int32_t kBlock = 64;

  BsaCall(Op op, const BsaConfig& cfg) : op_(op), cfg_(cfg) {
    Nq_ = (cfg.Sq + kBlock - 1) / kBlock;
    Nkv_ = (cfg.Skv + kBlock - 1) / kBlock;
    const bool fwd = op == Op::kForward;
    sa_bsa_options& o = fwd ? fwd_.options : bwd_.options;
    o.layout = cfg.layout;
    o.block_size = kBlock;
    sa_bsa_sparsity& sp = fwd ? fwd_.sparsity : bwd_.sparsity;

    auto attn = [&](const char* name, sa_tensor* f, int64_t H, int64_t S, int64_t X,
                    bool output) { bind(name, f, alloc(cfg.dtype, attn_shape(H, S, X), output),
                                        output); };
    auto lse = [&](sa_tensor* f, bool output) {
      bind("lse", f, alloc(SA_DTYPE_FP32, {kB, kHq, cfg.Sq}, output), output);
    };
    if (fwd) {
      attn("q", &fwd_.q, kHq, cfg.Sq, kD, false);
      attn("k", &fwd_.k, kHkv, cfg.Skv, kD, false);
      attn("v", &fwd_.v, kHkv, cfg.Skv, kDv, false);
      attn("o", &fwd_.o, kHq, cfg.Sq, kDv, true);
      lse(&fwd_.lse, true);
    } else {
      attn("q", &bwd_.q, kHq, cfg.Sq, kD, false);
      attn("k", &bwd_.k, kHkv, cfg.Skv, kD, false);
      attn("v", &bwd_.v, kHkv, cfg.Skv, kDv, false);
      attn("o", &bwd_.o, kHq, cfg.Sq, kDv, false);
      lse(&bwd_.lse, false);
      attn("dout", &bwd_.dout, kHq, cfg.Sq, kDv, false);
      attn("dq", &bwd_.dq, kHq, cfg.Sq, kD, true);
      attn("dk", &bwd_.dk, kHkv, cfg.Skv, kD, true);
      attn("dv", &bwd_.dv, kHkv, cfg.Skv, kDv, true);
    }
    bind("sparsity.q2k_index", &sp.q2k_index,
         alloc(SA_DTYPE_INT32, {kB, kHq, Nq_, kKmax}, false), false);
    bind("sparsity.q2k_count", &sp.q2k_count, alloc(SA_DTYPE_INT32, {kB, kHq, Nq_}, false),
         false);
    bind("sparsity.kv_block_len", &sp.kv_block_len, alloc(SA_DTYPE_INT32, {Nkv_}, false), false);
    for (int64_t h = 0; h < kHq; ++h) {
      for (int64_t m = 0; m < Nq_; ++m) {
        index(h, m, 0) = static_cast<int32_t>(m % Nkv_);
        index(h, m, 1) = static_cast<int32_t>((m + 1) % Nkv_);
        count(h, m) = h == 1 && m % 2 == 0 ? 1 : 2;
      }
    }
    for (int64_t n = 0; n < Nkv_; ++n)
      block_len(n) = static_cast<int32_t>(std::min<int64_t>(kBlock, cfg.Skv - n * kBlock));
    block_len(0) = 50;
    if (!fwd) host("lse").fill(2.0);  // a plausible forward LSE
  }

  std::vector<int64_t> attn_shape(int64_t H, int64_t S, int64_t X) const {
    if (cfg_.layout == SA_LAYOUT_BSHD) return {kB, S, H, X};
    return {kB, H, S, X};
  }
  int64_t Nq() const { return Nq_; }
  int64_t Nkv() const { return Nkv_; }
  sa_bsa_options& options() { return op_ == Op::kForward ? fwd_.options : bwd_.options; }
  int32_t& index(int64_t h, int64_t m, int64_t slot) {
    return host("sparsity.q2k_index").i32()[(h * Nq_ + m) * kKmax + slot];
  }
  int32_t& count(int64_t h, int64_t m) { return host("sparsity.q2k_count").i32()[h * Nq_ + m]; }
  int32_t& block_len(int64_t n) { return host("sparsity.kv_block_len").i32()[n]; }

  sa_status run(const sa_context* ctx) const override {
    return op_ == Op::kForward ? sa_bsa_forward(&fwd_, ctx) : sa_bsa_backward(&bwd_, ctx);
  }
  sa_status workspace_size(size_t* bytes) const override {
    return op_ == Op::kForward ? sa_bsa_forward_workspace_size(&fwd_, bytes)
                               : sa_bsa_backward_workspace_size(&bwd_, bytes);
  }
  sa_cpp::Status run_cpp(const sa_context& ctx) const override {
    return op_ == Op::kForward ? sa_cpp::bsa_forward(fwd_, ctx) : sa_cpp::bsa_backward(bwd_, ctx);
  }
  const char* op_name() const override {
    return op_ == Op::kForward ? "bsa_forward" : "bsa_backward";
  }

 private:
  Op op_;
  BsaConfig cfg_;
  int64_t Nq_ = 0, Nkv_ = 0;
  sa_cpp::BsaForwardArgs fwd_;
  sa_cpp::BsaBackwardArgs bwd_;
};

// ---- DSA ------------------------------------------------------------------------------------------

// S_q = 4, H = 2, D_qk = 16, d_v = 8, topk = 3, S_kv = 10, fp32, with topk_length and sink given.
// Rows: {0, 3, -1} (the -1 inactive), {1, 9, 4} with length 2, an empty row (length 0), and
// {7, 7, 2} (a repeated index).
class DsaCall : public Call {
 public:
  static constexpr int64_t kSq = 4, kH = 2, kDqk = 16, kDv = 8, kTopk = 3, kSkv = 10;

  explicit DsaCall(Op op, sa_dtype dtype = SA_DTYPE_FP32) : op_(op) {
    const bool fwd = op == Op::kForward;
    sa_dsa_options& o = fwd ? fwd_.options : bwd_.options;
    o.d_v = kDv;
    auto add = [&](const char* name, sa_tensor* f, sa_dtype dt, std::vector<int64_t> shape,
                   bool output) { bind(name, f, alloc(dt, std::move(shape), output), output); };
    if (fwd) {
      add("q", &fwd_.q, dtype, {kSq, kH, kDqk}, false);
      add("kv", &fwd_.kv, dtype, {kSkv, kDqk}, false);
      add("topk_idx", &fwd_.topk_idx, SA_DTYPE_INT32, {kSq, kTopk}, false);
      add("topk_length", &fwd_.topk_length, SA_DTYPE_INT32, {kSq}, false);
      add("sink", &fwd_.sink, SA_DTYPE_FP32, {kH}, false);
      add("out", &fwd_.out, dtype, {kSq, kH, kDv}, true);
      add("lse", &fwd_.lse, SA_DTYPE_FP32, {kSq, kH}, true);
    } else {
      add("q", &bwd_.q, dtype, {kSq, kH, kDqk}, false);
      add("kv", &bwd_.kv, dtype, {kSkv, kDqk}, false);
      add("topk_idx", &bwd_.topk_idx, SA_DTYPE_INT32, {kSq, kTopk}, false);
      add("topk_length", &bwd_.topk_length, SA_DTYPE_INT32, {kSq}, false);
      add("sink", &bwd_.sink, SA_DTYPE_FP32, {kH}, false);
      add("out", &bwd_.out, dtype, {kSq, kH, kDv}, false);
      add("lse", &bwd_.lse, SA_DTYPE_FP32, {kSq, kH}, false);
      add("dout", &bwd_.dout, dtype, {kSq, kH, kDv}, false);
      add("dq", &bwd_.dq, dtype, {kSq, kH, kDqk}, true);
      add("dkv", &bwd_.dkv, dtype, {kSkv, kDqk}, true);
      add("d_sink", &bwd_.d_sink, SA_DTYPE_FP32, {kH}, true);
      host("lse").fill(1.5);
      for (int64_t h = 0; h < kH; ++h) host("lse").set(2 * kH + h, kInf);  // the empty row
    }
    const int32_t idx[kSq][kTopk] = {{0, 3, -1}, {1, 9, 4}, {5, 6, 8}, {7, 7, 2}};
    const int32_t len[kSq] = {3, 2, 0, 3};
    for (int64_t r = 0; r < kSq; ++r) {
      for (int64_t i = 0; i < kTopk; ++i) host("topk_idx").i32()[r * kTopk + i] = idx[r][i];
      host("topk_length").i32()[r] = len[r];
    }
    host("sink").set(0, 0.5);
    host("sink").set(1, -0.25);
  }

  sa_dsa_options& options() { return op_ == Op::kForward ? fwd_.options : bwd_.options; }

  sa_status run(const sa_context* ctx) const override {
    return op_ == Op::kForward ? sa_dsa_forward(&fwd_, ctx) : sa_dsa_backward(&bwd_, ctx);
  }
  sa_status workspace_size(size_t* bytes) const override {
    return op_ == Op::kForward ? sa_dsa_forward_workspace_size(&fwd_, bytes)
                               : sa_dsa_backward_workspace_size(&bwd_, bytes);
  }
  sa_cpp::Status run_cpp(const sa_context& ctx) const override {
    return op_ == Op::kForward ? sa_cpp::dsa_forward(fwd_, ctx) : sa_cpp::dsa_backward(bwd_, ctx);
  }
  const char* op_name() const override {
    return op_ == Op::kForward ? "dsa_forward" : "dsa_backward";
  }

 private:
  Op op_;
  sa_dsa_fwd_args fwd_ = sa_cpp::DsaForwardArgs();
  sa_dsa_bwd_args bwd_ = sa_cpp::DsaBackwardArgs();
};

// ---- tables of rejection cases --------------------------------------------------------------------

template <class CallT, class Cfg>
struct Case {
  std::string name;
  int ops;  // kFwd, kBwd or kBoth
  Cfg cfg;
  std::function<void(CallT&)> breakit;
  sa_status code;
  std::vector<std::string> expect;  // substrings of the message; "{op}" is the operation's name
};

template <class CallT, class Cfg>
struct Param {
  Case<CallT, Cfg> c;
  Op op;
};

template <class P>
std::string param_name(const ::testing::TestParamInfo<P>& info) {
  return std::string(info.param.op == Op::kForward ? "Forward_" : "Backward_") + info.param.c.name;
}

template <class CallT, class Cfg>
std::vector<Param<CallT, Cfg>> expand(const std::vector<Case<CallT, Cfg>>& cases) {
  std::vector<Param<CallT, Cfg>> out;
  for (const auto& c : cases) {
    if (c.ops & kFwd) out.push_back({c, Op::kForward});
    if (c.ops & kBwd) out.push_back({c, Op::kBackward});
  }
  return out;
}

// The messages of the dispatcher when a forced implementation cannot serve a CPU call.
std::vector<std::string> forced_unsupported(const char* impl_name, bool built) {
  if (!built)
    return {std::string("options.impl: implementation '") + impl_name +
            "' is not built into this library"};
  return {std::string("options.impl = ") + impl_name + " cannot serve {op}: ",
          std::string(impl_name) + ": "};
}

using BsaCase = Case<BsaCall, BsaConfig>;
using BsaParam = Param<BsaCall, BsaConfig>;

std::vector<BsaCase> bsa_cases() {
  const sa_status kArg = SA_ERROR_INVALID_ARGUMENT, kMeta = SA_ERROR_INVALID_METADATA;
  BsaConfig fp32, bf16, bshd, s200, skv200;
  bf16.dtype = SA_DTYPE_BF16;
  bshd.layout = SA_LAYOUT_BSHD;
  s200.Sq = s200.Skv = 200;
  skv200.Skv = 200;
  std::vector<BsaCase> v;
  auto add = [&](std::string name, int ops, BsaConfig cfg, std::function<void(BsaCall&)> f,
                 sa_status code, std::vector<std::string> expect) {
    v.push_back({std::move(name), ops, cfg, std::move(f), code, std::move(expect)});
  };

  // Missing required tensors.
  const std::pair<const char*, int> required[] = {
      {"q", kBoth}, {"k", kBoth}, {"v", kBoth}, {"sparsity.q2k_index", kBoth}, {"o", kBoth},
      {"lse", kBoth}, {"dout", kBwd}, {"dq", kBwd}, {"dk", kBwd}, {"dv", kBwd}};
  for (auto [name, ops] : required) {
    std::string n = name;
    std::string id = n == "sparsity.q2k_index" ? "Q2kIndex" : n;
    id[0] = static_cast<char>(std::toupper(id[0]));
    add("Null" + id, ops, fp32, [n](BsaCall& c) { c.t(n).data = nullptr; }, kArg,
        {n + ": required tensor is missing (data is NULL)"});
  }

  // Rank.
  add("QRank3", kBoth, fp32, [](BsaCall& c) { c.t("q").rank = 3; }, kArg,
      {"q: expected rank 4, got rank 3"});
  add("KRank5", kBoth, fp32, [](BsaCall& c) { c.t("k").rank = 5; }, kArg,
      {"k: expected rank 4, got rank 5"});
  add("VRankNegative", kBoth, fp32, [](BsaCall& c) { c.t("v").rank = -1; }, kArg,
      {"v: expected rank 4, got rank -1"});
  add("ORank3", kBoth, fp32, [](BsaCall& c) { c.t("o").rank = 3; }, kArg,
      {"o: expected rank 4, got rank 3"});
  add("LseRank2", kBoth, fp32, [](BsaCall& c) { c.t("lse").rank = 2; }, kArg,
      {"lse: expected rank 3, got rank 2"});
  add("DoutRank3", kBwd, fp32, [](BsaCall& c) { c.t("dout").rank = 3; }, kArg,
      {"dout: expected rank 4, got rank 3"});
  add("DkRank3", kBwd, fp32, [](BsaCall& c) { c.t("dk").rank = 3; }, kArg,
      {"dk: expected rank 4, got rank 3"});
  add("Q2kIndexRank3", kBoth, fp32, [](BsaCall& c) { c.t("sparsity.q2k_index").rank = 3; }, kArg,
      {"sparsity.q2k_index: expected rank 4, got rank 3"});
  add("Q2kCountRank2", kBoth, fp32, [](BsaCall& c) { c.t("sparsity.q2k_count").rank = 2; }, kArg,
      {"sparsity.q2k_count: expected rank 3, got rank 2"});
  add("KvBlockLenRank3", kBoth, fp32,
      [](BsaCall& c) { c.reshape("sparsity.kv_block_len", {1, 1, 2}); }, kArg,
      {"sparsity.kv_block_len: expected rank 1 [N_kv] or rank 2 [B, N_kv], got rank 3"});
  add("KvBlockLenRank0", kBoth, fp32, [](BsaCall& c) { c.t("sparsity.kv_block_len").rank = 0; },
      kArg, {"sparsity.kv_block_len: expected rank 1 [N_kv] or rank 2 [B, N_kv], got rank 0"});

  // Dtype.
  add("QInt32", kBoth, fp32, [](BsaCall& c) { c.retype("q", SA_DTYPE_INT32); }, kArg,
      {"q: expected dtype bf16, fp16, fp32 or fp64, got int32"});
  add("QUnknownDtype", kBoth, fp32, [](BsaCall& c) { store_bits(c.t("q").dtype, 17); },
      kArg, {"q: expected dtype bf16, fp16, fp32 or fp64, got an unknown dtype"});
  add("KFp16WithBf16Q", kBoth, bf16, [](BsaCall& c) { c.retype("k", SA_DTYPE_FP16); }, kArg,
      {"k: expected dtype bf16 (the dtype of q), got fp16"});
  add("VFp32WithBf16Q", kBoth, bf16, [](BsaCall& c) { c.retype("v", SA_DTYPE_FP32); }, kArg,
      {"v: expected dtype bf16 (the dtype of q), got fp32"});
  add("OFp16WithFp32Q", kBoth, fp32, [](BsaCall& c) { c.retype("o", SA_DTYPE_FP16); }, kArg,
      {"o: expected dtype fp32 (the dtype of q), got fp16"});
  add("LseBf16", kBoth, bf16, [](BsaCall& c) { c.retype("lse", SA_DTYPE_BF16); }, kArg,
      {"lse: expected dtype fp32, got bf16"});
  add("LseFp64", kBoth, fp32, [](BsaCall& c) { c.retype("lse", SA_DTYPE_FP64); }, kArg,
      {"lse: expected dtype fp32, got fp64"});
  add("Q2kIndexFp32", kBoth, fp32, [](BsaCall& c) { c.retype("sparsity.q2k_index", SA_DTYPE_FP32); },
      kArg, {"sparsity.q2k_index: expected dtype int32, got fp32"});
  add("Q2kCountFp32", kBoth, fp32, [](BsaCall& c) { c.retype("sparsity.q2k_count", SA_DTYPE_FP32); },
      kArg, {"sparsity.q2k_count: expected dtype int32, got fp32"});
  add("KvBlockLenFp64", kBoth, fp32,
      [](BsaCall& c) { c.retype("sparsity.kv_block_len", SA_DTYPE_FP64); }, kArg,
      {"sparsity.kv_block_len: expected dtype int32, got fp64"});
  add("DoutBf16WithFp32Q", kBwd, fp32, [](BsaCall& c) { c.retype("dout", SA_DTYPE_BF16); }, kArg,
      {"dout: expected dtype fp32 (the dtype of q), got bf16"});
  add("DqFp64", kBwd, fp32, [](BsaCall& c) { c.retype("dq", SA_DTYPE_FP64); }, kArg,
      {"dq: expected dtype fp32 (the dtype of q), got fp64"});
  add("DkFp32WithBf16K", kBwd, bf16, [](BsaCall& c) { c.retype("dk", SA_DTYPE_FP32); }, kArg,
      {"dk: expected dtype bf16 (the dtype of k), got fp32"});
  add("DvFp16", kBwd, fp32, [](BsaCall& c) { c.retype("dv", SA_DTYPE_FP16); }, kArg,
      {"dv: expected dtype fp32 (the dtype of v), got fp16"});

  // Shapes of q, k, v.
  add("QZeroSeq", kBoth, fp32, [](BsaCall& c) { c.t("q").shape[2] = 0; }, kArg,
      {"q: every dimension must be >= 1, got [1, 2, 0, 16]"});
  add("QNegativeDim", kBoth, fp32, [](BsaCall& c) { c.t("q").shape[3] = -16; }, kArg,
      {"q: dimension 3 is negative"});
  add("KBatchMismatch", kBoth, fp32, [](BsaCall& c) { c.reshape("k", {2, 1, 128, 16}); }, kArg,
      {"k: batch must equal q's batch 1, got 2"});
  add("KZeroSeq", kBoth, fp32, [](BsaCall& c) { c.t("k").shape[2] = 0; }, kArg,
      {"k: every dimension must be >= 1"});
  add("KHeadsDoNotDivideQHeads", kBoth, fp32, [](BsaCall& c) { c.reshape("k", {1, 3, 128, 16}); },
      kArg, {"k: H_kv = 3 must divide H_q = 2"});
  add("KHeadDimMismatch", kBoth, fp32, [](BsaCall& c) { c.reshape("k", {1, 1, 128, 32}); }, kArg,
      {"k: head dim must equal q's D = 16, got 32"});
  add("VSkvMismatch", kBoth, fp32, [](BsaCall& c) { c.reshape("v", {1, 1, 64, 8}); }, kArg,
      {"v: expected the batch, heads and S_kv of k ([1, 1, 128, 16]), got [1, 1, 64, 8]"});
  add("VHeadsMismatch", kBoth, fp32, [](BsaCall& c) { c.reshape("v", {1, 2, 128, 8}); }, kArg,
      {"v: expected the batch, heads and S_kv of k"});
  add("VZeroHeadDim", kBoth, fp32, [](BsaCall& c) { c.t("v").shape[3] = 0; }, kArg,
      {"v: D_v must be >= 1"});
  // BHSD tensors declared BSHD: q reads as [B=1, S=2, H=128], so N_q = 1 and H_q = 128.
  add("LayoutDoesNotMatchTensors", kBoth, fp32,
      [](BsaCall& c) { c.options().layout = SA_LAYOUT_BSHD; }, kArg,
      {"sparsity.q2k_index: expected shape [B, H_q, N_q, K_max] = [1, 128, 1, K_max]"});

  // Shapes of the other attention tensors (D_v comes from v, D from q).
  add("ODvMismatch", kBoth, fp32, [](BsaCall& c) { c.reshape("o", {1, 2, 128, 16}); }, kArg,
      {"o: expected shape [B, H_q, S_q, D_v] = [1, 2, 128, 8] in layout BHSD, "
       "got [1, 2, 128, 16]"});
  add("OSeqMismatch", kBoth, fp32, [](BsaCall& c) { c.reshape("o", {1, 2, 64, 8}); }, kArg,
      {"o: expected shape [B, H_q, S_q, D_v] = [1, 2, 128, 8] in layout BHSD, got [1, 2, 64, 8]"});
  add("ODvMismatchBshd", kBoth, bshd, [](BsaCall& c) { c.reshape("o", {1, 128, 2, 16}); }, kArg,
      {"o: expected shape [B, H_q, S_q, D_v] = [1, 128, 2, 8] in layout BSHD, "
       "got [1, 128, 2, 16]"});
  add("DoutShape", kBwd, fp32, [](BsaCall& c) { c.reshape("dout", {1, 2, 128, 16}); }, kArg,
      {"dout: expected shape [B, H_q, S_q, D_v] = [1, 2, 128, 8]"});
  add("DqShape", kBwd, fp32, [](BsaCall& c) { c.reshape("dq", {1, 2, 128, 8}); }, kArg,
      {"dq: expected shape [B, H_q, S_q, D] = [1, 2, 128, 16] in layout BHSD, got [1, 2, 128, 8]"});
  add("DkShape", kBwd, fp32, [](BsaCall& c) { c.reshape("dk", {1, 2, 128, 16}); }, kArg,
      {"dk: expected shape [B, H_kv, S_kv, D] = [1, 1, 128, 16]"});
  add("DvShape", kBwd, s200, [](BsaCall& c) { c.reshape("dv", {1, 1, 200, 16}); }, kArg,
      {"dv: expected shape [B, H_kv, S_kv, D_v] = [1, 1, 200, 8]"});

  // lse.
  add("LseSeq", kBoth, fp32, [](BsaCall& c) { c.reshape("lse", {1, 2, 64}); }, kArg,
      {"lse: expected shape [B, H_q, S_q] = [1, 2, 128], got [1, 2, 64]"});
  add("LseHeads", kBoth, s200, [](BsaCall& c) { c.reshape("lse", {1, 1, 200}); }, kArg,
      {"lse: expected shape [B, H_q, S_q] = [1, 2, 200], got [1, 1, 200]"});

  // Sparsity metadata shapes.
  add("Q2kIndexNq", kBoth, s200, [](BsaCall& c) { c.reshape("sparsity.q2k_index", {1, 2, 3, 2}); },
      kArg,
      {"sparsity.q2k_index: expected shape [B, H_q, N_q, K_max] = [1, 2, 4, K_max] "
       "(N_q = ceil(S_q / block_size)), got [1, 2, 3, 2]"});
  add("Q2kIndexHeads", kBoth, fp32,
      [](BsaCall& c) { c.reshape("sparsity.q2k_index", {1, 1, 2, 2}); }, kArg,
      {"sparsity.q2k_index: expected shape [B, H_q, N_q, K_max] = [1, 2, 2, K_max]"});
  add("Q2kIndexKmaxZero", kBoth, fp32, [](BsaCall& c) { c.t("sparsity.q2k_index").shape[3] = 0; },
      kArg, {"sparsity.q2k_index: K_max must be >= 1, got 0"});
  add("Q2kCountNq", kBoth, fp32, [](BsaCall& c) { c.reshape("sparsity.q2k_count", {1, 2, 3}); },
      kArg, {"sparsity.q2k_count: expected shape [B, H_q, N_q] = [1, 2, 2], got [1, 2, 3]"});
  add("KvBlockLenNkv", kBoth, skv200,
      [](BsaCall& c) { c.reshape("sparsity.kv_block_len", {3}); }, kArg,
      {"sparsity.kv_block_len: expected shape [N_kv] = [4] (N_kv = ceil(S_kv / block_size)), "
       "got [3]"});
  add("KvBlockLenBatch", kBoth, fp32,
      [](BsaCall& c) { c.reshape("sparsity.kv_block_len", {2, 2}); }, kArg,
      {"sparsity.kv_block_len: expected shape [B, N_kv] = [1, 2], got [2, 2]"});

  // Strides.
  add("QLastDimStrided", kBoth, fp32, [](BsaCall& c) { c.stride_last("q"); }, kArg,
      {"q: the last dimension must be contiguous (stride 1), got stride 2"});
  add("VLastDimStrided", kBoth, bf16, [](BsaCall& c) { c.stride_last("v"); }, kArg,
      {"v: the last dimension must be contiguous (stride 1), got stride 2"});
  add("OLastDimStrided", kBoth, fp32, [](BsaCall& c) { c.stride_last("o"); }, kArg,
      {"o: the last dimension must be contiguous (stride 1), got stride 2"});
  add("DoutLastDimStrided", kBwd, fp32, [](BsaCall& c) { c.stride_last("dout"); }, kArg,
      {"dout: the last dimension must be contiguous (stride 1), got stride 2"});
  add("DqLastDimStrided", kBwd, fp32, [](BsaCall& c) { c.stride_last("dq"); }, kArg,
      {"dq: the last dimension must be contiguous (stride 1), got stride 2"});
  add("KNegativeStride", kBoth, fp32, [](BsaCall& c) { c.negate_stride("k", 2); }, kArg,
      {"k: stride 2 is negative (-16); strides must be >= 0"});
  add("Q2kIndexNegativeStride", kBoth, fp32,
      [](BsaCall& c) { c.negate_stride("sparsity.q2k_index", 2); }, kArg,
      {"sparsity.q2k_index: stride 2 is negative (-2)"});
  add("OZeroStride", kFwd, fp32, [](BsaCall& c) { c.t("o").strides[2] = 0; }, kArg,
      {"o: output stride 2 is 0 on a dimension of size 128; outputs cannot broadcast"});
  add("LseZeroStride", kFwd, fp32, [](BsaCall& c) { c.t("lse").strides[1] = 0; }, kArg,
      {"lse: output stride 1 is 0 on a dimension of size 2; outputs cannot broadcast"});
  add("DqZeroStride", kBwd, fp32, [](BsaCall& c) { c.t("dq").strides[1] = 0; }, kArg,
      {"dq: output stride 1 is 0 on a dimension of size 2; outputs cannot broadcast"});
  add("DkZeroStride", kBwd, fp32, [](BsaCall& c) { c.t("dk").strides[2] = 0; }, kArg,
      {"dk: output stride 2 is 0 on a dimension of size 128"});
  add("DvZeroStrideLastDim", kBwd, fp32, [](BsaCall& c) { c.t("dv").strides[3] = 0; }, kArg,
      {"dv: output stride 3 is 0 on a dimension of size 8"});

  // Options.
  add("BlockSize96", kBoth, fp32, [](BsaCall& c) { c.options().block_size = 96; }, kArg,
      {"options.block_size: expected 64 or 128, got 96"});
  add("BlockSize0", kBoth, fp32, [](BsaCall& c) { c.options().block_size = 0; }, kArg,
      {"options.block_size: expected 64 or 128, got 0"});
  add("LayoutUnknown", kBoth, fp32,
      [](BsaCall& c) { store_bits(c.options().layout, 2); }, kArg,
      {"options.layout: expected SA_LAYOUT_BHSD or SA_LAYOUT_BSHD, got 2"});
  add("CountAboveKmaxWithoutQ2kCount", kBoth, fp32,
      [](BsaCall& c) {
        c.t("sparsity.q2k_count").data = nullptr;
        c.options().count = 3;
      },
      kArg,
      {"options.count: expected -1 (K_max) or a value in [0, 2] when sparsity.q2k_count is "
       "absent, got 3"});
  add("CountNegativeWithoutQ2kCount", kBoth, fp32,
      [](BsaCall& c) {
        c.t("sparsity.q2k_count").data = nullptr;
        c.options().count = -2;
      },
      kArg, {"options.count: expected -1 (K_max) or a value in [0, 2]", "got -2"});
  add("BucketSizeNegative", kBoth, fp32, [](BsaCall& c) { c.options().bucket_size = -1; }, kArg,
      {"options.bucket_size: expected >= 0 (0 = automatic), got -1"});
  add("ScaleNaN", kBoth, fp32, [](BsaCall& c) { c.options().scale = kNaN; }, kArg,
      {"options.scale: expected a finite value (0 for 1/sqrt(D))"});
  add("ScaleInf", kBoth, fp32, [](BsaCall& c) { c.options().scale = kInf; }, kArg,
      {"options.scale: expected a finite value (0 for 1/sqrt(D)), got inf"});
  add("ImplUnknown", kBoth, fp32, [](BsaCall& c) { store_bits(c.options().impl, 9); },
      kArg, {"options.impl: unknown implementation 9"});
  add("ForcedPortableOnCpu", kBoth, fp32,
      [](BsaCall& c) { c.options().impl = SA_IMPL_PORTABLE; }, SA_ERROR_UNSUPPORTED,
      forced_unsupported("portable", true));
  add("ForcedSm90OnCpu", kBoth, fp32, [](BsaCall& c) { c.options().impl = SA_IMPL_SM90; },
      SA_ERROR_UNSUPPORTED, forced_unsupported("sm90", SA_HAVE_SM90));

  // Devices (checked without a GPU: a host pointer can never pass as CUDA memory).
  add("QCudaWithHostPointer", kBoth, fp32, [](BsaCall& c) { c.t("q").device = SA_DEVICE_CUDA; },
      kArg, {"q: tensor says device cuda:0"});
  add("KOnCudaQOnCpu", kBoth, fp32, [](BsaCall& c) { c.t("k").device = SA_DEVICE_CUDA; }, kArg,
      {"k: expected device cpu like the other tensors, got cuda:0"});
  add("LseOnCuda", kBoth, fp32, [](BsaCall& c) { c.t("lse").device = SA_DEVICE_CUDA; }, kArg,
      {"lse: expected device cpu like the other tensors, got cuda:0"});
  add("Q2kCountOnCuda", kBoth, fp32,
      [](BsaCall& c) { c.t("sparsity.q2k_count").device = SA_DEVICE_CUDA; }, kArg,
      {"sparsity.q2k_count: expected device cpu like the other tensors, got cuda:0"});
  add("DkOnCuda1", kBwd, fp32,
      [](BsaCall& c) {
        c.t("dk").device = SA_DEVICE_CUDA;
        c.t("dk").device_index = 1;
      },
      kArg, {"dk: expected device cpu like the other tensors, got cuda:1"});
  add("VUnknownDevice", kBoth, fp32,
      [](BsaCall& c) { store_bits(c.t("v").device, 3); }, kArg,
      {"v: unknown device type 3"});

  // Metadata values: the reference checks them on every call and names the first bad entry.
  add("IndexOutOfRange", kBoth, fp32, [](BsaCall& c) { c.index(1, 1, 1) = 2; }, kMeta,
      {"q2k_index[b=0, h=1, m=1, slot=1] = 2: expected a KV block in [0, 2)"});
  add("IndexNegative", kBoth, s200, [](BsaCall& c) { c.index(0, 3, 0) = -1; }, kMeta,
      {"q2k_index[b=0, h=0, m=3, slot=0] = -1: expected a KV block in [0, 4)"});
  add("IndexDuplicate", kBoth, fp32, [](BsaCall& c) { c.index(0, 1, 1) = c.index(0, 1, 0); },
      kMeta,
      {"q2k_index[b=0, h=0, m=1, slot=1] = 1 repeats slot 0: entries of a row must be distinct"});
  add("FirstBadEntryIsReported", kBoth, fp32,
      [](BsaCall& c) {
        c.index(1, 0, 0) = 5;
        c.index(0, 1, 0) = 7;
      },
      kMeta, {"q2k_index[b=0, h=0, m=1, slot=0] = 7"});
  add("IndexOutOfRangeWithFixedCount", kBoth, fp32,
      [](BsaCall& c) {
        c.t("sparsity.q2k_count").data = nullptr;  // count -1: every row reads K_max entries
        c.index(1, 0, 1) = 9;
      },
      kMeta, {"q2k_index[b=0, h=1, m=0, slot=1] = 9: expected a KV block in [0, 2)"});
  add("IndexOutOfRangeWithValidateOption", kBoth, fp32,
      [](BsaCall& c) {
        c.options().validate = 1;
        c.index(0, 0, 1) = 2;
      },
      kMeta, {"q2k_index[b=0, h=0, m=0, slot=1] = 2: expected a KV block in [0, 2)"});
  add("CountAboveKmax", kBoth, fp32, [](BsaCall& c) { c.count(0, 1) = 3; }, kMeta,
      {"q2k_count[b=0, h=0, m=1] = 3: expected [0, 2]"});
  add("CountNegative", kBoth, fp32, [](BsaCall& c) { c.count(1, 0) = -1; }, kMeta,
      {"q2k_count[b=0, h=1, m=0] = -1: expected [0, 2]"});
  add("KvBlockLenZero", kBoth, fp32, [](BsaCall& c) { c.block_len(1) = 0; }, kMeta,
      {"kv_block_len[b=0, n=1] = 0: expected [1, 64]"});
  add("KvBlockLenAboveBlock", kBoth, fp32, [](BsaCall& c) { c.block_len(0) = 65; }, kMeta,
      {"kv_block_len[b=0, n=0] = 65: expected [1, 64]"});
  add("KvBlockLenPerBatchZero", kBoth, fp32,
      [](BsaCall& c) {
        sa_tensor& t = c.reshape("sparsity.kv_block_len", {1, 2});
        static_cast<int32_t*>(t.data)[0] = 64;  // [b=0, n=1] stays 0
      },
      kMeta, {"kv_block_len[b=0, n=1] = 0: expected [1, 64]"});
  return v;
}

class BsaRejects : public ::testing::TestWithParam<BsaParam> {};

TEST_P(BsaRejects, WithClearErrorAndUntouchedOutputs) {
  const BsaParam& p = GetParam();
  BsaCall c(p.op, p.c.cfg);
  p.c.breakit(c);
  expect_rejected(c, p.c.code, p.c.expect);
}

INSTANTIATE_TEST_SUITE_P(BsaValidation, BsaRejects, ::testing::ValuesIn(expand(bsa_cases())),
                         param_name<BsaParam>);

// ---- DSA rejection cases --------------------------------------------------------------------------

struct DsaConfig {};
using DsaCase = Case<DsaCall, DsaConfig>;
using DsaParam = Param<DsaCall, DsaConfig>;

std::vector<DsaCase> dsa_cases() {
  const sa_status kArg = SA_ERROR_INVALID_ARGUMENT;
  std::vector<DsaCase> v;
  auto add = [&](std::string name, int ops, std::function<void(DsaCall&)> f, sa_status code,
                 std::vector<std::string> expect) {
    v.push_back({std::move(name), ops, DsaConfig{}, std::move(f), code, std::move(expect)});
  };

  const std::pair<const char*, int> required[] = {
      {"q", kBoth},   {"kv", kBoth},  {"topk_idx", kBoth}, {"out", kBoth},
      {"lse", kBoth}, {"dout", kBwd}, {"dq", kBwd},        {"dkv", kBwd}};
  for (auto [name, ops] : required) {
    std::string n = name, id;
    bool up = true;
    for (char ch : n) {  // topk_idx -> TopkIdx
      if (ch == '_') {
        up = true;
        continue;
      }
      id += up ? static_cast<char>(std::toupper(ch)) : ch;
      up = false;
    }
    add("Null" + id, ops, [n](DsaCall& c) { c.t(n).data = nullptr; }, kArg,
        {n + ": required tensor is missing (data is NULL)"});
  }

  // Rank.
  add("QRank2", kBoth, [](DsaCall& c) { c.t("q").rank = 2; }, kArg,
      {"q: expected rank 3, got rank 2"});
  add("KvRank3", kBoth, [](DsaCall& c) { c.t("kv").rank = 3; }, kArg,
      {"kv: expected rank 2, got rank 3"});
  add("TopkIdxRank1", kBoth, [](DsaCall& c) { c.t("topk_idx").rank = 1; }, kArg,
      {"topk_idx: expected rank 2, got rank 1"});
  add("TopkLengthRank2", kBoth, [](DsaCall& c) { c.reshape("topk_length", {4, 1}); }, kArg,
      {"topk_length: expected rank 1, got rank 2"});
  add("SinkRank2", kBoth, [](DsaCall& c) { c.reshape("sink", {1, 2}); }, kArg,
      {"sink: expected rank 1, got rank 2"});
  add("OutRank2", kBoth, [](DsaCall& c) { c.t("out").rank = 2; }, kArg,
      {"out: expected rank 3, got rank 2"});
  add("LseRank3", kBoth, [](DsaCall& c) { c.reshape("lse", {4, 2, 1}); }, kArg,
      {"lse: expected rank 2, got rank 3"});
  add("DoutRank4", kBwd, [](DsaCall& c) { c.reshape("dout", {4, 2, 8, 1}); }, kArg,
      {"dout: expected rank 3, got rank 4"});
  add("DqRank2", kBwd, [](DsaCall& c) { c.t("dq").rank = 2; }, kArg,
      {"dq: expected rank 3, got rank 2"});
  add("DkvRank1", kBwd, [](DsaCall& c) { c.t("dkv").rank = 1; }, kArg,
      {"dkv: expected rank 2, got rank 1"});
  add("DSinkRank2", kBwd, [](DsaCall& c) { c.reshape("d_sink", {2, 1}); }, kArg,
      {"d_sink: expected rank 1, got rank 2"});

  // Dtype.
  add("QInt32", kBoth, [](DsaCall& c) { c.retype("q", SA_DTYPE_INT32); }, kArg,
      {"q: expected dtype bf16, fp16, fp32 or fp64, got int32"});
  add("KvBf16WithFp32Q", kBoth, [](DsaCall& c) { c.retype("kv", SA_DTYPE_BF16); }, kArg,
      {"kv: expected dtype fp32 (the dtype of q), got bf16"});
  add("TopkIdxFp32", kBoth, [](DsaCall& c) { c.retype("topk_idx", SA_DTYPE_FP32); }, kArg,
      {"topk_idx: expected dtype int32, got fp32"});
  add("TopkLengthFp64", kBoth, [](DsaCall& c) { c.retype("topk_length", SA_DTYPE_FP64); }, kArg,
      {"topk_length: expected dtype int32, got fp64"});
  add("SinkBf16", kBoth, [](DsaCall& c) { c.retype("sink", SA_DTYPE_BF16); }, kArg,
      {"sink: expected dtype fp32, got bf16"});
  add("SinkFp64", kBoth, [](DsaCall& c) { c.retype("sink", SA_DTYPE_FP64); }, kArg,
      {"sink: expected dtype fp32, got fp64"});
  add("OutBf16WithFp32Q", kBoth, [](DsaCall& c) { c.retype("out", SA_DTYPE_BF16); }, kArg,
      {"out: expected dtype fp32 (the dtype of q), got bf16"});
  add("LseFp64", kBoth, [](DsaCall& c) { c.retype("lse", SA_DTYPE_FP64); }, kArg,
      {"lse: expected dtype fp32, got fp64"});
  add("LseFp16", kBoth, [](DsaCall& c) { c.retype("lse", SA_DTYPE_FP16); }, kArg,
      {"lse: expected dtype fp32, got fp16"});
  add("DoutFp16", kBwd, [](DsaCall& c) { c.retype("dout", SA_DTYPE_FP16); }, kArg,
      {"dout: expected dtype fp32 (the dtype of q), got fp16"});
  add("DqBf16", kBwd, [](DsaCall& c) { c.retype("dq", SA_DTYPE_BF16); }, kArg,
      {"dq: expected dtype fp32 (the dtype of q), got bf16"});
  add("DkvFp64", kBwd, [](DsaCall& c) { c.retype("dkv", SA_DTYPE_FP64); }, kArg,
      {"dkv: expected dtype fp32 (the dtype of kv), got fp64"});
  add("DSinkBf16", kBwd, [](DsaCall& c) { c.retype("d_sink", SA_DTYPE_BF16); }, kArg,
      {"d_sink: expected dtype fp32, got bf16"});

  // Shapes.
  add("QZeroHeads", kBoth, [](DsaCall& c) { c.t("q").shape[1] = 0; }, kArg,
      {"q: expected shape [S_q, H, D_qk] with every dimension >= 1, got [4, 0, 16]"});
  add("KvDqkMismatch", kBoth, [](DsaCall& c) { c.reshape("kv", {10, 12}); }, kArg,
      {"kv: expected shape [S_kv, D_qk] with D_qk = 16 (from q), got [10, 12]"});
  add("KvZeroRows", kBoth, [](DsaCall& c) { c.t("kv").shape[0] = 0; }, kArg,
      {"kv: S_kv must be >= 1, got [0, 16]"});
  add("TopkIdxRows", kBoth, [](DsaCall& c) { c.reshape("topk_idx", {3, 3}); }, kArg,
      {"topk_idx: expected shape [S_q, topk] = [4, topk >= 1], got [3, 3]"});
  add("TopkZero", kBoth, [](DsaCall& c) { c.t("topk_idx").shape[1] = 0; }, kArg,
      {"topk_idx: expected shape [S_q, topk] = [4, topk >= 1], got [4, 0]"});
  add("TopkLengthShape", kBoth, [](DsaCall& c) { c.reshape("topk_length", {3}); }, kArg,
      {"topk_length: expected shape [S_q] = [4], got [3]"});
  add("SinkShape", kBoth, [](DsaCall& c) { c.reshape("sink", {3}); }, kArg,
      {"sink: expected shape [H] = [2], got [3]"});
  add("OutDv", kBoth, [](DsaCall& c) { c.reshape("out", {4, 2, 16}); }, kArg,
      {"out: expected shape [S_q, H, d_v] = [4, 2, 8], got [4, 2, 16]"});
  add("OutHeads", kBoth, [](DsaCall& c) { c.reshape("out", {4, 1, 8}); }, kArg,
      {"out: expected shape [S_q, H, d_v] = [4, 2, 8], got [4, 1, 8]"});
  add("LseHeads", kBoth, [](DsaCall& c) { c.reshape("lse", {4, 3}); }, kArg,
      {"lse: expected shape [S_q, H] = [4, 2], got [4, 3]"});
  add("LseRows", kBoth, [](DsaCall& c) { c.reshape("lse", {5, 2}); }, kArg,
      {"lse: expected shape [S_q, H] = [4, 2], got [5, 2]"});
  add("DoutShape", kBwd, [](DsaCall& c) { c.reshape("dout", {4, 2, 16}); }, kArg,
      {"dout: expected shape [S_q, H, d_v] = [4, 2, 8], got [4, 2, 16]"});
  add("DqShape", kBwd, [](DsaCall& c) { c.reshape("dq", {4, 2, 8}); }, kArg,
      {"dq: expected shape [S_q, H, D_qk] = [4, 2, 16], got [4, 2, 8]"});
  add("DkvRows", kBwd, [](DsaCall& c) { c.reshape("dkv", {9, 16}); }, kArg,
      {"dkv: expected shape [S_kv, D_qk] = [10, 16], got [9, 16]"});
  add("DkvValueColumnsOnly", kBwd, [](DsaCall& c) { c.reshape("dkv", {10, 8}); }, kArg,
      {"dkv: expected shape [S_kv, D_qk] = [10, 16], got [10, 8]"});
  add("DSinkShape", kBwd, [](DsaCall& c) { c.reshape("d_sink", {3}); }, kArg,
      {"d_sink: expected shape [H] = [2], got [3]"});

  // Strides.
  add("QLastDimStrided", kBoth, [](DsaCall& c) { c.stride_last("q"); }, kArg,
      {"q: the last dimension must be contiguous (stride 1), got stride 2"});
  add("KvLastDimStrided", kBoth, [](DsaCall& c) { c.stride_last("kv"); }, kArg,
      {"kv: the last dimension must be contiguous (stride 1), got stride 2"});
  add("OutLastDimStrided", kBoth, [](DsaCall& c) { c.stride_last("out"); }, kArg,
      {"out: the last dimension must be contiguous (stride 1), got stride 2"});
  add("DkvLastDimStrided", kBwd, [](DsaCall& c) { c.stride_last("dkv"); }, kArg,
      {"dkv: the last dimension must be contiguous (stride 1), got stride 2"});
  add("KvNegativeStride", kBoth, [](DsaCall& c) { c.negate_stride("kv", 0); }, kArg,
      {"kv: stride 0 is negative (-16); strides must be >= 0"});
  add("TopkIdxNegativeStride", kBoth, [](DsaCall& c) { c.negate_stride("topk_idx", 0); }, kArg,
      {"topk_idx: stride 0 is negative (-3); strides must be >= 0"});
  add("OutZeroStride", kFwd, [](DsaCall& c) { c.t("out").strides[1] = 0; }, kArg,
      {"out: output stride 1 is 0 on a dimension of size 2; outputs cannot broadcast"});
  add("LseZeroStride", kFwd, [](DsaCall& c) { c.t("lse").strides[0] = 0; }, kArg,
      {"lse: output stride 0 is 0 on a dimension of size 4; outputs cannot broadcast"});
  add("DqZeroStride", kBwd, [](DsaCall& c) { c.t("dq").strides[0] = 0; }, kArg,
      {"dq: output stride 0 is 0 on a dimension of size 4"});
  add("DkvZeroStride", kBwd, [](DsaCall& c) { c.t("dkv").strides[0] = 0; }, kArg,
      {"dkv: output stride 0 is 0 on a dimension of size 10"});
  add("DSinkZeroStride", kBwd, [](DsaCall& c) { c.t("d_sink").strides[0] = 0; }, kArg,
      {"d_sink: output stride 0 is 0 on a dimension of size 2"});

  // Options.
  add("ScaleNaN", kBoth, [](DsaCall& c) { c.options().scale = kNaN; }, kArg,
      {"options.scale: expected a finite value (0 for 1/sqrt(D_qk))"});
  add("ScaleNegativeInf", kBoth, [](DsaCall& c) { c.options().scale = -kInf; }, kArg,
      {"options.scale: expected a finite value (0 for 1/sqrt(D_qk)), got -inf"});
  add("ImplUnknown", kBoth, [](DsaCall& c) { store_bits(c.options().impl, -1); },
      kArg, {"options.impl: unknown implementation -1"});
  add("DvAboveDqk", kBoth, [](DsaCall& c) { c.options().d_v = 20; }, kArg,
      {"options.d_v: expected a value in [1, D_qk = 16] (0 for 512), got 20"});
  add("DvDefault512AboveDqk", kBoth, [](DsaCall& c) { c.options().d_v = 0; }, kArg,
      {"options.d_v: not set (0), so it defaults to 512, more than D_qk = 16 (from q): set d_v "
       "to a value in [1, 16]"});
  add("Dv512AboveDqk", kBoth, [](DsaCall& c) { c.options().d_v = 512; }, kArg,
      {"options.d_v: expected a value in [1, D_qk = 16] (0 for 512), got 512"});
  add("DvNegative", kBoth, [](DsaCall& c) { c.options().d_v = -8; }, kArg,
      {"options.d_v: expected a value in [1, D_qk = 16] (0 for 512), got -8"});
  add("ForcedPortableOnCpu", kBoth, [](DsaCall& c) { c.options().impl = SA_IMPL_PORTABLE; },
      SA_ERROR_UNSUPPORTED, forced_unsupported("portable", true));
  add("ForcedSm90OnCpu", kBoth, [](DsaCall& c) { c.options().impl = SA_IMPL_SM90; },
      SA_ERROR_UNSUPPORTED, forced_unsupported("sm90", SA_HAVE_SM90));

  // Devices.
  add("QCudaWithHostPointer", kBoth, [](DsaCall& c) { c.t("q").device = SA_DEVICE_CUDA; }, kArg,
      {"q: tensor says device cuda:0"});
  add("KvOnCudaQOnCpu", kBoth, [](DsaCall& c) { c.t("kv").device = SA_DEVICE_CUDA; }, kArg,
      {"kv: expected device cpu like the other tensors, got cuda:0"});
  add("TopkLengthOnCuda", kBoth, [](DsaCall& c) { c.t("topk_length").device = SA_DEVICE_CUDA; },
      kArg, {"topk_length: expected device cpu like the other tensors, got cuda:0"});
  add("SinkOnCuda", kBoth, [](DsaCall& c) { c.t("sink").device = SA_DEVICE_CUDA; }, kArg,
      {"sink: expected device cpu like the other tensors, got cuda:0"});
  add("DSinkOnCuda", kBwd, [](DsaCall& c) { c.t("d_sink").device = SA_DEVICE_CUDA; }, kArg,
      {"d_sink: expected device cpu like the other tensors, got cuda:0"});
  add("OutUnknownDevice", kBoth,
      [](DsaCall& c) { store_bits(c.t("out").device, 2); }, kArg,
      {"out: unknown device type 2"});
  return v;
}

class DsaRejects : public ::testing::TestWithParam<DsaParam> {};

TEST_P(DsaRejects, WithClearErrorAndUntouchedOutputs) {
  const DsaParam& p = GetParam();
  DsaCall c(p.op);
  p.c.breakit(c);
  expect_rejected(c, p.c.code, p.c.expect);
}

INSTANTIATE_TEST_SUITE_P(DsaValidation, DsaRejects, ::testing::ValuesIn(expand(dsa_cases())),
                         param_name<DsaParam>);

// ---- valid BSA calls --------------------------------------------------------------------------------

struct BsaValid {
  std::string name;
  Op op;
  BsaConfig cfg;
};

std::vector<BsaValid> bsa_valid_calls() {
  std::vector<BsaValid> v;
  for (Op op : {Op::kForward, Op::kBackward})
    for (sa_dtype dt : {SA_DTYPE_FP32, SA_DTYPE_BF16})
      for (sa_layout l : {SA_LAYOUT_BHSD, SA_LAYOUT_BSHD})
        for (auto [sq, skv] : {std::pair<int64_t, int64_t>{128, 128}, {200, 200}, {200, 128}}) {
          BsaConfig c;
          c.dtype = dt;
          c.layout = l;
          c.Sq = sq;
          c.Skv = skv;
          std::string name = std::string(op == Op::kForward ? "Forward_" : "Backward_") +
                             (dt == SA_DTYPE_FP32 ? "Fp32_" : "Bf16_") +
                             (l == SA_LAYOUT_BHSD ? "Bhsd_" : "Bshd_") + "Sq" +
                             std::to_string(sq) + "_Skv" + std::to_string(skv);
          v.push_back({name, op, c});
        }
  return v;
}

class BsaAccepts : public ::testing::TestWithParam<BsaValid> {};

TEST_P(BsaAccepts, ValidCallWritesEveryOutput) {
  BsaCall c(GetParam().op, GetParam().cfg);
  expect_accepted(c);
}

TEST_P(BsaAccepts, ForcedReferenceAndNullContext) {
  BsaCall c(GetParam().op, GetParam().cfg);
  c.options().impl = SA_IMPL_REFERENCE;
  expect_accepted(c);
  EXPECT_EQ(c.run(nullptr), SA_OK) << sa_last_error();  // NULL context: the default one
}

TEST_P(BsaAccepts, OptionalMetadataAbsent) {
  for (int32_t count : {-1, 0, 1, 2}) {
    SCOPED_TRACE("options.count = " + std::to_string(count));
    BsaCall c(GetParam().op, GetParam().cfg);
    c.t("sparsity.q2k_count").data = nullptr;
    c.t("sparsity.kv_block_len").data = nullptr;
    c.options().count = count;
    expect_accepted(c);
  }
}

INSTANTIATE_TEST_SUITE_P(BsaValidation, BsaAccepts, ::testing::ValuesIn(bsa_valid_calls()),
                         [](const ::testing::TestParamInfo<BsaValid>& i) { return i.param.name; });

// Runs `a` (contiguous) and `b` (the same values in other views); every output of b must equal
// a's bit for bit, element for element.
::testing::AssertionResult same_outputs(Call& a, Call& b) {
  if (a.run(nullptr) != SA_OK) return ::testing::AssertionFailure() << "a: " << sa_last_error();
  if (b.run(nullptr) != SA_OK) return ::testing::AssertionFailure() << "b: " << sa_last_error();
  for (const std::string& name : a.outputs()) {
    const std::vector<int64_t> oa = view_offsets(a.t(name)), ob = view_offsets(b.t(name));
    for (size_t i = 0; i < oa.size(); ++i) {
      const double x = a.host(name).get(oa[i]), y = b.host(name).get(ob[i]);
      if (!(x == y))
        return ::testing::AssertionFailure()
               << name << ": element " << i << " is " << y << ", expected " << x;
    }
  }
  return ::testing::AssertionSuccess();
}

// Every element of an output's buffer that its view does not cover is still the poison.
::testing::AssertionResult padding_untouched(Call& c) {
  for (const std::string& name : c.outputs()) {
    const std::vector<int64_t> offs = view_offsets(c.t(name));
    const std::set<int64_t> covered(offs.begin(), offs.end());
    HostTensor& h = c.host(name);
    for (int64_t i = 0; i < h.numel(); ++i)
      if (!covered.count(i) && !std::isnan(h.get(i)))
        return ::testing::AssertionFailure() << name << ": padding element " << i << " written";
  }
  return ::testing::AssertionSuccess();
}

class BsaStridedViews : public ::testing::TestWithParam<Op> {};

// BSHD tensors whose head and sequence strides are not the contiguous ones are accepted and give
// the same results; nothing outside the views is written.
TEST_P(BsaStridedViews, BshdNonContiguousHeadAndSeqAccepted) {
  BsaConfig cfg;
  cfg.layout = SA_LAYOUT_BSHD;
  cfg.dtype = SA_DTYPE_BF16;
  cfg.Sq = cfg.Skv = 200;
  BsaCall contiguous(GetParam(), cfg), strided(GetParam(), cfg);
  for (const char* name : {"q", "k", "v", "o", "lse", "dout", "dq", "dk", "dv"})
    if (strided.has(name)) strided.restride(name);
  EXPECT_NE(strided.t("q").strides[1], BsaCall::kHq * BsaCall::kD);
  expect_accepted(strided);
  EXPECT_TRUE(same_outputs(contiguous, strided));
  EXPECT_TRUE(padding_untouched(strided));
}

INSTANTIATE_TEST_SUITE_P(BsaValidation, BsaStridedViews,
                         ::testing::Values(Op::kForward, Op::kBackward),
                         [](const ::testing::TestParamInfo<Op>& i) {
                           return std::string(i.param == Op::kForward ? "Forward" : "Backward");
                         });

class BsaBroadcastMetadata : public ::testing::TestWithParam<Op> {};

// Metadata may broadcast (stride 0): one index row and one count for every head, one block length
// for every KV block. Same results as the materialised metadata.
TEST_P(BsaBroadcastMetadata, StrideZeroMetadataAccepted) {
  BsaCall full(GetParam(), BsaConfig{}), bcast(GetParam(), BsaConfig{});
  for (BsaCall* c : {&full, &bcast}) {
    for (int64_t m = 0; m < c->Nq(); ++m) {  // head 1 = head 0
      for (int64_t s = 0; s < BsaCall::kKmax; ++s) c->index(1, m, s) = c->index(0, m, s);
      c->count(1, m) = c->count(0, m);
    }
    for (int64_t n = 0; n < c->Nkv(); ++n) c->block_len(n) = 64;
  }
  bcast.t("sparsity.q2k_index").strides[1] = 0;
  bcast.t("sparsity.q2k_count").strides[1] = 0;
  bcast.t("sparsity.kv_block_len").strides[0] = 0;
  bcast.t("sparsity.kv_block_len").shape[0] = bcast.Nkv();
  expect_accepted(bcast);
  EXPECT_TRUE(same_outputs(full, bcast));
}

// Entries past a row's count are never read, so any value there is accepted.
TEST_P(BsaBroadcastMetadata, EntriesPastCountAreNotChecked) {
  BsaCall a(GetParam(), BsaConfig{}), b(GetParam(), BsaConfig{});
  b.index(1, 0, 1) = -7;  // row (h=1, m=0) has count 1
  expect_accepted(b);
  EXPECT_TRUE(same_outputs(a, b));
}

// With q2k_count given, options.count is not used and not checked.
TEST_P(BsaBroadcastMetadata, CountIgnoredWhenQ2kCountGiven) {
  BsaCall a(GetParam(), BsaConfig{}), b(GetParam(), BsaConfig{});
  b.options().count = 1000;
  expect_accepted(b);
  EXPECT_TRUE(same_outputs(a, b));
}

INSTANTIATE_TEST_SUITE_P(BsaValidation, BsaBroadcastMetadata,
                         ::testing::Values(Op::kForward, Op::kBackward),
                         [](const ::testing::TestParamInfo<Op>& i) {
                           return std::string(i.param == Op::kForward ? "Forward" : "Backward");
                         });

// ---- valid DSA calls --------------------------------------------------------------------------------

class DsaAccepts : public ::testing::TestWithParam<Op> {};

TEST_P(DsaAccepts, ValidCallWritesEveryOutput) {
  DsaCall c(GetParam());
  expect_accepted(c);
  DsaCall bf16(GetParam(), SA_DTYPE_BF16);
  expect_accepted(bf16);
}

TEST_P(DsaAccepts, OptionalTensorsAbsent) {
  DsaCall c(GetParam());
  c.t("topk_length").data = nullptr;
  c.t("sink").data = nullptr;
  if (GetParam() == Op::kBackward) c.t("d_sink").data = nullptr;
  expect_accepted(c);
  EXPECT_EQ(c.run(nullptr), SA_OK) << sa_last_error();
}

TEST_P(DsaAccepts, DefaultScaleAndForcedReference) {
  DsaCall c(GetParam());
  c.options().scale = 0.f;
  c.options().impl = SA_IMPL_REFERENCE;
  expect_accepted(c);
}

// SPEC 2: any index value is allowed; inactive ones are never read. Not a validation error.
TEST_P(DsaAccepts, AnyIndexValueAccepted) {
  DsaCall c(GetParam());
  const int32_t wild[] = {-1, 10, INT_MAX, INT_MIN, -100000, 1 << 30};
  for (int i = 0; i < 6; ++i) c.host("topk_idx").i32()[i] = wild[i];
  c.host("topk_length").i32()[0] = 100;  // clamped to topk
  c.host("topk_length").i32()[1] = -5;   // an empty row
  expect_accepted(c);
}

TEST_P(DsaAccepts, NonContiguousViewsAccepted) {
  DsaCall contiguous(GetParam()), strided(GetParam());
  for (const char* name : {"q", "kv", "out", "lse", "dout", "dq", "dkv"})
    if (strided.has(name)) strided.restride(name);
  expect_accepted(strided);
  EXPECT_TRUE(same_outputs(contiguous, strided));
  EXPECT_TRUE(padding_untouched(strided));
}

INSTANTIATE_TEST_SUITE_P(DsaValidation, DsaAccepts, ::testing::Values(Op::kForward, Op::kBackward),
                         [](const ::testing::TestParamInfo<Op>& i) {
                           return std::string(i.param == Op::kForward ? "Forward" : "Backward");
                         });

// ---- the entry points themselves ---------------------------------------------------------------------

TEST(ApiValidation, NullArgsPointer) {
  size_t bytes = 7;
  const sa_context ctx = sa_context_default();
  auto expect_null_args = [](sa_status st, const char* what) {
    EXPECT_EQ(st, SA_ERROR_INVALID_ARGUMENT) << what;
    EXPECT_TRUE(has_substr(sa_last_error(), "args: NULL")) << what;
  };
  expect_null_args(sa_bsa_forward(nullptr, &ctx), "sa_bsa_forward");
  expect_null_args(sa_bsa_backward(nullptr, &ctx), "sa_bsa_backward");
  expect_null_args(sa_dsa_forward(nullptr, &ctx), "sa_dsa_forward");
  expect_null_args(sa_dsa_backward(nullptr, nullptr), "sa_dsa_backward");
  expect_null_args(sa_bsa_forward_workspace_size(nullptr, &bytes), "bsa fwd workspace");
  expect_null_args(sa_bsa_backward_workspace_size(nullptr, &bytes), "bsa bwd workspace");
  expect_null_args(sa_dsa_forward_workspace_size(nullptr, &bytes), "dsa fwd workspace");
  expect_null_args(sa_dsa_backward_workspace_size(nullptr, &bytes), "dsa bwd workspace");
  EXPECT_EQ(bytes, 7u);
}

TEST(ApiValidation, NullBytesPointer) {
  BsaCall bf(Op::kForward, BsaConfig{}), bb(Op::kBackward, BsaConfig{});
  DsaCall df(Op::kForward), db(Op::kBackward);
  for (Call* c : std::initializer_list<Call*>{&bf, &bb, &df, &db}) {
    EXPECT_EQ(c->workspace_size(nullptr), SA_ERROR_INVALID_ARGUMENT) << c->op_name();
    EXPECT_TRUE(has_substr(sa_last_error(), "bytes: NULL")) << c->op_name();
  }
}

// The C++ wrappers accept the plain C structs as well, and a success clears the last error.
TEST(ApiValidation, LastErrorIsPerCall) {
  sa_cpp::BsaForwardArgs empty;  // every tensor absent
  const sa_cpp::Status bad = sa_cpp::bsa_forward(empty);
  EXPECT_EQ(bad.code(), SA_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(has_substr(bad.message(), "q: required tensor is missing"));
  EXPECT_TRUE(has_substr(sa_last_error(), "q: required tensor is missing"));
  BsaCall c(Op::kForward, BsaConfig{});
  EXPECT_EQ(c.run(nullptr), SA_OK);
  EXPECT_STREQ(sa_last_error(), "");
  EXPECT_STREQ(sa_status_name(SA_ERROR_INVALID_METADATA), "SA_ERROR_INVALID_METADATA");
  // sa_status_name(42) from C returns "SA_ERROR_UNKNOWN" (it reads the argument's bits); C++
  // cannot make that call without an out-of-range enum value, so it is not made here.
}

// A view of rank above SA_MAX_RANK from the helpers keeps its rank, so validation names it
// instead of silently dropping a dimension.
TEST(ApiValidation, ContiguousHelperKeepsAnOversizedRank) {
  BsaCall c(Op::kForward, BsaConfig{});
  const int64_t shape5[5] = {1, 2, 128, 16, 1};
  c.t("q") = sa_tensor_contiguous(c.host("q").data(), SA_DTYPE_FP32, 5, shape5, SA_DEVICE_CPU, 0);
  expect_rejected(c, SA_ERROR_INVALID_ARGUMENT, {"q: expected rank 4, got rank 5"});
}

}  // namespace
