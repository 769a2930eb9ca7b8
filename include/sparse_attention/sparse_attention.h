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
 * Every options and args struct starts with `size`: see "Extensible structs" below.
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

/* The library exports these functions and nothing else (every other symbol is hidden). */
#if defined(SA_BUILDING_LIBRARY) && (defined(__GNUC__) || defined(__clang__))
#define SA_API __attribute__((visibility("default")))
#else
#define SA_API
#endif

/* The initializers of the extensible structs below are defined in this header (so that they
 * give the caller's sizeof), as static inline functions. */
#if defined(__cplusplus) || (defined(__STDC_VERSION__) && __STDC_VERSION__ >= 199901L)
#define SA_INLINE static inline
#else
#define SA_INLINE static __inline
#endif

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
SA_API const char* sa_status_name(sa_status status);

/* Message of the last failed call on this thread ("" if none). Valid until the next call. */
SA_API const char* sa_last_error(void);

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

/* An absent optional tensor (also as an initializer: sa_tensor t = SA_TENSOR_NONE_INIT;). */
#define SA_TENSOR_NONE_INIT {NULL, SA_DTYPE_FP32, 0, {0, 0, 0, 0}, {0, 0, 0, 0}, SA_DEVICE_CPU, 0}
/* Also absent, with every byte 0: the form used inside extensible structs (whose later
 * fields default to 0 bytes). */
#define SA_TENSOR_ZERO_INIT {NULL, SA_DTYPE_BF16, 0, {0, 0, 0, 0}, {0, 0, 0, 0}, SA_DEVICE_CPU, 0}
SA_API sa_tensor sa_tensor_none(void);
/* A contiguous (row-major) view. rank <= SA_MAX_RANK. */
SA_API sa_tensor sa_tensor_contiguous(void* data, sa_dtype dtype, int32_t rank,
                                      const int64_t* shape, sa_device_type device,
                                      int32_t device_index);

/* ---------------------------------------------------------------------------------------------
 * Implementations and execution context.
 * ------------------------------------------------------------------------------------------- */
typedef enum sa_impl {
  SA_IMPL_AUTO = 0,      /* best available for the tensors' device and the shape */
  SA_IMPL_REFERENCE = 1, /* fp64 CPU reference (CPU tensors) */
  SA_IMPL_PORTABLE = 2,  /* tensor-core CUDA path for sm80 and newer */
  SA_IMPL_SM90 = 3       /* Hopper fast path (sm_90a) */
} sa_impl;

SA_API const char* sa_impl_name(sa_impl impl);

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
SA_API sa_context sa_context_default(void);

/* ---------------------------------------------------------------------------------------------
 * Extensible structs: the options structs (sa_bsa_options, sa_dsa_options, sa_indexer_options)
 * and the args structs (sa_bsa_fwd_args, sa_bsa_bwd_args, sa_dsa_fwd_args, sa_dsa_bwd_args,
 * sa_indexer_scores_args, sa_indexer_topk_args, sa_indexer_loss_args) start with
 *     size_t size;   sizeof the struct as the caller compiled it
 * Start every one from its initializer in this header, which sets `size` (and the defaults),
 * then set the fields you need:
 *     sa_bsa_fwd_args a = sa_bsa_fwd_args_default();   (or = SA_BSA_FWD_ARGS_INIT;)
 * The rules that keep a program built against this header working with later libraries:
 *  - A later version only appends fields at the end of a struct, and a field added later has
 *    the value 0 as its default. New per-call settings go at the end of the options struct,
 *    which stays the last member of each args struct.
 *  - The library reads only the bytes inside the caller's `size` (of the args struct and of its
 *    options) and gives every field past them its default.
 *  - A size of 0 (an uninitialised struct), below the first version's size, or above 64 KiB is
 *    SA_ERROR_INVALID_ARGUMENT naming it ("args.size", "args.options.size").
 *  - A size larger than the library's own struct (a newer header than the library) is accepted
 *    when the bytes the library does not know are all 0, the defaults; otherwise the call is
 *    SA_ERROR_UNSUPPORTED: it asks for options this library predates.
 * ------------------------------------------------------------------------------------------- */

/* ---------------------------------------------------------------------------------------------
 * Block-sparse attention (SPEC section 1).
 * ------------------------------------------------------------------------------------------- */
