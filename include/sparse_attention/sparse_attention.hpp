// sparse-attention: C++ API.
//
// A thin, header-only layer over the C ABI in sparse_attention.h: the same argument structs with
// defaults filled in, and a Status value (code + message) instead of a code plus sa_last_error().
// There is one error convention: every call returns a Status; nothing throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "sparse_attention/sparse_attention.h"

namespace sparse_attention {

class Status {
 public:
  Status() = default;
  Status(sa_status code, std::string message) : code_(code), message_(std::move(message)) {}
  bool ok() const { return code_ == SA_OK; }
  explicit operator bool() const { return ok(); }
  sa_status code() const { return code_; }
  const std::string& message() const { return message_; }
  // "SA_ERROR_INVALID_ARGUMENT: q: expected rank 4, got 3"
  std::string to_string() const {
    return ok() ? std::string("SA_OK") : std::string(sa_status_name(code_)) + ": " + message_;
  }

 private:
  sa_status code_ = SA_OK;
  std::string message_;
};

namespace detail {
inline Status wrap(sa_status s) { return s == SA_OK ? Status() : Status(s, sa_last_error()); }
}  // namespace detail

using Tensor = sa_tensor;
using Context = sa_context;
using Impl = sa_impl;
using Layout = sa_layout;
using DType = sa_dtype;

// A contiguous view, e.g. tensor(ptr, SA_DTYPE_BF16, {B, H, S, D}, SA_DEVICE_CUDA).
inline Tensor tensor(void* data, sa_dtype dtype, std::initializer_list<int64_t> shape,
                     sa_device_type device = SA_DEVICE_CPU, int32_t device_index = 0) {
  return sa_tensor_contiguous(data, dtype, static_cast<int32_t>(shape.size()), shape.begin(),
                              device, device_index);
}
inline Tensor none() { return sa_tensor_none(); }

inline Context context(sa_stream_t stream = nullptr) {
  Context c = sa_context_default();
  c.stream = stream;
  return c;
}

// The C structs with their defaults (and `size`, sparse_attention.h "Extensible structs").
struct BsaOptions : sa_bsa_options {
  BsaOptions() : sa_bsa_options(sa_bsa_options_default()) {}
};
struct DsaOptions : sa_dsa_options {
  DsaOptions() : sa_dsa_options(sa_dsa_options_default()) {}
};
struct BsaSparsity : sa_bsa_sparsity {
  BsaSparsity() : sa_bsa_sparsity{sa_tensor_none(), sa_tensor_none(), sa_tensor_none()} {}
};
struct BsaForwardArgs : sa_bsa_fwd_args {
  BsaForwardArgs() : sa_bsa_fwd_args(sa_bsa_fwd_args_default()) {}
};
struct BsaBackwardArgs : sa_bsa_bwd_args {
  BsaBackwardArgs() : sa_bsa_bwd_args(sa_bsa_bwd_args_default()) {}
};
struct DsaForwardArgs : sa_dsa_fwd_args {
  DsaForwardArgs() : sa_dsa_fwd_args(sa_dsa_fwd_args_default()) {}
};
struct DsaBackwardArgs : sa_dsa_bwd_args {
  DsaBackwardArgs() : sa_dsa_bwd_args(sa_dsa_bwd_args_default()) {}
};
struct IndexerOptions : sa_indexer_options {
  IndexerOptions() : sa_indexer_options(sa_indexer_options_default()) {}
};
struct IndexerScoresArgs : sa_indexer_scores_args {
  IndexerScoresArgs() : sa_indexer_scores_args(sa_indexer_scores_args_default()) {}
};
struct IndexerTopkArgs : sa_indexer_topk_args {
  IndexerTopkArgs() : sa_indexer_topk_args(sa_indexer_topk_args_default()) {}
};
struct IndexerLossArgs : sa_indexer_loss_args {
  IndexerLossArgs() : sa_indexer_loss_args(sa_indexer_loss_args_default()) {}
};

inline Status bsa_forward_workspace_size(const sa_bsa_fwd_args& a, size_t* bytes) {
  return detail::wrap(sa_bsa_forward_workspace_size(&a, bytes));
}
inline Status bsa_forward(const sa_bsa_fwd_args& a, const Context& c = context()) {
  return detail::wrap(sa_bsa_forward(&a, &c));
}
inline Status bsa_backward_workspace_size(const sa_bsa_bwd_args& a, size_t* bytes) {
  return detail::wrap(sa_bsa_backward_workspace_size(&a, bytes));
}
inline Status bsa_backward(const sa_bsa_bwd_args& a, const Context& c = context()) {
  return detail::wrap(sa_bsa_backward(&a, &c));
}
inline Status dsa_forward_workspace_size(const sa_dsa_fwd_args& a, size_t* bytes) {
  return detail::wrap(sa_dsa_forward_workspace_size(&a, bytes));
}
inline Status dsa_forward(const sa_dsa_fwd_args& a, const Context& c = context()) {
  return detail::wrap(sa_dsa_forward(&a, &c));
}
inline Status dsa_backward_workspace_size(const sa_dsa_bwd_args& a, size_t* bytes) {
  return detail::wrap(sa_dsa_backward_workspace_size(&a, bytes));
}
inline Status dsa_backward(const sa_dsa_bwd_args& a, const Context& c = context()) {
  return detail::wrap(sa_dsa_backward(&a, &c));
}
inline Status indexer_scores_workspace_size(const sa_indexer_scores_args& a, size_t* bytes) {
  return detail::wrap(sa_indexer_scores_workspace_size(&a, bytes));
}
inline Status indexer_scores(const sa_indexer_scores_args& a, const Context& c = context()) {
  return detail::wrap(sa_indexer_scores(&a, &c));
}
inline Status indexer_topk_workspace_size(const sa_indexer_topk_args& a, size_t* bytes) {
  return detail::wrap(sa_indexer_topk_workspace_size(&a, bytes));
}
inline Status indexer_topk(const sa_indexer_topk_args& a, const Context& c = context()) {
  return detail::wrap(sa_indexer_topk(&a, &c));
}
inline Status indexer_loss_workspace_size(const sa_indexer_loss_args& a, size_t* bytes) {
  return detail::wrap(sa_indexer_loss_workspace_size(&a, bytes));
}
inline Status indexer_loss(const sa_indexer_loss_args& a, const Context& c = context()) {
  return detail::wrap(sa_indexer_loss(&a, &c));
}

}  // namespace sparse_attention
