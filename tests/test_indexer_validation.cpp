// Validation of the DSA indexer's arguments through the public API (SPEC 3 and 5): a bad
// argument of scores, top-k or loss gets the right status and a message that names it, before
// anything runs, and no output is touched. Each case starts from a small valid CPU call, breaks
// one thing and makes the call three ways (*_workspace_size, the C entry point, the C++
// wrapper). Also: valid calls run the reference with no workspace, and SPEC 5's GPU contract
// (indexer_gpu_contract) names what a CUDA call would lack.
//
// Tables of cases:  IndexerValidation/IndexerRejects.*
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "common/indexer_problem.hpp"
#include "indexer_case.hpp"
#include "test_util.hpp"

namespace sa_test {
namespace {

namespace sa_cpp = sparse_attention;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

enum Op { kScores = 1, kTopk = 2, kLoss = 4, kAll = 7 };

IndexerShape small_shape() {
  IndexerShape s;
  s.Sq = 5;
  s.Skv = 7;
  s.HI = 2;
  s.DI = 4;
  s.H = 2;
  s.Dqk = 6;
  return s;
}

// One valid call of `op` on fp32 CPU tensors (sparse loss with topk_idx and topk_length), its
// argument fields by name, and its outputs.
class IndexerCall {
 public:
  explicit IndexerCall(Op op, sa_dtype dtype = SA_DTYPE_FP32)
      : op_(op), c_(make_indexer_case(small_shape(), IndexerRanges::kCausal, dtype, 3)) {
    const IndexerShape& s = c_.shape;
    scores_ = HostTensor(SA_DTYPE_FP32, {s.Sq, s.Skv});
    idx_out_ = HostTensor(SA_DTYPE_INT32, {s.Sq, 3});
    len_out_ = HostTensor(SA_DTYPE_INT32, {s.Sq});
    idx_in_ = HostTensor(SA_DTYPE_INT32, {s.Sq, 3});
    len_in_ = HostTensor(SA_DTYPE_INT32, {s.Sq});
    for (int64_t t = 0; t < s.Sq; ++t) {
      len_in_.i32()[t] = 2;
      for (int64_t i = 0; i < 3; ++i) idx_in_.i32()[t * 3 + i] = static_cast<int32_t>(i);
    }
    out_ = c_.loss_out(SA_DTYPE_FP32);
    scores_.poison();
    idx_out_.fill(-77);
    len_out_.fill(-77);
    scores_args_ = c_.scores_args(scores_);
    topk_args_ = c_.topk_args(idx_out_, &len_out_);
    loss_args_ = c_.loss_args(out_, &idx_in_, &len_in_);
    bind();
  }
  IndexerCall(const IndexerCall&) = delete;
  IndexerCall& operator=(const IndexerCall&) = delete;

  Op op() const { return op_; }
  const char* op_name() const {
    return op_ == kScores ? "indexer_scores" : op_ == kTopk ? "indexer_topk" : "indexer_loss";
  }
  sa_tensor& t(const std::string& name) {
    auto it = fields_.find(name);
    if (it == fields_.end()) {
      ADD_FAILURE() << op_name() << " has no tensor '" << name << "'";
      static sa_tensor dummy;
      return dummy;
    }
    return *it->second;
  }
  sa_indexer_options& options() {
    return op_ == kScores ? scores_args_.options
                          : op_ == kTopk ? topk_args_.options : loss_args_.options;
  }
  sa_status run(const sa_context* ctx) const {
    switch (op_) {
      case kScores: return sa_indexer_scores(&scores_args_, ctx);
      case kTopk: return sa_indexer_topk(&topk_args_, ctx);
      default: return sa_indexer_loss(&loss_args_, ctx);
    }
  }
  sa_status workspace_size(size_t* bytes) const {
    switch (op_) {
      case kScores: return sa_indexer_scores_workspace_size(&scores_args_, bytes);
      case kTopk: return sa_indexer_topk_workspace_size(&topk_args_, bytes);
      default: return sa_indexer_loss_workspace_size(&loss_args_, bytes);
    }
  }
  sa_cpp::Status run_cpp() const {
    switch (op_) {
      case kScores: return sa_cpp::indexer_scores(scores_args_);
      case kTopk: return sa_cpp::indexer_topk(topk_args_);
      default: return sa_cpp::indexer_loss(loss_args_);
    }
  }
  // Every output buffer's bytes.
  std::vector<std::vector<uint8_t>> output_bytes() const {
    return {scores_.bytes(), idx_out_.bytes(), len_out_.bytes(), out_.loss.bytes(),
            out_.per_token.bytes(), out_.dq_I.bytes(), out_.dk_I.bytes(), out_.dw.bytes()};
  }
  IndexerCase::LossOut& loss_out() { return out_; }
  HostTensor& scores() { return scores_; }
  HostTensor& topk_idx_out() { return idx_out_; }