typedef enum sa_layout {
  SA_LAYOUT_BHSD = 0, /* [B, H, S, D] */
  SA_LAYOUT_BSHD = 1  /* [B, S, H, D] */
} sa_layout;

/* Token mask inside the listed blocks (docs/bsa.md, "Token masks"). With causal_offset `c`
 * (default S_kv - S_q, bottom-right aligned), query token i sees key token s iff
 *   causal:        s <= i + c
 *   window:        i + c - window_left <= s <= i + c + window_right
 *   causal_window: i + c - window_left <= s <= i + c
 * on top of the block lists: a key must also lie in a listed block, within its valid length. */
typedef enum sa_mask {
  SA_MASK_NONE = 0,         /* every valid key of a listed block (the first version's behaviour) */
  SA_MASK_CAUSAL = 1,
  SA_MASK_WINDOW = 2,
  SA_MASK_CAUSAL_WINDOW = 3
} sa_mask;

typedef struct sa_bsa_options {
  size_t size;           /* sizeof(sa_bsa_options): set by SA_BSA_OPTIONS_INIT */
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
  /* Version 2 (token masks). The first version ends after `impl`; these start at the next
   * 8-byte boundary, so that no byte of them lies in a version-1 caller's struct (its padding). */
  int64_t causal_offset; /* the diagonal's offset `c` when causal_offset_given is nonzero; any
                          * value (rows may see no key) */
  int64_t window_left;   /* window masks: keys before the diagonal that a query sees, >= 0;
                          * must be 0 for none and causal */
  int64_t window_right;  /* SA_MASK_WINDOW: keys after the diagonal, >= 0; must be 0 otherwise */
  sa_mask mask;          /* SA_MASK_NONE (default), _CAUSAL, _WINDOW or _CAUSAL_WINDOW */
  int32_t causal_offset_given; /* nonzero: use causal_offset; 0 (default): c = S_kv - S_q. Must
                                * be 0 with SA_MASK_NONE */
  /* Version 3 (packed batches, docs/bsa.md "Packed batches"). They start past the version-2
   * struct, padding included. Both present (a THD call) or both absent (a dense [B, ...] call).
   * An absent tensor here is all-zero bytes (SA_TENSOR_ZERO_INIT: data NULL), so that the
   * default of every version-3 byte is 0. With them, q is [T_q, H_q, D], k [T_kv, H_kv, D],
   * v [T_kv, H_kv, D_v], o [T_q, H_q, D_v], lse [H_q, T_q]; sequence b holds query tokens
   * [cu_seqlens_q[b], cu_seqlens_q[b+1]) and keys [cu_seqlens_k[b], cu_seqlens_k[b+1]); the
   * metadata is [B, H_q, N_q_max, K_max] with KV block ids local to the sequence. */
  sa_tensor cu_seqlens_q; /* [B + 1] int32, on the device of q: 0 = c[0] <= c[1] <= ... = T_q */
  sa_tensor cu_seqlens_k; /* [B + 1] int32, on the device of q: 0 = c[0] <= c[1] <= ... = T_kv */
} sa_bsa_options;

/* Defaults: scale 1/sqrt(D), BHSD, block 128, count K_max, automatic buckets, no validation,
 * not deterministic, AUTO, no token mask, a dense batch (no cu_seqlens). */
#define SA_BSA_OPTIONS_INIT \
  {sizeof(sa_bsa_options), 0.0f, SA_LAYOUT_BHSD, 128, -1, 0, 0, 0, SA_IMPL_AUTO, 0, 0, 0, \
   SA_MASK_NONE, 0, SA_TENSOR_ZERO_INIT, SA_TENSOR_ZERO_INIT}
SA_INLINE sa_bsa_options sa_bsa_options_default(void) {
  sa_bsa_options o = SA_BSA_OPTIONS_INIT;
  return o;
}

typedef struct sa_bsa_sparsity {
  sa_tensor q2k_index;    /* [B, H_q, N_q, K_max] int32: KV blocks attended by query block m */
  sa_tensor q2k_count;    /* [B, H_q, N_q] int32 in [0, K_max]; may be absent */
  sa_tensor kv_block_len; /* [N_kv] or [B, N_kv] int32 in [1, block_size]; may be absent */
} sa_bsa_sparsity;

