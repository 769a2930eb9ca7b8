// The C ABI's extensible structs (sparse_attention.h, "Extensible structs"), on the CPU: every
// options and args struct carries its size; a caller's struct of an older version reads with the
// newer fields at their defaults, a newer one with its added fields at their defaults (0), and a
// size that cannot be a struct is refused by name. Callers' structs live in heap buffers of
// exactly their size, so that AddressSanitizer (scripts/sanitize_host.sh) reports any read past
// it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "api/extensible.hpp"
#include "common/error.hpp"
#include "sparse_attention/sparse_attention.h"

namespace sa_test {
namespace {

// ---- the reader, on a struct with a field added in a "second version" ---------------------------
struct Opts {
  size_t size;
  int32_t a;
  int32_t b;
  int32_t added;  // not in the first version; its default is 0 (here: 7, to see it applied)
};
constexpr size_t kOptsV1 = offsetof(Opts, added);

Opts defaults() { return Opts{sizeof(Opts), 10, 20, 7}; }

// A caller's struct of `size` bytes (the first `size` bytes of `fields`, then `tail` zeros or
// the given bytes), in a buffer of exactly that many bytes.
std::vector<unsigned char> caller_bytes(const Opts& fields, size_t size, size_t tail = 0,
                                        unsigned char tail_byte = 0) {
  std::vector<unsigned char> buf(size + tail, tail_byte);
  Opts f = fields;
  f.size = size + tail;
  std::memcpy(buf.data(), &f, std::min(size, sizeof(Opts)));
  return buf;
}

Opts read(const std::vector<unsigned char>& buf) {
  return sa::api::read_extensible(reinterpret_cast<const Opts*>(buf.data()), buf.size(),
                                  defaults(), kOptsV1, "opts", "opts_default()");
}

// The status and message of a read that must fail.
std::string refusal(const std::vector<unsigned char>& buf, sa_status* code) {
  try {
    read(buf);
  } catch (const sa::Error& e) {
    *code = e.code();
    return e.what();
  }
  *code = SA_OK;
  return "";
}

TEST(ExtensibleStruct, FirstVersionReadsWithTheAddedFieldAtItsDefault) {
  const Opts o = read(caller_bytes(Opts{0, 1, 2, 99}, kOptsV1));
  EXPECT_EQ(o.size, sizeof(Opts));
  EXPECT_EQ(o.a, 1);
  EXPECT_EQ(o.b, 2);
  EXPECT_EQ(o.added, 7);  // the library's default, not the caller's bytes past its size
}

TEST(ExtensibleStruct, CurrentVersionReadsEveryField) {
  const Opts o = read(caller_bytes(Opts{0, 1, 2, 3}, sizeof(Opts)));
  EXPECT_EQ(o.a, 1);
  EXPECT_EQ(o.b, 2);
  EXPECT_EQ(o.added, 3);
}

TEST(ExtensibleStruct, NewerVersionWithItsFieldsAtDefaultsIsAccepted) {
  const Opts o = read(caller_bytes(Opts{0, 1, 2, 3}, sizeof(Opts), 16));
  EXPECT_EQ(o.added, 3);
}

TEST(ExtensibleStruct, NewerVersionSettingFieldsThisLibraryPredatesIsUnsupported) {
  sa_status code;
  const std::string msg = refusal(caller_bytes(Opts{0, 1, 2, 3}, sizeof(Opts), 16, 1), &code);
  EXPECT_EQ(code, SA_ERROR_UNSUPPORTED);
  EXPECT_NE(msg.find("opts: the caller's struct (" + std::to_string(sizeof(Opts) + 16) +
                     " bytes) sets fields"),
            std::string::npos)
      << msg;
}

TEST(ExtensibleStruct, GarbageSizesAreRefusedByName) {
  sa_status code;
  std::vector<unsigned char> zero = caller_bytes(Opts{}, sizeof(Opts));
  std::memset(zero.data(), 0, sizeof(size_t));
  EXPECT_NE(refusal(zero, &code).find("opts.size: 0, an uninitialised struct: start from "
                                      "opts_default()"),
            std::string::npos);
  EXPECT_EQ(code, SA_ERROR_INVALID_ARGUMENT);
  std::vector<unsigned char> tiny = caller_bytes(Opts{}, sizeof(Opts));
  const size_t three = 3;
  std::memcpy(tiny.data(), &three, sizeof(three));
  EXPECT_NE(refusal(tiny, &code).find("opts.size: expected at least " + std::to_string(kOptsV1) +
                                      " (the first version's size) and at most 65536, got 3"),
            std::string::npos);
  EXPECT_EQ(code, SA_ERROR_INVALID_ARGUMENT);
  std::vector<unsigned char> huge = caller_bytes(Opts{}, sizeof(Opts));
  const size_t lots = size_t{1} << 40;
  std::memcpy(huge.data(), &lots, sizeof(lots));
  EXPECT_NE(refusal(huge, &code).find("opts.size: expected at least"), std::string::npos);
  EXPECT_EQ(code, SA_ERROR_INVALID_ARGUMENT);
}

// ---- through the C ABI: a tiny DSA problem on the CPU reference ----------------------------------
class AbiSizes : public ::testing::Test {
 protected:
  // S_q 2, H 1, D_qk 8, d_v 8, S_kv 4, topk 2, fp32.
  std::vector<float> q = std::vector<float>(16, 0.25f), kv = std::vector<float>(32, 0.5f),
                     out = std::vector<float>(16), lse = std::vector<float>(2);
  std::vector<int32_t> idx = {0, 3, 1, -1};