 private:
  void bind() {
    if (op_ == kScores) {
      sa_indexer_scores_args& a = scores_args_;
      fields_ = {{"q_I", &a.q_I}, {"k_I", &a.k_I}, {"w", &a.w}, {"k_start", &a.k_start},
                 {"k_end", &a.k_end}, {"scores", &a.scores}};
    } else if (op_ == kTopk) {
      sa_indexer_topk_args& a = topk_args_;
      fields_ = {{"q_I", &a.q_I}, {"k_I", &a.k_I}, {"w", &a.w}, {"k_start", &a.k_start},
                 {"k_end", &a.k_end}, {"topk_idx", &a.topk_idx}, {"topk_length", &a.topk_length}};
    } else {
      sa_indexer_loss_args& a = loss_args_;
      fields_ = {{"q_I", &a.q_I}, {"k_I", &a.k_I}, {"w", &a.w}, {"q", &a.q}, {"kv", &a.kv},
                 {"lse", &a.lse}, {"topk_idx", &a.topk_idx}, {"topk_length", &a.topk_length},
                 {"k_start", &a.k_start}, {"k_end", &a.k_end}, {"loss", &a.loss},
                 {"loss_per_token", &a.loss_per_token}, {"dq_I", &a.dq_I}, {"dk_I", &a.dk_I},
                 {"dw", &a.dw}};
    }
  }