typedef struct sa_bsa_fwd_args {
  size_t size;   /* sizeof(sa_bsa_fwd_args): set by SA_BSA_FWD_ARGS_INIT */
  sa_tensor q;   /* [B, H_q, S_q, D] or [B, S_q, H_q, D]; bf16/fp16 (CPU also fp32/fp64) */
  sa_tensor k;   /* [B, H_kv, S_kv, D] (same layout) */
  sa_tensor v;   /* [B, H_kv, S_kv, D_v] (same layout) */
  sa_bsa_sparsity sparsity;
  sa_tensor o;   /* out: layout and dtype of q, last dim D_v */
  sa_tensor lse; /* out: [B, H_q, S_q] fp32 */
  sa_bsa_options options; /* the last member (see "Extensible structs") */
} sa_bsa_fwd_args;

typedef struct sa_bsa_bwd_args {
  size_t size;       /* sizeof(sa_bsa_bwd_args): set by SA_BSA_BWD_ARGS_INIT */
  sa_tensor q, k, v; /* as in the forward */
  sa_tensor o;       /* forward output */
  sa_tensor lse;     /* forward LSE, [B, H_q, S_q] fp32 */
  sa_tensor dout;    /* gradient of o: shape, layout and dtype of o */
  sa_bsa_sparsity sparsity;
  sa_tensor dq, dk, dv; /* out: shapes, layouts and dtypes of q, k, v */
  sa_bsa_options options; /* the last member */
} sa_bsa_bwd_args;

/* Every tensor absent, default options. */
#define SA_BSA_SPARSITY_NONE_INIT {SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT}
#define SA_BSA_FWD_ARGS_INIT                                                                     \
  {sizeof(sa_bsa_fwd_args), SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT,      \
   SA_BSA_SPARSITY_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_BSA_OPTIONS_INIT}
#define SA_BSA_BWD_ARGS_INIT                                                                     \
  {sizeof(sa_bsa_bwd_args), SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT,      \
   SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_BSA_SPARSITY_NONE_INIT,    \
   SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_BSA_OPTIONS_INIT}
SA_INLINE sa_bsa_fwd_args sa_bsa_fwd_args_default(void) {
  sa_bsa_fwd_args a = SA_BSA_FWD_ARGS_INIT;
  return a;
}
SA_INLINE sa_bsa_bwd_args sa_bsa_bwd_args_default(void) {
  sa_bsa_bwd_args a = SA_BSA_BWD_ARGS_INIT;
  return a;
}

/* The forward's workspace: on the Hopper path, split-KV (bf16 calls whose query blocks cannot fill
 * the GPU) needs the size reported. Masked and packed calls (options.mask, options.cu_seqlens_*)
 * ask for a few bytes, a counter from which the persistent CTAs take their query blocks at block
 * 128, the last block of each head first (under a causal mask, the longest rows first; block 64
 * keeps a fixed order); that workspace is optional: given none (or a shorter one) and no
 * allocator, they take them in a fixed order instead (slower on causal lists at block 128, the
 * same results, no error). */
SA_API sa_status sa_bsa_forward_workspace_size(const sa_bsa_fwd_args* args, size_t* bytes);
SA_API sa_status sa_bsa_forward(const sa_bsa_fwd_args* args, const sa_context* ctx);
SA_API sa_status sa_bsa_backward_workspace_size(const sa_bsa_bwd_args* args, size_t* bytes);
SA_API sa_status sa_bsa_backward(const sa_bsa_bwd_args* args, const sa_context* ctx);

/* ---------------------------------------------------------------------------------------------
 * DeepSeek sparse attention, top-k sparse MLA (SPEC section 2).
 * ------------------------------------------------------------------------------------------- */
typedef struct sa_dsa_options {
  size_t size;           /* sizeof(sa_dsa_options): set by SA_DSA_OPTIONS_INIT */
  float scale;           /* softmax scale; 0 means 1/sqrt(D_qk); else as in sa_bsa_options */
  int32_t d_v;           /* value width: kv[:, :d_v] is the value; 0 (the default) means 512 */
  int32_t deterministic; /* nonzero: bitwise-reproducible dkv and d_sink */
  sa_impl impl;
} sa_dsa_options;