  sa_dsa_fwd_args args() {
    const int64_t q_shape[3] = {2, 1, 8}, kv_shape[2] = {4, 8}, idx_shape[2] = {2, 2},
                  lse_shape[2] = {2, 1};
    sa_dsa_fwd_args a = sa_dsa_fwd_args_default();
    a.q = sa_tensor_contiguous(q.data(), SA_DTYPE_FP32, 3, q_shape, SA_DEVICE_CPU, 0);
    a.kv = sa_tensor_contiguous(kv.data(), SA_DTYPE_FP32, 2, kv_shape, SA_DEVICE_CPU, 0);
    a.topk_idx = sa_tensor_contiguous(idx.data(), SA_DTYPE_INT32, 2, idx_shape, SA_DEVICE_CPU, 0);
    a.out = sa_tensor_contiguous(out.data(), SA_DTYPE_FP32, 3, q_shape, SA_DEVICE_CPU, 0);
    a.lse = sa_tensor_contiguous(lse.data(), SA_DTYPE_FP32, 2, lse_shape, SA_DEVICE_CPU, 0);
    a.options.d_v = 8;
    return a;
  }

  // The call on a copy of `a` in a heap buffer of exactly a.size bytes (the bytes past
  // sizeof(a) zero, or `tail_byte`).
  sa_status call(const sa_dsa_fwd_args& a, unsigned char tail_byte = 0) {
    std::vector<unsigned char> buf(std::max<size_t>(a.size, sizeof(size_t)), tail_byte);
    std::memcpy(buf.data(), &a, std::min(buf.size(), sizeof(a)));
    sa_context ctx = sa_context_default();
    return sa_dsa_forward(reinterpret_cast<const sa_dsa_fwd_args*>(buf.data()), &ctx);
  }
};

TEST_F(AbiSizes, InitializersSetTheSizes) {
  EXPECT_EQ(sa_bsa_fwd_args_default().size, sizeof(sa_bsa_fwd_args));
  EXPECT_EQ(sa_bsa_bwd_args_default().size, sizeof(sa_bsa_bwd_args));
  EXPECT_EQ(sa_dsa_fwd_args_default().size, sizeof(sa_dsa_fwd_args));
  EXPECT_EQ(sa_dsa_bwd_args_default().size, sizeof(sa_dsa_bwd_args));
  EXPECT_EQ(sa_bsa_fwd_args_default().options.size, sizeof(sa_bsa_options));
  EXPECT_EQ(sa_dsa_bwd_args_default().options.size, sizeof(sa_dsa_options));
  const sa_bsa_bwd_args b = SA_BSA_BWD_ARGS_INIT;
  EXPECT_EQ(b.size, sizeof(sa_bsa_bwd_args));
  EXPECT_EQ(b.options.block_size, 128);
  EXPECT_EQ(b.options.count, -1);
  EXPECT_EQ(b.sparsity.q2k_count.data, nullptr);
}

TEST_F(AbiSizes, IndexerInitializersSetTheSizesAndDefaults) {
  EXPECT_EQ(sa_indexer_options_default().size, sizeof(sa_indexer_options));
  EXPECT_EQ(sa_indexer_options_default().coeff, 1.f);
  EXPECT_EQ(sa_indexer_scores_args_default().size, sizeof(sa_indexer_scores_args));
  EXPECT_EQ(sa_indexer_topk_args_default().size, sizeof(sa_indexer_topk_args));
  EXPECT_EQ(sa_indexer_loss_args_default().size, sizeof(sa_indexer_loss_args));
  EXPECT_EQ(sa_indexer_scores_args_default().options.size, sizeof(sa_indexer_options));
  EXPECT_EQ(sa_indexer_topk_args_default().options.size, sizeof(sa_indexer_options));
  const sa_indexer_loss_args l = SA_INDEXER_LOSS_ARGS_INIT;
  EXPECT_EQ(l.size, sizeof(sa_indexer_loss_args));
  EXPECT_EQ(l.options.size, sizeof(sa_indexer_options));
  EXPECT_EQ(l.options.coeff, 1.f);
  EXPECT_EQ(l.options.impl, SA_IMPL_AUTO);
  for (const sa_tensor* t : {&l.q_I, &l.k_I, &l.w, &l.q, &l.kv, &l.lse, &l.topk_idx,
                             &l.topk_length, &l.k_start, &l.k_end, &l.loss, &l.loss_per_token,
                             &l.dq_I, &l.dk_I, &l.dw})
    EXPECT_EQ(t->data, nullptr);
}

TEST_F(AbiSizes, FirstVersionSizesRun) {
  sa_dsa_fwd_args a = args();
  a.size = sa::api::args_v1<sa_dsa_fwd_args>();
  a.options.size = sa::api::kDsaOptionsV1;
  std::fill(out.begin(), out.end(), NAN);
  ASSERT_EQ(call(a), SA_OK) << sa_last_error();
  EXPECT_FLOAT_EQ(out[0], 0.5f);  // every key's value is 0.5
}

TEST_F(AbiSizes, NewerCallerWithDefaultsRunsAndOneWithNewSettingsIsUnsupported) {
  sa_dsa_fwd_args a = args();
  a.size = sizeof(sa_dsa_fwd_args) + 16;
  a.options.size = sizeof(sa_dsa_options) + 16;
  ASSERT_EQ(call(a), SA_OK) << sa_last_error();
  EXPECT_EQ(call(a, 1), SA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(sa_last_error()).find("args: the caller's struct"), std::string::npos)
      << sa_last_error();
}

TEST_F(AbiSizes, GarbageSizesAreRefusedByName) {
  struct Case {
    size_t args_size, options_size;
    std::string message;
  };
  const Case cases[] = {
      {0, sizeof(sa_dsa_options),
       "args.size: 0, an uninitialised struct: start from sa_dsa_fwd_args_default()"},
      {12, sizeof(sa_dsa_options), "args.size: expected at least"},
      {sizeof(sa_dsa_fwd_args), 0,
       "args.options.size: 0, an uninitialised struct: start from sa_dsa_options_default()"},
      {sizeof(sa_dsa_fwd_args), 4, "args.options.size: expected at least"},
      {sizeof(sa_dsa_fwd_args), sizeof(sa_dsa_options) + 8,
       "args.options.size: " + std::to_string(sizeof(sa_dsa_options) + 8) +
           " is larger than the " + std::to_string(sizeof(sa_dsa_options)) +
           " bytes that hold it"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    sa_dsa_fwd_args a = args();
    a.size = c.args_size;
    a.options.size = c.options_size;
    std::fill(out.begin(), out.end(), -1.f);
    EXPECT_EQ(call(a), SA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sa_last_error()).find(c.message), std::string::npos) << sa_last_error();
    EXPECT_EQ(out[0], -1.f);  // nothing written
  }
  // A zero-initialised struct, as before sizes existed, is named too.
  sa_dsa_fwd_args zero{};
  size_t bytes = 0;
  EXPECT_EQ(sa_dsa_forward_workspace_size(&zero, &bytes), SA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sa_last_error()).find("args.size: 0"), std::string::npos);
}


// ---- the indexer's structs, through the C ABI: tiny dense scores on the CPU reference ------------
class IndexerAbiSizes : public ::testing::Test {
 protected:
  // S_q 2, H_I 1, D_I 4, S_kv 3, fp32: every score is relu(scale_I * 4 * 0.25) = 0.5 (scale_I
  // 1/sqrt(4) by default).
  std::vector<float> q_I = std::vector<float>(8, 0.5f), k_I = std::vector<float>(12, 0.5f),
                     w = std::vector<float>(2, 1.f), scores = std::vector<float>(6);

