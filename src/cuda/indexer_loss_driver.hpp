// The indexer KL loss and its gradients (SPEC 5), the host driver every CUDA path shares
// (indexer_loss_driver.cu): support checks, the workspace plan, the loss kernel
// (indexer_loss_kernel.cuh), deterministic mode and dense mode's slices. The attention target
// (log A_g per slot and head group, the dominant cost) is an arch's kernel, injected as a
// TargetLaunch: the portable entry (sm80/indexer_loss.cu) passes the mma.sync target, the Hopper
// entry (sm90/indexer_loss.cu) the wgmma one. Both fill the same TargetParams contract.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/indexer_problem.hpp"
#include "cuda/dsa_backward_aux.hpp"  // AccColumns

namespace sa::portable::indexer {

// The attention target's arguments, per token t (tokens [tok_begin, tok_begin + tokens) of one
// launch) and head group g (64 heads; the last group's rows past H are no heads):
//
//   log A_g[t, i] = log sum_{h in g, lse_h finite} exp(scale * <q[t, h], kv[key(t, i)]> - lse_h)
//
// -inf when no head of the group has a term (lse = +inf or rows past H). Written for every slot
// i below the active prefix (sparse: key = idx[t, i], inactive indices (< 0 or >= S_kv) read
// nothing: their kv row is taken as zeros) or every key of the range (dense: key = range_begin(t)
// + i, i < range_size(t)); nothing else of log_a is written.
struct TargetParams {
  const __nv_bfloat16* q;   // [S_q, H, D_qk]: (t, h, d) at t * q_ss + h * q_sh + d
  const __nv_bfloat16* kv;  // [S_kv, D_qk]: row j at j * kv_ss
  const float* lse;         // [S_q, H]: (t, h) at t * lse_ss + h * lse_sh
  const int32_t* idx;       // sparse: [S_q, topk]: (t, i) at t * idx_ss + i * idx_si
  const int32_t* len;       // sparse: [S_q] at t * len_s; may be null
  IndexerDims dims;         // dense: the range rule (IndexerMeta::range_begin / range_size)
  IndexerMeta meta;
  // log A_g of (group g, token t, slot i) at g * la_gs + (t - tok_begin) * la_ts + i:
  // sparse [groups, S_q, topk], dense [groups, slice, S_kv].
  float* log_a;
  int64_t la_gs, la_ts;
  int64_t tok_begin;
  int64_t q_ss, q_sh, kv_ss, lse_ss, lse_sh, idx_ss, idx_si, len_s;
  int64_t skv;
  int32_t H, topk, head_groups, qk_chunks;  // qk_chunks = D_qk / 8: 64 or 72
  float scale_log2;                         // scale * log2(e)
};

// An arch's target: log A_g of `tokens` tokens from prm.tok_begin on, every head group; `dense`:
// the slots are the keys of each token's range (prm.idx unused). On `stream`, device `device`
// current; launches nothing when tokens is 0.
using TargetLaunch = void (*)(const TargetParams& prm, bool dense, int64_t tokens, int device,
                              cudaStream_t stream);

struct LossParams;  // indexer_loss_kernel.cuh: the loss kernel's arguments

// An arch's loss kernel (step 3 of indexer_loss_driver.cu) without deterministic partial rows
// (prm.dk_part null), sparse or `dense` (a slice's launch): launches it over `tokens` tokens from
// prm.tok_begin on and returns true, or launches nothing and returns false when it does not serve
// this call (H_I `heads`, prm.topk, prm.head_groups, its tuning); the driver then launches the
// portable loss kernel. The same contract and outputs as the portable kernel (loss_rows,
// loss_per_token, dq_I, dw, dk_acc).
using LossLaunch = bool (*)(const LossParams& prm, bool dense, int64_t heads, int64_t tokens,
                            cudaStream_t stream);

struct LossDriverOptions {
  TargetLaunch target = nullptr;
  LossLaunch loss = nullptr;  // null: the portable loss kernel everywhere
  // The column order of `loss`'s dk_acc reductions (the portable kernel's is natural).
  dsa_bwd::AccColumns loss_columns = dsa_bwd::AccColumns::kNatural;
  int target_smem_bytes = 0;  // shared memory per block the target needs at least
  const char* path = "";      // the path, for errors ("portable indexer loss", ...)
};

// "" when the driver and the target serve p, else why not (naming o.path).
std::string loss_unsupported(const IndexerLossProblem& p, const LossDriverOptions& o);
// The workspace of p (the same for every target).
size_t loss_workspace_bytes(const IndexerLossProblem& p);
// Writes loss, loss_per_token, dq_I, dk_I and dw (every element); throws sa::Error
// (SA_ERROR_UNSUPPORTED) when loss_unsupported(p, o) says why not.
void loss_run(const IndexerLossProblem& p, void* workspace, size_t workspace_bytes,
              const LossDriverOptions& o, cudaStream_t stream);

}  // namespace sa::portable::indexer
