/* libsparse_attention.so inside a process that already holds a C++ runtime (as in a PyTorch
 * process): libstdc++ is loaded first into the global scope, then the library, whose calls must
 * behave as in any other process. The calls here format error messages with std::ostream in the
 * library (validation, the dispatcher's refusals), which crashed when the library exported an
 * embedded static libstdc++.
 *
 *   sa_abi_dlopen <path to libsparse_attention.so>     exit 0: every check passed */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "sparse_attention/sparse_attention.h"

typedef sa_status (*dsa_bwd_ws_fn)(const sa_dsa_bwd_args*, size_t*);
typedef sa_status (*dsa_fwd_fn)(const sa_dsa_fwd_args*, const sa_context*);
typedef const char* (*last_error_fn)(void);
typedef sa_tensor (*contiguous_fn)(void*, sa_dtype, int32_t, const int64_t*, sa_device_type,
                                   int32_t);
typedef sa_context (*context_fn)(void);

static int failures = 0;

static void expect(int ok, const char* what, const char* detail) {
  printf("%s: %s%s%s\n", ok ? "ok" : "FAIL", what, detail ? ": " : "", detail ? detail : "");
  if (!ok) ++failures;
}

static void* sym(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  if (p == NULL) {
    printf("FAIL: dlsym(%s): %s\n", name, dlerror());
    ++failures;
  }
  return p;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s <libsparse_attention.so>\n", argv[0]);
    return 2;
  }
  /* Another C++ runtime first, in the global scope, as the Python interpreter holds torch's. */
  void* cxx = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_GLOBAL);
  expect(cxx != NULL, "dlopen(libstdc++.so.6, RTLD_GLOBAL) before the library",
         cxx ? NULL : dlerror());
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    printf("FAIL: dlopen(%s): %s\n", argv[1], dlerror());
    return 1;
  }
  dsa_bwd_ws_fn bwd_ws = (dsa_bwd_ws_fn)sym(lib, "sa_dsa_backward_workspace_size");
  dsa_fwd_fn fwd = (dsa_fwd_fn)sym(lib, "sa_dsa_forward");
  last_error_fn last_error = (last_error_fn)sym(lib, "sa_last_error");
  contiguous_fn contiguous = (contiguous_fn)sym(lib, "sa_tensor_contiguous");
  context_fn context = (context_fn)sym(lib, "sa_context_default");
  if (failures) return 1;

  /* A tiny DSA problem on the CPU (fp32: the reference): S_q 2, H 1, D_qk 8, S_kv 4, topk 2. */
  float q[2 * 1 * 8], kv[4 * 8], out[2 * 1 * 8], lse[2 * 1], dout[2 * 1 * 8], dq[2 * 8],
      dkv[4 * 8];
  int32_t idx[2 * 2] = {0, 3, 1, -1};
  for (int i = 0; i < 16; ++i) q[i] = dout[i] = 0.1f * (float)(i % 5) - 0.2f;
  for (int i = 0; i < 32; ++i) kv[i] = 0.05f * (float)(i % 7) - 0.1f;
  const int64_t q_shape[3] = {2, 1, 8}, kv_shape[2] = {4, 8}, idx_shape[2] = {2, 2},
                lse_shape[2] = {2, 1};

  sa_dsa_bwd_args b = sa_dsa_bwd_args_default();
  b.q = contiguous(q, SA_DTYPE_FP32, 3, q_shape, SA_DEVICE_CPU, 0);
  b.kv = contiguous(kv, SA_DTYPE_FP32, 2, kv_shape, SA_DEVICE_CPU, 0);
  b.topk_idx = contiguous(idx, SA_DTYPE_INT32, 2, idx_shape, SA_DEVICE_CPU, 0);
  b.out = contiguous(out, SA_DTYPE_FP32, 3, q_shape, SA_DEVICE_CPU, 0);
  b.lse = contiguous(lse, SA_DTYPE_FP32, 2, lse_shape, SA_DEVICE_CPU, 0);
  b.dout = contiguous(dout, SA_DTYPE_FP32, 3, q_shape, SA_DEVICE_CPU, 0);
  b.dq = contiguous(dq, SA_DTYPE_FP32, 3, q_shape, SA_DEVICE_CPU, 0);
  b.dkv = contiguous(dkv, SA_DTYPE_FP32, 2, kv_shape, SA_DEVICE_CPU, 0);

  size_t bytes = 1;
  /* 1. A validation error, formatted with std::ostream: the defaulted d_v (512) > D_qk. */
  sa_status st = bwd_ws(&b, &bytes);
  expect(st == SA_ERROR_INVALID_ARGUMENT && strstr(last_error(), "d_v") != NULL,
         "bad d_v is refused with a message naming it", last_error());
  /* 2. A refusal of the dispatcher (forced implementation that cannot serve CPU tensors). */
  b.options.d_v = 8;
  b.options.impl = SA_IMPL_SM90;
  st = bwd_ws(&b, &bytes);
  expect((st == SA_ERROR_UNSUPPORTED || st == SA_ERROR_INVALID_ARGUMENT) &&
             strstr(last_error(), "sm90") != NULL,
         "forced sm90 on CPU tensors is refused with a message naming it", last_error());
  /* 3. A served request. */
  b.options.impl = SA_IMPL_AUTO;
  st = bwd_ws(&b, &bytes);
  expect(st == SA_OK && bytes == 0, "the reference's workspace size", last_error());

  sa_dsa_fwd_args f = sa_dsa_fwd_args_default();
  f.q = b.q;
  f.kv = b.kv;
  f.topk_idx = b.topk_idx;
  f.out = b.out;
  f.lse = b.lse;
  f.options = b.options;
  sa_context ctx = context();
  for (int i = 0; i < 16; ++i) out[i] = 1e30f;
  st = fwd(&f, &ctx);
  int finite = 1;
  for (int i = 0; i < 16; ++i) finite = finite && out[i] > -1e3f && out[i] < 1e3f;
  expect(st == SA_OK && finite, "a reference forward runs and writes its output", last_error());

  dlclose(lib);
  printf("%s\n", failures ? "FAILED" : "all checks passed");
  return failures ? 1 : 0;
}
