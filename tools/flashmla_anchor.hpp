// An anchor for `sparse-attention bench`: FlashMLA's Hopper sparse prefill kernel
// (deepseek-ai/FlashMLA, MIT licence), the DSA forward FlashMLA publishes 640 TFLOPS for on an
// H800. It is compiled from a FlashMLA checkout named at configure time (-DSA_FLASHMLA_DIR=...;
// scripts/flashmla_anchor.sh fetches one) into the CLI only, never into the library, and runs as
// the bench variant `anchor=flashmla` on the same device tensors as ours. Its problem definition
// is SPEC's (out; lse = log-sum-exp of the active scores, sink excluded, +inf for an empty row;
// attention sink; topk_length), so our reference check applies to it unchanged.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace sa_tool {

// Device pointers of one DSA forward, contiguous: q [S_q, H, D_qk], kv [S_kv, D_qk],
// topk_idx [S_q, topk], topk_length [S_q] or null, sink [H] or null, out [S_q, H, 512],
// lse [S_q, H], max_logits [S_q, H] (FlashMLA's extra output: scratch).
struct FlashMlaFwdCall {
  const void* q;
  const void* kv;
  const int32_t* topk_idx;
  const int32_t* topk_length;
  const float* sink;
  void* out;
  float* lse;
  float* max_logits;
  int s_q, s_kv, h, d_qk, topk;
  float scale;
};

// True when this build has the anchor (SA_FLASHMLA_DIR was set).
bool flashmla_anchor_built();

// Why FlashMLA's sm90 sparse prefill does not serve this call ("" when it does): bf16 only,
// H 64 or 128, D_qk 512 or 576, D_v 512, topk a multiple of 128, an sm_90 device.
const char* flashmla_unsupported(const FlashMlaFwdCall& c, int device_major, int device_minor);

// Launches on `stream`; returns the launch's CUDA error.
cudaError_t flashmla_sparse_fwd(const FlashMlaFwdCall& c, int num_sms, cudaStream_t stream);

}  // namespace sa_tool