  Op op_;
  IndexerCase c_;
  HostTensor scores_, idx_out_, len_out_, idx_in_, len_in_;
  IndexerCase::LossOut out_;
  sa_indexer_scores_args scores_args_ = sa_indexer_scores_args_default();
  sa_indexer_topk_args topk_args_ = sa_indexer_topk_args_default();
  sa_indexer_loss_args loss_args_ = sa_indexer_loss_args_default();
  std::map<std::string, sa_tensor*> fields_;
};

::testing::AssertionResult has_substr(const std::string& msg, const std::string& want) {
  if (msg.find(want) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << want << "\"";
}

void expect_rejected(IndexerCall& c, sa_status code, const std::string& expect) {
  const auto before = c.output_bytes();
  size_t bytes = 12345;
  EXPECT_EQ(c.workspace_size(&bytes), code) << "workspace query";
  EXPECT_TRUE(has_substr(sa_last_error(), expect)) << "workspace query";
  EXPECT_EQ(bytes, 12345u) << "the query wrote its result despite the error";
  const sa_context ctx = sa_context_default();
  EXPECT_EQ(c.run(&ctx), code) << "C call";
  EXPECT_TRUE(has_substr(sa_last_error(), expect)) << "C call";
  const sa_cpp::Status st = c.run_cpp();
  EXPECT_EQ(st.code(), code) << "C++ call";
  EXPECT_TRUE(has_substr(st.message(), expect)) << "C++ call";
  EXPECT_TRUE(c.output_bytes() == before) << "an output was touched";
}

// ---- rejection cases -------------------------------------------------------------------------
struct RejectCase {
  std::string name;
  int ops;
  std::function<void(IndexerCall&)> breakit;
  sa_status code;
  std::string expect;
};

struct RejectParam {
  std::string name;
  Op op;
  RejectCase c;
};

void retype(sa_tensor& t, sa_dtype d) { t.dtype = d; }

std::vector<RejectCase> reject_cases() {
  const sa_status kArg = SA_ERROR_INVALID_ARGUMENT;
  std::vector<RejectCase> v;
  auto add = [&](std::string name, int ops, std::function<void(IndexerCall&)> f,
                 sa_status code, std::string expect) {
    v.push_back({std::move(name), ops, std::move(f), code, std::move(expect)});
  };
  // Required tensors.
  const std::pair<const char*, int> required[] = {
      {"q_I", kAll}, {"k_I", kAll}, {"w", kAll}, {"scores", kScores}, {"topk_idx", kTopk},
      {"q", kLoss},  {"kv", kLoss}, {"lse", kLoss}, {"loss", kLoss}};
  for (auto [name, ops] : required) {
    std::string n = name, id = "Null_" + n;
    add(id, ops, [n](IndexerCall& c) { c.t(n).data = nullptr; }, kArg,
        n + ": required tensor is missing (data is NULL)");
  }
  // Ranks.
  add("QIRank2", kAll, [](IndexerCall& c) { c.t("q_I").rank = 2; }, kArg,
      "q_I: expected rank 3, got rank 2");
  add("KIRank3", kAll, [](IndexerCall& c) { c.t("k_I").rank = 3; }, kArg,
      "k_I: expected rank 2, got rank 3");
  add("WRank1", kAll, [](IndexerCall& c) { c.t("w").rank = 1; }, kArg,
      "w: expected rank 2, got rank 1");
  add("KStartRank2", kAll, [](IndexerCall& c) { c.t("k_start").rank = 2; }, kArg,
      "k_start: expected rank 1, got rank 2");
  add("ScoresRank3", kScores, [](IndexerCall& c) { c.t("scores").rank = 3; }, kArg,
      "scores: expected rank 2, got rank 3");
  add("LossRank1", kLoss, [](IndexerCall& c) { c.t("loss").rank = 1; }, kArg,
      "loss: expected rank 0, got rank 1");
  // Dtypes.
  add("KIFp64", kAll, [](IndexerCall& c) { retype(c.t("k_I"), SA_DTYPE_FP64); }, kArg,
      "k_I: expected dtype fp32 (the dtype of q_I), got fp64");
  add("WBf16", kAll, [](IndexerCall& c) { retype(c.t("w"), SA_DTYPE_BF16); }, kArg,
      "w: expected dtype fp32 or fp64, got bf16");
  add("KEndFp32", kAll, [](IndexerCall& c) { retype(c.t("k_end"), SA_DTYPE_FP32); }, kArg,
      "k_end: expected dtype int32, got fp32");
  add("ScoresFp64", kScores, [](IndexerCall& c) { retype(c.t("scores"), SA_DTYPE_FP64); }, kArg,
      "scores: expected dtype fp32, got fp64");
  add("TopkIdxFp32", kTopk | kLoss,
      [](IndexerCall& c) { retype(c.t("topk_idx"), SA_DTYPE_FP32); }, kArg,
      "topk_idx: expected dtype int32, got fp32");
  add("KvBf16", kLoss, [](IndexerCall& c) { retype(c.t("kv"), SA_DTYPE_BF16); }, kArg,
      "kv: expected dtype fp32 (the dtype of q), got bf16");
  add("LseFp64", kLoss, [](IndexerCall& c) { retype(c.t("lse"), SA_DTYPE_FP64); }, kArg,
      "lse: expected dtype fp32, got fp64");
  add("LossInt32", kLoss, [](IndexerCall& c) { retype(c.t("loss"), SA_DTYPE_INT32); }, kArg,
      "loss: expected dtype fp32 or fp64, got int32");
  add("PerTokenFp64", kLoss,
      [](IndexerCall& c) { retype(c.t("loss_per_token"), SA_DTYPE_FP64); }, kArg,
      "loss_per_token: expected dtype fp32 (the dtype of loss), got fp64");
  add("DqIBf16", kLoss, [](IndexerCall& c) { retype(c.t("dq_I"), SA_DTYPE_BF16); }, kArg,
      "dq_I: expected dtype fp32 (the dtype of q_I), got bf16");
  add("DwFp64", kLoss, [](IndexerCall& c) { retype(c.t("dw"), SA_DTYPE_FP64); }, kArg,
      "dw: expected dtype fp32 (the dtype of w), got fp64");
  // Shapes.
  add("QIZeroHeads", kAll, [](IndexerCall& c) { c.t("q_I").shape[1] = 0; }, kArg,
      "q_I: expected shape [S_q, H_I, D_I] with every dimension >= 1, got [5, 0, 4]");
  add("KIWidth", kAll, [](IndexerCall& c) { c.t("k_I").shape[1] = 3; }, kArg,
      "k_I: expected shape [S_kv, D_I] with D_I = 4 (from q_I), got [7, 3]");
  add("KIZeroRows", kAll, [](IndexerCall& c) { c.t("k_I").shape[0] = 0; }, kArg,
      "k_I: S_kv must be >= 1, got [0, 4]");
  add("KIRowsPastInt32", kTopk, [](IndexerCall& c) { c.t("k_I").shape[0] = int64_t{1} << 31; },
      kArg, "k_I: S_kv = 2147483648 does not fit the int32 key indices of topk_idx");
  add("WHeads", kAll, [](IndexerCall& c) { c.t("w").shape[1] = 3; }, kArg,
      "w: expected shape [S_q, H_I] = [5, 2], got [5, 3]");
  add("KStartRows", kAll, [](IndexerCall& c) { c.t("k_start").shape[0] = 4; }, kArg,
      "k_start: expected shape [S_q] = [5], got [4]");
  add("KEndRows", kAll, [](IndexerCall& c) { c.t("k_end").shape[0] = 6; }, kArg,
      "k_end: expected shape [S_q] = [5], got [6]");
  add("ScoresColumns", kScores, [](IndexerCall& c) { c.t("scores").shape[1] = 6; }, kArg,
      "scores: expected shape [S_q, S_kv] = [5, 7], got [5, 6]");
  add("TopkZero", kTopk | kLoss, [](IndexerCall& c) { c.t("topk_idx").shape[1] = 0; }, kArg,
      "topk_idx: expected shape [S_q, topk] = [5, topk >= 1], got [5, 0]");
  add("TopkIdxRows", kTopk | kLoss, [](IndexerCall& c) { c.t("topk_idx").shape[0] = 4; }, kArg,
      "topk_idx: expected shape [S_q, topk] = [5, topk >= 1], got [4, 3]");
  add("TopkLengthRows", kTopk | kLoss, [](IndexerCall& c) { c.t("topk_length").shape[0] = 3; },
      kArg, "topk_length: expected shape [S_q] = [5], got [3]");
  add("QRows", kLoss, [](IndexerCall& c) { c.t("q").shape[0] = 4; }, kArg,
      "q: expected shape [S_q, H, D_qk] with S_q = 5 (from q_I) and H, D_qk >= 1, got [4, 2, 6]");
  add("KvRows", kLoss, [](IndexerCall& c) { c.t("kv").shape[0] = 8; }, kArg,
      "kv: expected shape [S_kv, D_qk] = [7, 6] (S_kv from k_I, D_qk from q), got [8, 6]");
  add("KvWidth", kLoss, [](IndexerCall& c) { c.t("kv").shape[1] = 5; }, kArg,
      "kv: expected shape [S_kv, D_qk] = [7, 6] (S_kv from k_I, D_qk from q), got [7, 5]");
  add("LseHeads", kLoss, [](IndexerCall& c) { c.t("lse").shape[1] = 3; }, kArg,
      "lse: expected shape [S_q, H] = [5, 2], got [5, 3]");
  add("PerTokenRows", kLoss, [](IndexerCall& c) { c.t("loss_per_token").shape[0] = 4; }, kArg,
      "loss_per_token: expected shape [S_q] = [5], got [4]");
  add("DqIShape", kLoss, [](IndexerCall& c) { c.t("dq_I").shape[2] = 3; }, kArg,
      "dq_I: expected shape [S_q, H_I, D_I] = [5, 2, 4], got [5, 2, 3]");
  add("DkIShape", kLoss, [](IndexerCall& c) { c.t("dk_I").shape[0] = 6; }, kArg,
      "dk_I: expected shape [S_kv, D_I] = [7, 4], got [6, 4]");
  add("DwShape", kLoss, [](IndexerCall& c) { c.t("dw").shape[0] = 6; }, kArg,
      "dw: expected shape [S_q, H_I] = [5, 2], got [6, 2]");
  add("GradientsPartly", kLoss, [](IndexerCall& c) { c.t("dk_I").data = nullptr; }, kArg,
      "dk_I: the gradients dq_I, dk_I and dw are given together or not at all (dq_I is given, "
      "dk_I is absent)");
  add("LengthWithoutIdx", kLoss, [](IndexerCall& c) { c.t("topk_idx").data = nullptr; }, kArg,
      "topk_length: given without topk_idx; dense mode (no topk_idx) has no top-k slots");
  // Strides.
  add("QILastDimStrided", kAll, [](IndexerCall& c) { c.t("q_I").strides[2] = 2; }, kArg,
      "q_I: the last dimension must be contiguous (stride 1), got stride 2");
  add("WLastDimStrided", kAll, [](IndexerCall& c) { c.t("w").strides[1] = 2; }, kArg,
      "w: the last dimension must be contiguous (stride 1), got stride 2");
  add("ScoresBroadcast", kScores, [](IndexerCall& c) { c.t("scores").strides[0] = 0; }, kArg,
      "scores: output stride 0 is 0 on a dimension of size 5; outputs cannot broadcast");
  add("TopkIdxBroadcast", kTopk, [](IndexerCall& c) { c.t("topk_idx").strides[0] = 0; }, kArg,
      "topk_idx: output stride 0 is 0 on a dimension of size 5");
  add("DkIBroadcast", kLoss, [](IndexerCall& c) { c.t("dk_I").strides[0] = 0; }, kArg,
      "dk_I: output stride 0 is 0 on a dimension of size 7");
  // Options.
  add("ScaleINaN", kAll, [](IndexerCall& c) { c.options().scale_I = kNaN; }, kArg,
      "options.scale_I: expected a finite value (0 for 1/sqrt(D_I)), got nan");
  add("ScaleInf", kLoss, [](IndexerCall& c) { c.options().scale = kInf; }, kArg,
      "options.scale: expected a finite value (0 for 1/sqrt(D_qk)), got inf");
  add("CoeffNaN", kLoss, [](IndexerCall& c) { c.options().coeff = kNaN; }, kArg,
      "options.coeff: expected a finite value, got nan");
  add("ImplUnknown", kAll,
      [](IndexerCall& c) {
        const int32_t bad = 9;
        std::memcpy(&c.options().impl, &bad, sizeof bad);
      },
      kArg, "options.impl: unknown implementation 9");
  add("ForcedPortable", kAll, [](IndexerCall& c) { c.options().impl = SA_IMPL_PORTABLE; },
      SA_ERROR_UNSUPPORTED, "options.impl = portable cannot serve indexer_");
  // Devices.
  add("WOnCuda", kAll, [](IndexerCall& c) { c.t("w").device = SA_DEVICE_CUDA; }, kArg,
      "w: expected device cpu like the other tensors, got cuda:0");
  add("QICudaWithHostPointer", kAll, [](IndexerCall& c) { c.t("q_I").device = SA_DEVICE_CUDA; },
      kArg, "q_I: tensor says device cuda:0");
  return v;
}

std::vector<RejectParam> reject_params() {
  std::vector<RejectParam> out;
  for (const RejectCase& c : reject_cases())
    for (Op op : {kScores, kTopk, kLoss})
      if (c.ops & op) {
        const char* tag = op == kScores ? "Scores_" : op == kTopk ? "Topk_" : "Loss_";
        out.push_back({tag + c.name, op, c});
      }
  return out;
}

class IndexerRejects : public ::testing::TestWithParam<RejectParam> {};

TEST_P(IndexerRejects, WithClearErrorAndUntouchedOutputs) {
  IndexerCall c(GetParam().op);
  GetParam().c.breakit(c);
  expect_rejected(c, GetParam().c.code, GetParam().c.expect);
}

INSTANTIATE_TEST_SUITE_P(IndexerValidation, IndexerRejects,
                         ::testing::ValuesIn(reject_params()),
                         [](const ::testing::TestParamInfo<RejectParam>& i) {
                           return i.param.name;
                         });

// ---- valid calls -------------------------------------------------------------------------------
class IndexerAccepts : public ::testing::TestWithParam<Op> {};

TEST_P(IndexerAccepts, RunsTheReferenceWithoutWorkspace) {
  for (sa_dtype dt : {SA_DTYPE_FP32, SA_DTYPE_BF16, SA_DTYPE_FP64}) {
    IndexerCall c(GetParam(), dt);
    size_t bytes = 1;
    ASSERT_EQ(c.workspace_size(&bytes), SA_OK) << sa_last_error();
    EXPECT_EQ(bytes, 0u);
    sa_impl used = SA_IMPL_AUTO;
    sa_context ctx = sa_context_default();
    ctx.impl_used = &used;
    ASSERT_EQ(c.run(&ctx), SA_OK) << sa_last_error();
    EXPECT_EQ(used, SA_IMPL_REFERENCE);
    if (GetParam() == kScores) {
      EXPECT_FALSE(any_nan(c.scores().to_double()));
    }
    if (GetParam() == kTopk) {
      for (int64_t i = 0; i < c.topk_idx_out().numel(); ++i) {
        EXPECT_NE(c.topk_idx_out().i32()[i], -77);
      }
    }
    if (GetParam() == kLoss) {
      IndexerCase::LossOut& o = c.loss_out();
      for (HostTensor* t : {&o.loss, &o.per_token, &o.dq_I, &o.dk_I, &o.dw})
        EXPECT_FALSE(any_nan(t->to_double()));
    }
  }
}

TEST_P(IndexerAccepts, OptionalTensorsAbsentAndOptionsOfOtherOpsIgnored) {
  IndexerCall c(GetParam());
  c.t("k_start").data = nullptr;
  c.t("k_end").data = nullptr;
  if (GetParam() == kTopk) c.t("topk_length").data = nullptr;
  if (GetParam() == kLoss) {
    for (const char* n : {"topk_idx", "topk_length", "loss_per_token", "dq_I", "dk_I", "dw"})
      c.t(n).data = nullptr;
  } else {
    c.options().scale = kNaN;  // loss-only options
    c.options().coeff = kInf;
  }
  EXPECT_EQ(c.run(nullptr), SA_OK) << sa_last_error();
  EXPECT_TRUE(c.run_cpp().ok());
}

INSTANTIATE_TEST_SUITE_P(IndexerValidation, IndexerAccepts,
                         ::testing::Values(kScores, kTopk, kLoss),
                         [](const ::testing::TestParamInfo<Op>& i) {
                           return std::string(i.param == kScores ? "Scores"
                                              : i.param == kTopk ? "Topk" : "Loss");
                         });

TEST(IndexerValidationApi, NullArguments) {
  size_t bytes = 7;
  EXPECT_EQ(sa_indexer_scores(nullptr, nullptr), SA_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(has_substr(sa_last_error(), "args: NULL"));
  EXPECT_EQ(sa_indexer_topk_workspace_size(nullptr, &bytes), SA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(sa_indexer_loss(nullptr, nullptr), SA_ERROR_INVALID_ARGUMENT);
  IndexerCall c(kLoss);
  EXPECT_EQ(c.workspace_size(nullptr), SA_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(has_substr(sa_last_error(), "bytes: NULL"));
  EXPECT_EQ(bytes, 7u);
  const sa_indexer_options o = sa_indexer_options_default();
  EXPECT_EQ(o.coeff, 1.f);
  EXPECT_EQ(o.scale_I, 0.f);
  EXPECT_EQ(o.impl, SA_IMPL_AUTO);
}

// ---- SPEC 5's GPU contract ---------------------------------------------------------------------
TEST(IndexerGpuContract, NamesWhatACudaCallLacks) {
  sa::IndexerDims d;
  d.Sq = 4;
  d.Skv = 8;
  d.DI = 128;
  for (int64_t h : {16, 32, 64}) {
    d.HI = h;
    EXPECT_EQ(sa::indexer_gpu_contract(d, SA_DTYPE_BF16, SA_DTYPE_FP32), "") << h;
  }
  d.HI = 8;
  EXPECT_EQ(sa::indexer_gpu_contract(d, SA_DTYPE_BF16, SA_DTYPE_FP32),
            "q_I: H_I = 8 (the GPU paths take 16, 32 or 64)");
  d.HI = 32;
  d.DI = 64;
  EXPECT_EQ(sa::indexer_gpu_contract(d, SA_DTYPE_BF16, SA_DTYPE_FP32),
            "q_I: D_I = 64 (the GPU paths take 128)");
  d.DI = 128;
  EXPECT_EQ(sa::indexer_gpu_contract(d, SA_DTYPE_FP16, SA_DTYPE_FP32),
            "q_I: dtype fp16 (the GPU paths take bf16)");
  EXPECT_EQ(sa::indexer_gpu_contract(d, SA_DTYPE_BF16, SA_DTYPE_FP64),
            "w: dtype fp64 (the GPU paths take fp32)");
  sa::IndexerLossProblem p;
  p.dims = d;
  p.dtype = SA_DTYPE_BF16;
  p.in.w_dtype = SA_DTYPE_FP32;
  p.attn_dtype = SA_DTYPE_BF16;
  p.loss_dtype = SA_DTYPE_FP32;
  EXPECT_EQ(sa::indexer_gpu_contract(p), "");
  p.attn_dtype = SA_DTYPE_FP32;
  EXPECT_EQ(sa::indexer_gpu_contract(p), "q: dtype fp32 (the GPU paths take bf16)");
  p.attn_dtype = SA_DTYPE_BF16;
  p.loss_dtype = SA_DTYPE_FP64;
  EXPECT_EQ(sa::indexer_gpu_contract(p), "loss: dtype fp64 (the GPU paths write fp32)");
}

}  // namespace
}  // namespace sa_test