/* Defaults: scale 1/sqrt(D_qk), d_v 512, not deterministic, AUTO. */
#define SA_DSA_OPTIONS_INIT {sizeof(sa_dsa_options), 0.0f, 0, 0, SA_IMPL_AUTO}
SA_INLINE sa_dsa_options sa_dsa_options_default(void) {
  sa_dsa_options o = SA_DSA_OPTIONS_INIT;
  return o;
}

typedef struct sa_dsa_fwd_args {
  size_t size;           /* sizeof(sa_dsa_fwd_args): set by SA_DSA_FWD_ARGS_INIT */
  sa_tensor q;           /* [S_q, H, D_qk] bf16/fp16 (CPU also fp32/fp64) */
  sa_tensor kv;          /* [S_kv, D_qk], dtype of q */
  sa_tensor topk_idx;    /* [S_q, topk] int32; any value allowed, inactive ones are never read */
  sa_tensor topk_length; /* [S_q] int32; may be absent */
  sa_tensor sink;        /* [H] fp32; may be absent */
  sa_tensor out;         /* out: [S_q, H, d_v], dtype of q */
  sa_tensor lse;         /* out: [S_q, H] fp32 (+inf for an empty row) */
  sa_dsa_options options; /* the last member */
} sa_dsa_fwd_args;

typedef struct sa_dsa_bwd_args {
  size_t size;      /* sizeof(sa_dsa_bwd_args): set by SA_DSA_BWD_ARGS_INIT */
  sa_tensor q, kv, topk_idx, topk_length, sink; /* as in the forward */
  sa_tensor out;    /* forward output [S_q, H, d_v] */
  sa_tensor lse;    /* forward LSE [S_q, H] fp32 */
  sa_tensor dout;   /* [S_q, H, d_v], dtype of q */
  sa_tensor dq;     /* out: [S_q, H, D_qk], dtype of q */
  sa_tensor dkv;    /* out: [S_kv, D_qk], dtype of kv (accumulated in fp32) */
  sa_tensor d_sink; /* out: [H] fp32; may be absent (zeros when there is no sink) */
  sa_dsa_options options; /* the last member */
} sa_dsa_bwd_args;

/* Every tensor absent, default options. */
#define SA_DSA_FWD_ARGS_INIT                                                                     \
  {sizeof(sa_dsa_fwd_args), SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT,      \
   SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT,          \
   SA_DSA_OPTIONS_INIT}
#define SA_DSA_BWD_ARGS_INIT                                                                     \
  {sizeof(sa_dsa_bwd_args), SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT,      \
   SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT,          \
   SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT,          \
   SA_DSA_OPTIONS_INIT}
SA_INLINE sa_dsa_fwd_args sa_dsa_fwd_args_default(void) {
  sa_dsa_fwd_args a = SA_DSA_FWD_ARGS_INIT;
  return a;
}
SA_INLINE sa_dsa_bwd_args sa_dsa_bwd_args_default(void) {
  sa_dsa_bwd_args a = SA_DSA_BWD_ARGS_INIT;
  return a;
}

/* The forward's workspace is optional: with topk_length the Hopper forward asks for a few bytes
 * (a counter from which its persistent CTAs take the rows of different lengths); given neither
 * that workspace nor an allocator, it runs one CTA per row instead (slower, same results). */
SA_API sa_status sa_dsa_forward_workspace_size(const sa_dsa_fwd_args* args, size_t* bytes);
SA_API sa_status sa_dsa_forward(const sa_dsa_fwd_args* args, const sa_context* ctx);
SA_API sa_status sa_dsa_backward_workspace_size(const sa_dsa_bwd_args* args, size_t* bytes);
SA_API sa_status sa_dsa_backward(const sa_dsa_bwd_args* args, const sa_context* ctx);

