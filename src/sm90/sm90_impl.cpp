// The Hopper (sm_90a) fast path as the dispatcher sees it. Every kernel here has passed its GPU
// tests on an H200; AUTO takes each one where it measured faster than the portable path
// (bench/notes-archive), i.e. everywhere except the DSA backward's deterministic mode below 64
// heads. Exceptions,
// pending their first GPU run: the indexer loss's Hopper attention target (below) and the BSA
// forward's and backward's token masks (bsa_forward_kernel.cuh, FwdTraits::kMasked;
// bsa_backward_kernel.cuh, BwdTraits::kMask; dense batches) and the packed (varlen) batches of
// the forward (FwdTraits::kVarlen) and the backward (BwdTraits::kVarlen), which AUTO serves
// before they were tested or measured.
// Compiled only with the Hopper objects (SA_HAVE_SM90): this file calls into src/sm90/*.cu.
#if SA_HAVE_SM90
#include <cuda_runtime_api.h>

#include <sstream>
#include <string>

#include "api/implementation.hpp"
#include "common/cuda_check.hpp"
#include "common/cuda_device.hpp"
#include "common/tuning.hpp"
#include "cuda/bsa_metadata_check.hpp"
#include "sm90/bsa_backward.hpp"
#include "sm90/bsa_forward.hpp"
#include "sm90/dsa_backward.hpp"
#include "sm90/dsa_forward.hpp"
#include "sm90/indexer.hpp"

