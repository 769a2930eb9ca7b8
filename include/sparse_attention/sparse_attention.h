/*
 * sparse-attention: C ABI.
 *
 * The four operations of SPEC.md (BSA forward/backward, DSA forward/backward) on caller-owned
 * tensors. Every function returns an sa_status; on failure sa_last_error() gives a message that
 * names the argument and what was expected. A call that fails validation launches nothing and
 * touches no output.
 *
 * Tensors are views: pointer, dtype, shape, strides (in elements) and device. Optional tensors
 * are given as a view whose data pointer is NULL (sa_tensor_none()).
 *
 * CPU tensors run the fp64 reference implementation; CUDA tensors run the best GPU implementation
 * the device and the shape allow (options.impl can force one; a forced implementation that cannot
 * serve the call is an error, never a silent fallback).
 *
 * This header does not include any CUDA header: sa_stream_t is the same type as cudaStream_t.
 */
#ifndef SPARSE_ATTENTION_H_
#define SPARSE_ATTENTION_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SA_VERSION_MAJOR 0
#define SA_VERSION_MINOR 1
#define SA_VERSION_PATCH 0

/* ---------------------------------------------------------------------------------------------
 * Status: the one error convention of the library.
 * ------------------------------------------------------------------------------------------- */
typedef enum sa_status {
  SA_OK = 0,
  SA_ERROR_INVALID_ARGUMENT = 1, /* rank, shape, dtype, stride, alignment, device, option value */
  SA_ERROR_UNSUPPORTED = 2,      /* a valid request no available implementation serves */
  SA_ERROR_INVALID_METADATA = 3, /* options.validate found a bad metadata value */
  SA_ERROR_WORKSPACE = 4,        /* workspace missing or too small, allocator failed */
  SA_ERROR_CUDA = 5,             /* a CUDA runtime call failed */
  SA_ERROR_INTERNAL = 6          /* a bug: please report it */
} sa_status;

/* Name of a status code ("SA_OK", ...). Never NULL. */
const char* sa_status_name(sa_status status);

/* Message of the last failed call on this thread ("" if none). Valid until the next call. */
const char* sa_last_error(void);

/* ---------------------------------------------------------------------------------------------
 * Tensors.
 * ------------------------------------------------------------------------------------------- */
typedef enum sa_dtype {
  SA_DTYPE_BF16 = 0,
  SA_DTYPE_FP16 = 1,
  SA_DTYPE_FP32 = 2,
  SA_DTYPE_FP64 = 3, /* CPU reference only */
  SA_DTYPE_INT32 = 4
} sa_dtype;

typedef enum sa_device_type { SA_DEVICE_CPU = 0, SA_DEVICE_CUDA = 1 } sa_device_type;

#define SA_MAX_RANK 4

typedef struct sa_tensor {
  void* data;                      /* NULL: the tensor is absent (only for optional arguments) */
  sa_dtype dtype;
  int32_t rank;                    /* 0..SA_MAX_RANK */
  int64_t shape[SA_MAX_RANK];      /* sizes; entries past rank are ignored */
  int64_t strides[SA_MAX_RANK];    /* in elements, not bytes */
  sa_device_type device;
  int32_t device_index;            /* CUDA ordinal; 0 for CPU */
} sa_tensor;

/* An absent optional tensor. */
sa_tensor sa_tensor_none(void);
/* A contiguous (row-major) view. rank <= SA_MAX_RANK. */
sa_tensor sa_tensor_contiguous(void* data, sa_dtype dtype, int32_t rank, const int64_t* shape,
                               sa_device_type device, int32_t device_index);

/* ---------------------------------------------------------------------------------------------
 * Implementations and execution context.
 * ------------------------------------------------------------------------------------------- */
typedef enum sa_impl {
  SA_IMPL_AUTO = 0,      /* best available for the tensors' device and the shape */
  SA_IMPL_REFERENCE = 1, /* fp64 CPU reference (CPU tensors) */
  SA_IMPL_PORTABLE = 2,  /* tensor-core CUDA path for sm80 and newer */
  SA_IMPL_SM90 = 3       /* Hopper fast path (sm_90a) */
} sa_impl;

const char* sa_impl_name(sa_impl impl);

typedef struct CUstream_st* sa_stream_t; /* == cudaStream_t; NULL is the legacy default stream */

/* Caller-supplied allocator for device workspace: alloc returns NULL on failure. Memory is
 * requested and released in stream order on `stream`. */
typedef void* (*sa_alloc_fn)(size_t bytes, sa_stream_t stream, void* user);
typedef void (*sa_free_fn)(void* ptr, sa_stream_t stream, void* user);

typedef struct sa_context {
  sa_stream_t stream;       /* the call's work is ordered on this stream; no hidden host
                             * synchronisation. (The BSA backward forks its reverse map onto
                             * a per-thread, high-priority side stream and joins it back with
                             * events: stream order and graph capture see one call.) */
  void* workspace;          /* caller workspace of workspace_bytes (query the size first), or */
  size_t workspace_bytes;
  sa_alloc_fn alloc;        /* ... an allocator used when workspace is too small; may be NULL */
  sa_free_fn free;
  void* allocator_user;
  sa_impl* impl_used;       /* optional out: which implementation ran */
} sa_context;

/* A context with no workspace and no allocator on the default stream. */
sa_context sa_context_default(void);

/* ---------------------------------------------------------------------------------------------
 * Block-sparse attention (SPEC section 1).
 * ------------------------------------------------------------------------------------------- */
typedef enum sa_layout {
  SA_LAYOUT_BHSD = 0, /* [B, H, S, D] */
  SA_LAYOUT_BSHD = 1  /* [B, S, H, D] */
} sa_layout;