/* ---------------------------------------------------------------------------------------------
 * The DSA lightning indexer (SPEC section 5): scores, top-k, and the KL training loss with its
 * gradients.
 *
 *   I[t, s] = sum_j w[t, j] * relu(scale_I * <q_I[t, j], k_I[s]>)   for s in the range of t
 *
 * The range of query t is [k_start[t], k_end[t]) intersected with [0, S_kv): any int32 values are
 * allowed (absent k_start: 0; absent k_end: S_kv); an empty range is an empty row. Like the DSA
 * indices, no range value is ever invalid, so there is nothing for a `validate` option to check.
 *
 * GPU paths take bf16 q_I, k_I (and q, kv), fp32 w, D_I = 128 and H_I in {16, 32, 64}; the CPU
 * reference also takes fp16/fp32/fp64 q_I, k_I, fp64 w and fp64 loss outputs, and any D_I, H_I, so
 * that gradient checks run on tiny shapes.
 * ------------------------------------------------------------------------------------------- */
typedef struct sa_indexer_options {
  size_t size;           /* sizeof(sa_indexer_options): set by SA_INDEXER_OPTIONS_INIT */
  float scale_I;         /* indexer scale; 0 means 1/sqrt(D_I) */
  float scale;           /* loss only: the attention's softmax scale; 0 means 1/sqrt(D_qk) */
  float coeff;           /* loss only: the loss is coeff * sum_t KL_t (default 1) */
  int32_t deterministic; /* loss only: nonzero: bitwise-reproducible dk_I */
  sa_impl impl;
} sa_indexer_options;

/* Defaults: scale_I 1/sqrt(D_I), scale 1/sqrt(D_qk), coeff 1, not deterministic, AUTO. */
#define SA_INDEXER_OPTIONS_INIT {sizeof(sa_indexer_options), 0.0f, 0.0f, 1.0f, 0, SA_IMPL_AUTO}
SA_INLINE sa_indexer_options sa_indexer_options_default(void) {
  sa_indexer_options o = SA_INDEXER_OPTIONS_INIT;
  return o;
}

/* The dense score matrix (short sequences and tests). */
typedef struct sa_indexer_scores_args {
  size_t size;       /* sizeof(sa_indexer_scores_args): set by SA_INDEXER_SCORES_ARGS_INIT */
  sa_tensor q_I;     /* [S_q, H_I, D_I] bf16 (CPU also fp16/fp32/fp64) */
  sa_tensor k_I;     /* [S_kv, D_I], dtype of q_I: one key shared by all indexer heads */
  sa_tensor w;       /* [S_q, H_I] fp32 (CPU also fp64): per-token head weights */
  sa_tensor k_start; /* [S_q] int32; may be absent (0) */
  sa_tensor k_end;   /* [S_q] int32; may be absent (S_kv) */
  sa_tensor scores;  /* out: [S_q, S_kv] fp32: I[t, s] in range, -inf outside */
  sa_indexer_options options; /* the last member (see "Extensible structs") */
} sa_indexer_scores_args;

/* Top-k keys per query, exactly as sa_dsa_forward consumes them. Row t holds the k keys of its
 * range with the largest scores (ties to the smaller key index), in increasing key order, then
 * -1; topk_length[t] = min(k, size of the range). Bitwise identical on every run. The scores are
 * ranked as the fp32 values sa_indexer_scores writes. */
typedef struct sa_indexer_topk_args {
  size_t size;           /* sizeof(sa_indexer_topk_args): set by SA_INDEXER_TOPK_ARGS_INIT */
  sa_tensor q_I, k_I, w, k_start, k_end; /* as for the scores */
  sa_tensor topk_idx;    /* out: [S_q, k] int32 (k >= 1 is the last dimension) */
  sa_tensor topk_length; /* out: [S_q] int32; may be absent */
  sa_indexer_options options; /* the last member */
} sa_indexer_topk_args;

/* The KL loss and, in the same call, its gradients. For query t and its key set K_t:
 *   p[t, s] = A[t, s] / sum_{K_t} A,  A[t, s] = sum_h exp(scale * <q[t, h], kv[s]> - lse[t, h])
 *   r[t, s] = exp(I[t, s]) / sum_{K_t} exp(I)
 *   loss    = coeff * sum_t sum_{s in K_t} p (log p - log r)      (p = 0 terms give 0)
 * Sparse mode (topk_idx given): K_t is the active slots of row t (SPEC 2's rule: index in
 * [0, S_kv), slot < topk_length[t]) whose key lies in the range of t; a key listed twice is two
 * terms. Dense mode (topk_idx absent): K_t is the range of t. A row with an empty K_t, or whose
 * target mass is zero (every head's lse is +inf), gives no loss and no gradient.
 * Gradients are of `loss`: dloss/dI = coeff * (r - p) on K_t, through the ReLU (derivative 0 where
 * its argument is <= 0) to q_I, k_I and w. q, kv and lse get none.
 *
 * One call computes the loss and the gradients because both need the target p, recomputed from
 * q, kv and lse (the expensive part), and dense mode cannot store p. Leave dq_I, dk_I and dw
 * absent for the loss alone; a caller that scales the loss (autograd's grad_output) scales the
 * gradients. */
