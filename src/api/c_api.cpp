// The C ABI: every public entry point. Each one validates, selects an implementation, acquires
// workspace and runs, inside one try block that turns sa::Error (and anything else) into an
// sa_status plus this thread's last-error message.
#include <cmath>
#include <exception>
#include <new>
#include <string>

#include "api/dispatch.hpp"
#include "api/enum_bits.hpp"
#include "api/extensible.hpp"
#include "api/validate.hpp"
#include "common/error.hpp"
#include "common/narrow.hpp"
#include "sparse_attention/sparse_attention.h"

namespace {

thread_local std::string g_last_error;

template <class F>
sa_status guarded(F&& f) {
  try {
    g_last_error.clear();
    f();
    return SA_OK;
  } catch (const sa::Error& e) {
    g_last_error = e.what();
    return e.code();
  } catch (const std::bad_alloc&) {
    g_last_error = "host memory allocation failed";
    return SA_ERROR_WORKSPACE;
  } catch (const std::exception& e) {
    g_last_error = std::string("internal error: ") + e.what();
    return SA_ERROR_INTERNAL;
  } catch (...) {
    g_last_error = "internal error: unknown exception";
    return SA_ERROR_INTERNAL;
  }
}

// Workspace for one call: the caller's buffer when it is large enough, else the caller's
// allocator (released in stream order after the launches), else none when the workspace is
// optional (the implementation's slower path), else an error naming the size.
class Workspace {
 public:
  Workspace(const sa_context& ctx, size_t bytes, bool optional) : ctx_(ctx) {
    exec_.stream = ctx.stream;
    if (bytes == 0) return;
    if (ctx.workspace != nullptr && ctx.workspace_bytes >= bytes) {
      exec_.workspace = ctx.workspace;
      exec_.workspace_bytes = ctx.workspace_bytes;
      return;
    }
    if (optional && ctx.alloc == nullptr) return;
    SA_CHECK(ctx.alloc != nullptr, SA_ERROR_WORKSPACE,
             "context: this call needs " << bytes << " bytes of device workspace; pass "
                                         << "context.workspace of that size (query it with the "
                                         << "*_workspace_size function) or an allocator (got "
                                         << ctx.workspace_bytes << " bytes and no allocator)");
    SA_CHECK(ctx.free != nullptr, SA_ERROR_WORKSPACE,
             "context: an allocator needs both alloc and free");
    owned_ = ctx.alloc(bytes, ctx.stream, ctx.allocator_user);
    SA_CHECK(owned_ != nullptr, SA_ERROR_WORKSPACE,
             "context.alloc: the allocator returned NULL for " << bytes << " bytes");
    exec_.workspace = owned_;
    exec_.workspace_bytes = bytes;
  }
  ~Workspace() {
    if (owned_ != nullptr) ctx_.free(owned_, ctx_.stream, ctx_.allocator_user);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  const sa::ExecContext& exec() const { return exec_; }

 private:
  sa_context ctx_;
  sa::ExecContext exec_;
  void* owned_ = nullptr;
};

template <class Problem>
size_t workspace_of(const sa::OpEntry<Problem>& e, const Problem& p) {
  return e.workspace_bytes ? e.workspace_bytes(p) : 0;
}

// The caller's args struct, of any version, as this library's (sparse_attention.h, "Extensible
// structs").
sa_bsa_fwd_args read_args(const sa_bsa_fwd_args* a) {
  return sa::api::read_args<sa_bsa_fwd_args, sa_bsa_options>(
      a, sa_bsa_fwd_args_default(), "sa_bsa_fwd_args_default()", "sa_bsa_options_default()");
}
sa_bsa_bwd_args read_args(const sa_bsa_bwd_args* a) {
  return sa::api::read_args<sa_bsa_bwd_args, sa_bsa_options>(
      a, sa_bsa_bwd_args_default(), "sa_bsa_bwd_args_default()", "sa_bsa_options_default()");
}
sa_dsa_fwd_args read_args(const sa_dsa_fwd_args* a) {
  return sa::api::read_args<sa_dsa_fwd_args, sa_dsa_options>(
      a, sa_dsa_fwd_args_default(), "sa_dsa_fwd_args_default()", "sa_dsa_options_default()");
}
sa_dsa_bwd_args read_args(const sa_dsa_bwd_args* a) {
  return sa::api::read_args<sa_dsa_bwd_args, sa_dsa_options>(
      a, sa_dsa_bwd_args_default(), "sa_dsa_bwd_args_default()", "sa_dsa_options_default()");
}
sa_indexer_scores_args read_args(const sa_indexer_scores_args* a) {
  return sa::api::read_args<sa_indexer_scores_args, sa_indexer_options>(
      a, sa_indexer_scores_args_default(), "sa_indexer_scores_args_default()",
      "sa_indexer_options_default()");
}
sa_indexer_topk_args read_args(const sa_indexer_topk_args* a) {
  return sa::api::read_args<sa_indexer_topk_args, sa_indexer_options>(
      a, sa_indexer_topk_args_default(), "sa_indexer_topk_args_default()",
      "sa_indexer_options_default()");
}
sa_indexer_loss_args read_args(const sa_indexer_loss_args* a) {
  return sa::api::read_args<sa_indexer_loss_args, sa_indexer_options>(
      a, sa_indexer_loss_args_default(), "sa_indexer_loss_args_default()",
      "sa_indexer_options_default()");
}

template <class Args, class Problem>
sa_status run_op(const Args* args, const sa_context* ctx,
                 sa::OpEntry<Problem> sa::Implementation::*entry) {
  return guarded([&] {
    SA_CHECK_ARG(args != nullptr, "args: NULL");
    sa_context c = ctx ? *ctx : sa_context_default();
    Problem p = sa::api::make_problem(read_args(args));
    const sa::Implementation& impl = sa::api::select(p);
    const sa::OpEntry<Problem>& e = impl.*entry;
    Workspace ws(c, workspace_of(e, p), e.workspace_optional && e.workspace_optional(p));
    e.run(p, ws.exec());
    if (c.impl_used) *c.impl_used = impl.id;
  });
}

template <class Args, class Problem>
sa_status workspace_size_op(const Args* args, size_t* bytes,
                            sa::OpEntry<Problem> sa::Implementation::*entry) {
  return guarded([&] {
    SA_CHECK_ARG(args != nullptr, "args: NULL");
    SA_CHECK_ARG(bytes != nullptr, "bytes: NULL");
    Problem p = sa::api::make_problem(read_args(args));
    const sa::Implementation& impl = sa::api::select(p);
    *bytes = workspace_of(impl.*entry, p);
  });
}

}  // namespace

extern "C" {

const char* sa_status_name(sa_status s) {
  switch (sa::api::enum_bits(s)) {  // a C caller may pass any int
    case SA_OK: return "SA_OK";
    case SA_ERROR_INVALID_ARGUMENT: return "SA_ERROR_INVALID_ARGUMENT";
    case SA_ERROR_UNSUPPORTED: return "SA_ERROR_UNSUPPORTED";
    case SA_ERROR_INVALID_METADATA: return "SA_ERROR_INVALID_METADATA";
    case SA_ERROR_WORKSPACE: return "SA_ERROR_WORKSPACE";
    case SA_ERROR_CUDA: return "SA_ERROR_CUDA";
    case SA_ERROR_INTERNAL: return "SA_ERROR_INTERNAL";
  }
  return "SA_ERROR_UNKNOWN";
}

const char* sa_last_error(void) { return g_last_error.c_str(); }

const char* sa_impl_name(sa_impl impl) {
  switch (sa::api::enum_bits(impl)) {  // a C caller may pass any int
    case SA_IMPL_AUTO: return "auto";
    case SA_IMPL_REFERENCE: return "reference";
    case SA_IMPL_PORTABLE: return "portable";
    case SA_IMPL_SM90: return "sm90";
  }
  return "unknown";
}

sa_tensor sa_tensor_none(void) {
  sa_tensor t{};
  t.data = nullptr;
  t.dtype = SA_DTYPE_FP32;
  t.rank = 0;
  t.device = SA_DEVICE_CPU;
  return t;
}

sa_tensor sa_tensor_contiguous(void* data, sa_dtype dtype, int32_t rank, const int64_t* shape,
                               sa_device_type device, int32_t device_index) {
  sa_tensor t = sa_tensor_none();
  t.data = data;
  t.dtype = dtype;
  // An out-of-range rank is kept (not clamped) so that validation rejects the tensor by name
  // instead of silently dropping dimensions; only the first SA_MAX_RANK sizes are stored.
  t.rank = rank;
  t.device = device;
  t.device_index = device_index;
  const int32_t stored = rank < 0 ? 0 : (rank > SA_MAX_RANK ? SA_MAX_RANK : rank);
  // A stride whose product overflows saturates at INT64_MAX: validation then rejects the view by
  // name (its element count or extent overflows) instead of reading wrapped strides.
  int64_t stride = 1;
  for (int i = stored - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.strides[i] = stride;
    if (sa::mul_overflows(stride, shape[i] > 0 ? shape[i] : 1, &stride)) stride = INT64_MAX;
  }
  return t;
}

sa_context sa_context_default(void) {
  sa_context c{};
  return c;
}

sa_status sa_bsa_forward_workspace_size(const sa_bsa_fwd_args* a, size_t* bytes) {
  return workspace_size_op(a, bytes, &sa::Implementation::bsa_fwd);
}
sa_status sa_bsa_forward(const sa_bsa_fwd_args* a, const sa_context* ctx) {
  return run_op(a, ctx, &sa::Implementation::bsa_fwd);
}
sa_status sa_bsa_backward_workspace_size(const sa_bsa_bwd_args* a, size_t* bytes) {
  return workspace_size_op(a, bytes, &sa::Implementation::bsa_bwd);
}
sa_status sa_bsa_backward(const sa_bsa_bwd_args* a, const sa_context* ctx) {
  return run_op(a, ctx, &sa::Implementation::bsa_bwd);
}
sa_status sa_dsa_forward_workspace_size(const sa_dsa_fwd_args* a, size_t* bytes) {
  return workspace_size_op(a, bytes, &sa::Implementation::dsa_fwd);
}
sa_status sa_dsa_forward(const sa_dsa_fwd_args* a, const sa_context* ctx) {
  return run_op(a, ctx, &sa::Implementation::dsa_fwd);
}
sa_status sa_dsa_backward_workspace_size(const sa_dsa_bwd_args* a, size_t* bytes) {
  return workspace_size_op(a, bytes, &sa::Implementation::dsa_bwd);
}
sa_status sa_dsa_backward(const sa_dsa_bwd_args* a, const sa_context* ctx) {
  return run_op(a, ctx, &sa::Implementation::dsa_bwd);
}
sa_status sa_indexer_scores_workspace_size(const sa_indexer_scores_args* a, size_t* bytes) {
  return workspace_size_op(a, bytes, &sa::Implementation::indexer_scores);
}
sa_status sa_indexer_scores(const sa_indexer_scores_args* a, const sa_context* ctx) {
  return run_op(a, ctx, &sa::Implementation::indexer_scores);
}
sa_status sa_indexer_topk_workspace_size(const sa_indexer_topk_args* a, size_t* bytes) {
  return workspace_size_op(a, bytes, &sa::Implementation::indexer_topk);
}
sa_status sa_indexer_topk(const sa_indexer_topk_args* a, const sa_context* ctx) {
  return run_op(a, ctx, &sa::Implementation::indexer_topk);
}
sa_status sa_indexer_loss_workspace_size(const sa_indexer_loss_args* a, size_t* bytes) {
  return workspace_size_op(a, bytes, &sa::Implementation::indexer_loss);
}
sa_status sa_indexer_loss(const sa_indexer_loss_args* a, const sa_context* ctx) {
  return run_op(a, ctx, &sa::Implementation::indexer_loss);
}

}  // extern "C"