typedef struct sa_bsa_options {
  float scale;           /* softmax scale; 0 means 1/sqrt(D); else finite, with
                          * FLT_MIN <= |scale| <= 2.35865e38 */
  sa_layout layout;      /* layout of q, k, v, o (and dout, dq, dk, dv) */
  int32_t block_size;    /* 64 or 128 (query and KV blocks) */
  int32_t count;         /* blocks per row when q2k_count is absent; -1 means K_max (which
                          * must then fit in int32) */
  int32_t bucket_size;   /* backward: query blocks per group of a reverse row; 0 = automatic */
  int32_t validate;      /* nonzero: check metadata values first, report the first bad entry */
  int32_t deterministic; /* nonzero: bitwise-reproducible gradients */
  sa_impl impl;          /* SA_IMPL_AUTO or a forced implementation */
} sa_bsa_options;

sa_bsa_options sa_bsa_options_default(void);

typedef struct sa_bsa_sparsity {
  sa_tensor q2k_index;    /* [B, H_q, N_q, K_max] int32: KV blocks attended by query block m */
  sa_tensor q2k_count;    /* [B, H_q, N_q] int32 in [0, K_max]; may be absent */
  sa_tensor kv_block_len; /* [N_kv] or [B, N_kv] int32 in [1, block_size]; may be absent */
} sa_bsa_sparsity;

typedef struct sa_bsa_fwd_args {
  sa_tensor q;   /* [B, H_q, S_q, D] or [B, S_q, H_q, D]; bf16/fp16 (CPU also fp32/fp64) */
  sa_tensor k;   /* [B, H_kv, S_kv, D] (same layout) */
  sa_tensor v;   /* [B, H_kv, S_kv, D_v] (same layout) */
  sa_bsa_sparsity sparsity;
  sa_tensor o;   /* out: layout and dtype of q, last dim D_v */
  sa_tensor lse; /* out: [B, H_q, S_q] fp32 */
  sa_bsa_options options;
} sa_bsa_fwd_args;

typedef struct sa_bsa_bwd_args {
  sa_tensor q, k, v; /* as in the forward */
  sa_tensor o;       /* forward output */
  sa_tensor lse;     /* forward LSE, [B, H_q, S_q] fp32 */
  sa_tensor dout;    /* gradient of o: shape, layout and dtype of o */
  sa_bsa_sparsity sparsity;
  sa_tensor dq, dk, dv; /* out: shapes, layouts and dtypes of q, k, v */
  sa_bsa_options options;
} sa_bsa_bwd_args;

sa_status sa_bsa_forward_workspace_size(const sa_bsa_fwd_args* args, size_t* bytes);
sa_status sa_bsa_forward(const sa_bsa_fwd_args* args, const sa_context* ctx);
sa_status sa_bsa_backward_workspace_size(const sa_bsa_bwd_args* args, size_t* bytes);
sa_status sa_bsa_backward(const sa_bsa_bwd_args* args, const sa_context* ctx);

/* ---------------------------------------------------------------------------------------------
 * DeepSeek sparse attention, top-k sparse MLA (SPEC section 2).
 * ------------------------------------------------------------------------------------------- */
typedef struct sa_dsa_options {
  float scale;           /* softmax scale; 0 means 1/sqrt(D_qk); else as in sa_bsa_options */
  int32_t d_v;           /* value width: kv[:, :d_v] is the value; 0 means 512 */
  int32_t deterministic; /* nonzero: bitwise-reproducible dkv and d_sink */
  sa_impl impl;
} sa_dsa_options;

sa_dsa_options sa_dsa_options_default(void);

typedef struct sa_dsa_fwd_args {
  sa_tensor q;           /* [S_q, H, D_qk] bf16/fp16 (CPU also fp32/fp64) */
  sa_tensor kv;          /* [S_kv, D_qk], dtype of q */
  sa_tensor topk_idx;    /* [S_q, topk] int32; any value allowed, inactive ones are never read */
  sa_tensor topk_length; /* [S_q] int32; may be absent */
  sa_tensor sink;        /* [H] fp32; may be absent */
  sa_tensor out;         /* out: [S_q, H, d_v], dtype of q */
  sa_tensor lse;         /* out: [S_q, H] fp32 (+inf for an empty row) */
  sa_dsa_options options;
} sa_dsa_fwd_args;

typedef struct sa_dsa_bwd_args {
  sa_tensor q, kv, topk_idx, topk_length, sink; /* as in the forward */
  sa_tensor out;    /* forward output [S_q, H, d_v] */
  sa_tensor lse;    /* forward LSE [S_q, H] fp32 */
  sa_tensor dout;   /* [S_q, H, d_v], dtype of q */
  sa_tensor dq;     /* out: [S_q, H, D_qk], dtype of q */
  sa_tensor dkv;    /* out: [S_kv, D_qk], dtype of kv (accumulated in fp32) */
  sa_tensor d_sink; /* out: [H] fp32; may be absent (zeros when there is no sink) */
  sa_dsa_options options;
} sa_dsa_bwd_args;

/* The forward's workspace is optional: with topk_length the Hopper forward asks for a few bytes
 * (a counter from which its persistent CTAs take the rows of different lengths); given neither
 * that workspace nor an allocator, it runs one CTA per row instead (slower, same results). */
sa_status sa_dsa_forward_workspace_size(const sa_dsa_fwd_args* args, size_t* bytes);
sa_status sa_dsa_forward(const sa_dsa_fwd_args* args, const sa_context* ctx);
sa_status sa_dsa_backward_workspace_size(const sa_dsa_bwd_args* args, size_t* bytes);
sa_status sa_dsa_backward(const sa_dsa_bwd_args* args, const sa_context* ctx);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SPARSE_ATTENTION_H_ */