typedef struct sa_indexer_loss_args {
  size_t size;              /* sizeof(sa_indexer_loss_args): set by SA_INDEXER_LOSS_ARGS_INIT */
  sa_tensor q_I, k_I, w;    /* as for the scores */
  sa_tensor q;              /* [S_q, H, D_qk]: the attention's queries, bf16 (CPU also others) */
  sa_tensor kv;             /* [S_kv, D_qk], dtype of q: the attention's keys */
  sa_tensor lse;            /* [S_q, H] fp32: the attention forward's LSE (natural log, sink
                             * excluded); in dense mode the dense attention's LSE over the range */
  sa_tensor topk_idx;       /* [S_q, topk] int32: sparse mode; absent: dense mode */
  sa_tensor topk_length;    /* [S_q] int32; may be absent; only with topk_idx */
  sa_tensor k_start, k_end; /* [S_q] int32; may be absent */
  sa_tensor loss;           /* out: rank 0 (a scalar) fp32 (CPU also fp64) */
  sa_tensor loss_per_token; /* out: [S_q], dtype of loss: the terms of row t (coeff included,
                             * they sum to loss); may be absent */
  sa_tensor dq_I;           /* out: [S_q, H_I, D_I], dtype of q_I; absent with dk_I and dw */
  sa_tensor dk_I;           /* out: [S_kv, D_I], dtype of k_I (accumulated in fp32 or wider) */
  sa_tensor dw;             /* out: [S_q, H_I], dtype of w */
  sa_indexer_options options; /* the last member */
} sa_indexer_loss_args;

/* Every tensor absent, default options. */
#define SA_INDEXER_SCORES_ARGS_INIT                                                              \
  {sizeof(sa_indexer_scores_args), SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, \
   SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_INDEXER_OPTIONS_INIT}
#define SA_INDEXER_TOPK_ARGS_INIT                                                                \
  {sizeof(sa_indexer_topk_args), SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT,   \
   SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT,           \
   SA_INDEXER_OPTIONS_INIT}
#define SA_INDEXER_LOSS_ARGS_INIT                                                                \
  {sizeof(sa_indexer_loss_args), SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT,   \
   SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT,           \
   SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT,           \
   SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT, SA_TENSOR_NONE_INIT,           \
   SA_INDEXER_OPTIONS_INIT}
SA_INLINE sa_indexer_scores_args sa_indexer_scores_args_default(void) {
  sa_indexer_scores_args a = SA_INDEXER_SCORES_ARGS_INIT;
  return a;
}
SA_INLINE sa_indexer_topk_args sa_indexer_topk_args_default(void) {
  sa_indexer_topk_args a = SA_INDEXER_TOPK_ARGS_INIT;
  return a;
}
SA_INLINE sa_indexer_loss_args sa_indexer_loss_args_default(void) {
  sa_indexer_loss_args a = SA_INDEXER_LOSS_ARGS_INIT;
  return a;
}

SA_API sa_status sa_indexer_scores_workspace_size(const sa_indexer_scores_args* args, size_t* bytes);
SA_API sa_status sa_indexer_scores(const sa_indexer_scores_args* args, const sa_context* ctx);
SA_API sa_status sa_indexer_topk_workspace_size(const sa_indexer_topk_args* args, size_t* bytes);
SA_API sa_status sa_indexer_topk(const sa_indexer_topk_args* args, const sa_context* ctx);
SA_API sa_status sa_indexer_loss_workspace_size(const sa_indexer_loss_args* args, size_t* bytes);
SA_API sa_status sa_indexer_loss(const sa_indexer_loss_args* args, const sa_context* ctx);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SPARSE_ATTENTION_H_ */