  sa_indexer_scores_args args() {
    const int64_t q_shape[3] = {2, 1, 4}, k_shape[2] = {3, 4}, w_shape[2] = {2, 1},
                  s_shape[2] = {2, 3};
    sa_indexer_scores_args a = sa_indexer_scores_args_default();
    a.q_I = sa_tensor_contiguous(q_I.data(), SA_DTYPE_FP32, 3, q_shape, SA_DEVICE_CPU, 0);
    a.k_I = sa_tensor_contiguous(k_I.data(), SA_DTYPE_FP32, 2, k_shape, SA_DEVICE_CPU, 0);
    a.w = sa_tensor_contiguous(w.data(), SA_DTYPE_FP32, 2, w_shape, SA_DEVICE_CPU, 0);
    a.scores = sa_tensor_contiguous(scores.data(), SA_DTYPE_FP32, 2, s_shape, SA_DEVICE_CPU, 0);
    return a;
  }

  // As AbiSizes::call: a copy of `a` in a heap buffer of exactly a.size bytes.
  sa_status call(const sa_indexer_scores_args& a, unsigned char tail_byte = 0) {
    std::vector<unsigned char> buf(std::max<size_t>(a.size, sizeof(size_t)), tail_byte);
    std::memcpy(buf.data(), &a, std::min(buf.size(), sizeof(a)));
    sa_context ctx = sa_context_default();
    return sa_indexer_scores(reinterpret_cast<const sa_indexer_scores_args*>(buf.data()), &ctx);
  }
};

TEST_F(IndexerAbiSizes, FirstVersionSizesRun) {
  sa_indexer_scores_args a = args();
  a.size = sa::api::args_v1<sa_indexer_scores_args>();
  a.options.size = sa::api::kIndexerOptionsV1;
  std::fill(scores.begin(), scores.end(), NAN);
  ASSERT_EQ(call(a), SA_OK) << sa_last_error();
  EXPECT_FLOAT_EQ(scores[0], 0.5f);
  EXPECT_FLOAT_EQ(scores[5], 0.5f);
}

TEST_F(IndexerAbiSizes, NewerCallerWithDefaultsRunsAndOneWithNewSettingsIsUnsupported) {
  sa_indexer_scores_args a = args();
  a.size = sizeof(sa_indexer_scores_args) + 16;
  a.options.size = sizeof(sa_indexer_options) + 16;
  ASSERT_EQ(call(a), SA_OK) << sa_last_error();
  EXPECT_EQ(call(a, 1), SA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(sa_last_error()).find("args: the caller's struct"), std::string::npos)
      << sa_last_error();
}

TEST_F(IndexerAbiSizes, GarbageSizesAreRefusedByName) {
  struct Case {
    size_t args_size, options_size;
    std::string message;
  };
  const Case cases[] = {
      {0, sizeof(sa_indexer_options),
       "args.size: 0, an uninitialised struct: start from sa_indexer_scores_args_default()"},
      {12, sizeof(sa_indexer_options), "args.size: expected at least"},
      {sizeof(sa_indexer_scores_args), 0,
       "args.options.size: 0, an uninitialised struct: start from sa_indexer_options_default()"},
      {sizeof(sa_indexer_scores_args), 4, "args.options.size: expected at least"},
      {sizeof(sa_indexer_scores_args), sizeof(sa_indexer_options) + 8,
       "args.options.size: " + std::to_string(sizeof(sa_indexer_options) + 8) +
           " is larger than the " + std::to_string(sizeof(sa_indexer_options)) +
           " bytes that hold it"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    sa_indexer_scores_args a = args();
    a.size = c.args_size;
    a.options.size = c.options_size;
    std::fill(scores.begin(), scores.end(), -1.f);
    EXPECT_EQ(call(a), SA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sa_last_error()).find(c.message), std::string::npos) << sa_last_error();
    EXPECT_EQ(scores[0], -1.f);  // nothing written
  }
  // Zero-initialised structs of the three calls are named, with the initializer to start from.
  size_t bytes = 0;
  sa_indexer_scores_args zero_scores{};
  EXPECT_EQ(sa_indexer_scores_workspace_size(&zero_scores, &bytes), SA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sa_last_error()).find("args.size: 0, an uninitialised struct: start "
                                              "from sa_indexer_scores_args_default()"),
            std::string::npos)
      << sa_last_error();
  sa_indexer_topk_args zero_topk{};
  EXPECT_EQ(sa_indexer_topk(&zero_topk, nullptr), SA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sa_last_error()).find("start from sa_indexer_topk_args_default()"),
            std::string::npos)
      << sa_last_error();
  sa_indexer_loss_args zero_loss{};
  EXPECT_EQ(sa_indexer_loss_workspace_size(&zero_loss, &bytes), SA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sa_last_error()).find("start from sa_indexer_loss_args_default()"),
            std::string::npos)
      << sa_last_error();
  sa_indexer_loss_args no_options = sa_indexer_loss_args_default();
  no_options.options = sa_indexer_options{};
  EXPECT_EQ(sa_indexer_loss(&no_options, nullptr), SA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sa_last_error()).find("args.options.size: 0, an uninitialised struct: "
                                              "start from sa_indexer_options_default()"),
            std::string::npos)
      << sa_last_error();
}

}  // namespace
}  // namespace sa_test