namespace sa {

// The loss's A/B (Tuning::sm90_indexer_target) runs the portable entry.
extern const Implementation kPortableImplementation;

namespace {

// "" when `device` has compute capability exactly 9.0 (the sm_90a objects run nowhere else),
// else the reason.
std::string check_sm90_device(int32_t device) {
  int major = 0, minor = 0;
  const std::string why = device_capability(device, &major, &minor);
  if (!why.empty()) return why;
  if (major != 9 || minor != 0) {
    std::ostringstream os;
    os << "needs an sm_90 GPU (found sm_" << major << minor << ")";
    return os.str();
  }
  return "";
}

// The device's reason when it has one, otherwise that of the path's own check.
template <class Problem>
std::string unsupported(const Problem& p, std::string (*path_unsupported)(const Problem&)) {
  if (p.device != SA_DEVICE_CUDA) return "needs CUDA tensors";
  const std::string why = check_sm90_device(p.device_index);
  if (!why.empty()) return why;
  return path_unsupported(p);
}

// ---- BSA forward ------------------------------------------------------------------------------
// Packed (varlen) batches (docs/bsa.md, "Packed batches"): the forward and the backward take them,
// with or without a mask (FwdTraits::kVarlen, BwdTraits::kVarlen; compiled, not yet run on a
// GPU), so AUTO prefers them. Refusals are checked before the device, so that the reason reads
// the same on every machine.
std::string bsa_fwd_unsupported(const BsaFwdProblem& p) {
  if (p.meta.varlen() && p.options.validate)
    return "options.validate with packed batches (options.cu_seqlens_q/k): the GPU metadata "
           "check does not read cu_seqlens yet (the CPU reference checks them)";
  return unsupported(p, &sm90::bsa_forward_unsupported);
}

size_t bsa_fwd_workspace_bytes(const BsaFwdProblem& p) {
  DeviceScope scope(p.device_index);
  return sm90::bsa_forward_workspace_bytes(p);
}

// Split-KV's partials are required; the masked and packed calls' tile counter is not (without
// it their kernels take the static tile order).
bool bsa_fwd_workspace_optional(const BsaFwdProblem& p) {
  DeviceScope scope(p.device_index);
  return sm90::bsa_forward_workspace_optional(p);
}

void bsa_fwd_run(const BsaFwdProblem& p, const ExecContext& ctx) {
  DeviceScope scope(p.device_index);
  cudaStream_t stream = ctx.stream;
  if (p.options.validate) portable::check_bsa_metadata_gpu(p.dims, p.meta, stream);
  sm90::bsa_forward(p, ctx.workspace, ctx.workspace_bytes, stream);
}

// ---- BSA backward ------------------------------------------------------------------------------
// Packed batches: as the forward (above), options.validate refused by name.
std::string bsa_bwd_unsupported(const BsaBwdProblem& p) {
  if (p.meta.varlen() && p.options.validate)
    return "options.validate with packed batches (options.cu_seqlens_q/k): the GPU metadata "
           "check does not read cu_seqlens yet (the CPU reference checks them)";
  return unsupported(p, &sm90::bsa_backward_unsupported);
}

size_t bsa_bwd_workspace_bytes(const BsaBwdProblem& p) {
  DeviceScope scope(p.device_index);  // CUB sizes its scan for the current device
  return sm90::bsa_backward_workspace_bytes(p);
}

void bsa_bwd_run(const BsaBwdProblem& p, const ExecContext& ctx) {
  DeviceScope scope(p.device_index);
  cudaStream_t stream = ctx.stream;
  if (p.options.validate) portable::check_bsa_metadata_gpu(p.dims, p.meta, stream);
  sm90::bsa_backward(p, ctx.workspace, ctx.workspace_bytes, stream);
}

// ---- DSA forward ------------------------------------------------------------------------------
// H 32 runs by head padding (64-row CTAs), H 16 on the transposed kernel (dsa_forward_small_h.cuh):
// 2.22x and 2.48x the portable forward on the H200 (S 4096, topk 2048, D_qk 576; session 21).
std::string dsa_fwd_unsupported(const DsaFwdProblem& p) {
  return unsupported(p, &sm90::dsa_forward_unsupported);
}

size_t dsa_fwd_workspace_bytes(const DsaFwdProblem& p) {
  return sm90::dsa_forward_workspace_bytes(p);
}

// The forward's workspace (an item counter, with topk_length) is optional.
bool dsa_fwd_workspace_optional(const DsaFwdProblem&) { return true; }

void dsa_fwd_run(const DsaFwdProblem& p, const ExecContext& ctx) {
  DeviceScope scope(p.device_index);
  sm90::dsa_forward(p, ctx.workspace, ctx.workspace_bytes, ctx.stream);
}

// ---- DSA backward ------------------------------------------------------------------------------
// Deterministic mode: the Hopper kernel's fixed-point instantiation measured 1.22-1.31x the
// portable backward at H 64 and 128 in its first (32-byte) form (session 48, H100, S 4096, topk
// 2048, topk_length, one call: H 128 D_qk 576 136.2 against 105.3 TFLOPS, H 64 D_qk 576 133.9
// against 102.3, H 64 D_qk 512 139.0 against 114.1; the merged 64-byte form is 16-17% faster
// again), so AUTO takes it there. Below 64 heads its rows are padded to 64 (token groups are not
// deterministic): 1.10x the portable one at H 32 D_qk 576 on that one shape, not yet measured
// at H 8 / 16, so AUTO keeps the portable one where it serves (H a multiple of 8); a caller
// that forces SA_IMPL_SM90 still gets the Hopper kernel, and so does AUTO at the H the portable
// kernels do not take (below 64 and not a multiple of 8).
std::string dsa_bwd_unsupported(const DsaBwdProblem& p) {
  const std::string why = unsupported(p, &sm90::dsa_backward_unsupported);
  if (!why.empty()) return why;
  if (p.options.deterministic && p.dims.H < 64 && p.dims.H % 8 == 0 &&
      p.options.impl != SA_IMPL_SM90)
    return "deterministic mode below 64 heads: left to the portable backward (set "
           "options.impl = SA_IMPL_SM90 to use this one)";
  return "";
}

size_t dsa_bwd_workspace_bytes(const DsaBwdProblem& p) {
  DeviceScope scope(p.device_index);
  return sm90::dsa_backward_workspace_bytes(p);
}

void dsa_bwd_run(const DsaBwdProblem& p, const ExecContext& ctx) {
  DeviceScope scope(p.device_index);
  sm90::dsa_backward(p, ctx.workspace, ctx.workspace_bytes, ctx.stream);
}

// ---- DSA indexer (SPEC 5) ----------------------------------------------------------------------
// The scores and the fused top-k (verified on an H100: *IndexerSm90*, compute-sanitizer clean);
// AUTO serves them on sm_90 (scores 1.37-1.58x, top-k 1.02-1.13x the portable kernels, H100,
// bench/NOTES.md session 34).
std::string indexer_scores_unsupported(const IndexerScoresProblem& p) {
  return unsupported(p, &sm90::indexer_scores_unsupported);
}

void indexer_scores_run(const IndexerScoresProblem& p, const ExecContext& ctx) {
  DeviceScope scope(p.device_index);
  sm90::indexer_scores(p, ctx.stream);
}

std::string indexer_topk_unsupported(const IndexerTopkProblem& p) {
  return unsupported(p, &sm90::indexer_topk_unsupported);
}

size_t indexer_topk_workspace_bytes(const IndexerTopkProblem& p) {
  DeviceScope scope(p.device_index);  // the plan reads the device's SM count
  return sm90::indexer_topk_workspace_bytes(p);
}

void indexer_topk_run(const IndexerTopkProblem& p, const ExecContext& ctx) {
  DeviceScope scope(p.device_index);
  sm90::indexer_topk(p, ctx.workspace, ctx.workspace_bytes, ctx.stream);
}

// The KL loss: the shared driver (the loss kernel, deterministic mode and dense slices are the
// portable path's code) with the Hopper attention target (sm90/indexer_target_kernel.cuh), so AUTO
// serves the loss here on sm_90. NOT YET VERIFIED ON A GPU (tests: IndexerSm90Loss*); the internal
// tuning Tuning::sm90_indexer_target = 1 runs the portable entry instead (the same driver with the
// portable target, the same workspace), for A/B in the bench and tests (2: the Hopper target with
// Q in registers, chosen in sm90/indexer_loss.cu).
bool loss_portable_target() { return detail::tuning().sm90_indexer_target == 1; }

std::string indexer_loss_unsupported(const IndexerLossProblem& p) {
  if (loss_portable_target())
    return unsupported(p, kPortableImplementation.indexer_loss.unsupported);
  return unsupported(p, &sm90::indexer_loss_unsupported);
}

size_t indexer_loss_workspace_bytes(const IndexerLossProblem& p) {
  DeviceScope scope(p.device_index);  // CUB sizes deterministic mode's sort for the current device
  return sm90::indexer_loss_workspace_bytes(p);
}

void indexer_loss_run(const IndexerLossProblem& p, const ExecContext& ctx) {
  if (loss_portable_target()) {
    kPortableImplementation.indexer_loss.run(p, ctx);
    return;
  }
  DeviceScope scope(p.device_index);
  sm90::indexer_loss(p, ctx.workspace, ctx.workspace_bytes, ctx.stream);
}

}  // namespace

extern const Implementation kSm90Implementation = {
    SA_IMPL_SM90,
    "sm90",
    /*bsa_fwd=*/{&bsa_fwd_unsupported, &bsa_fwd_workspace_bytes, &bsa_fwd_run,
                 &bsa_fwd_workspace_optional},
    /*bsa_bwd=*/{&bsa_bwd_unsupported, &bsa_bwd_workspace_bytes, &bsa_bwd_run},
    /*dsa_fwd=*/{&dsa_fwd_unsupported, &dsa_fwd_workspace_bytes, &dsa_fwd_run,
                 &dsa_fwd_workspace_optional},
    /*dsa_bwd=*/{&dsa_bwd_unsupported, &dsa_bwd_workspace_bytes, &dsa_bwd_run},
    // The DSA indexer (SPEC 5): scores, top-k, and the loss with the Hopper attention target.
    /*indexer_scores=*/{&indexer_scores_unsupported, nullptr, &indexer_scores_run},
    /*indexer_topk=*/{&indexer_topk_unsupported, &indexer_topk_workspace_bytes, &indexer_topk_run},
    /*indexer_loss=*/{&indexer_loss_unsupported, &indexer_loss_workspace_bytes,
                      &indexer_loss_run},
};

}  // namespace sa

#endif  // SA_HAVE_SM90
