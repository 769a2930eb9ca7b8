// The portable tensor-core path (sm80 and newer) as the dispatcher sees it. Operations whose
// kernels are not written yet have no entry, so the dispatcher reports "not implemented".
#include <cuda_runtime_api.h>

#include <sstream>
#include <string>

#include "api/implementation.hpp"
#include "common/cuda_check.hpp"
#include "common/cuda_device.hpp"
#include "sm80/bsa_backward.hpp"
#include "sm80/bsa_forward.hpp"
#include "cuda/bsa_metadata_check.hpp"
#include "sm80/dsa_backward.hpp"
#include "sm80/dsa_forward.hpp"
#include "sm80/indexer.hpp"

namespace sa {
namespace {

// ---- the checks every entry makes before its path's own ----------------------------------------
// "" when the portable path can run on a problem's device (CUDA tensors on a device of compute
// capability 8.0 or newer), else the reason.
std::string device_unsupported(sa_device_type device, int32_t device_index) {
  if (device != SA_DEVICE_CUDA) return "needs CUDA tensors";
  int major = 0, minor = 0;
  std::string why = device_capability(device_index, &major, &minor);
  if (!why.empty()) return why;
  if (major < 8) {
    std::ostringstream os;
    os << "needs compute capability 8.0 or newer (device " << device_index << " is " << major
       << "." << minor << ")";
    return os.str();
  }
  return "";
}

// The device's reason when it has one, otherwise that of the path's own check.
template <class Problem>
std::string unsupported(const Problem& p, std::string (*path_unsupported)(const Problem&)) {
  std::string why = device_unsupported(p.device, p.device_index);
  if (!why.empty()) return why;
  return path_unsupported(p);
}

// ---- BSA forward ------------------------------------------------------------------------------
// Packed (varlen) batches (docs/bsa.md, "Packed batches"): the forward kernel takes them (verified
// on an H100, GpuBsaVarlen*); AUTO serves them here, the Hopper kernels refusing them by name. The
// backward takes them too (bsa_bwd_unsupported).
std::string bsa_fwd_unsupported(const BsaFwdProblem& p) {
  if (p.meta.varlen() && p.options.validate)
    return "options.validate with packed batches (options.cu_seqlens_q/k): the GPU metadata "
           "check does not read cu_seqlens yet (the CPU reference checks them)";
  return unsupported(p, &portable::bsa_forward_unsupported);
}

void bsa_fwd_run(const BsaFwdProblem& p, const ExecContext& ctx) {
  DeviceScope scope(p.device_index);
  cudaStream_t stream = ctx.stream;
  if (p.options.validate) portable::check_bsa_metadata_gpu(p.dims, p.meta, stream);
  portable::bsa_forward(p, stream);
}

// ---- BSA backward -----------------------------------------------------------------------------
// Packed batches: the kernels' packed instantiations (compiled; see docs/bsa.md for what has run
// on a GPU), without options.validate, as for the forward.
std::string bsa_bwd_unsupported(const BsaBwdProblem& p) {
  if (p.meta.varlen() && p.options.validate)
    return "options.validate with packed batches (options.cu_seqlens_q/k): the GPU metadata "
           "check does not read cu_seqlens yet (the CPU reference checks them)";
  return unsupported(p, &portable::bsa_backward_unsupported);
}

size_t bsa_bwd_workspace_bytes(const BsaBwdProblem& p) {
  DeviceScope scope(p.device_index);  // CUB sizes its scan for the current device
  return portable::bsa_backward_workspace_bytes(p);
}

void bsa_bwd_run(const BsaBwdProblem& p, const ExecContext& ctx) {
  DeviceScope scope(p.device_index);
  cudaStream_t stream = ctx.stream;
  if (p.options.validate) portable::check_bsa_metadata_gpu(p.dims, p.meta, stream);
  portable::bsa_backward(p, ctx.workspace, ctx.workspace_bytes, stream);
}

// ---- DSA forward ------------------------------------------------------------------------------
std::string dsa_fwd_unsupported(const DsaFwdProblem& p) {
  return unsupported(p, &portable::dsa_forward_unsupported);
}

void dsa_fwd_run(const DsaFwdProblem& p, const ExecContext& ctx) {
  DeviceScope scope(p.device_index);
  portable::dsa_forward(p, ctx.stream);
}

// ---- DSA backward -----------------------------------------------------------------------------
std::string dsa_bwd_unsupported(const DsaBwdProblem& p) {
  return unsupported(p, &portable::dsa_backward_unsupported);
}

size_t dsa_bwd_workspace_bytes(const DsaBwdProblem& p) {
  DeviceScope scope(p.device_index);  // CUB sizes its sort for the current device
  return portable::dsa_backward_workspace_bytes(p);
}

void dsa_bwd_run(const DsaBwdProblem& p, const ExecContext& ctx) {
  DeviceScope scope(p.device_index);
  portable::dsa_backward(p, ctx.workspace, ctx.workspace_bytes, ctx.stream);
}

// ---- DSA indexer (SPEC 5) ----------------------------------------------------------------------
// Verified on an H100 on 2026-12-06 (46 GPU tests, *IndexerGpu*; compute-sanitizer memcheck and
// racecheck clean): AUTO serves CUDA indexer calls here (there is no Hopper indexer yet).
std::string indexer_scores_unsupported(const IndexerScoresProblem& p) {
  return unsupported(p, &portable::indexer_scores_unsupported);
}

void indexer_scores_run(const IndexerScoresProblem& p, const ExecContext& ctx) {
  DeviceScope scope(p.device_index);
  portable::indexer_scores(p, ctx.stream);
}

std::string indexer_topk_unsupported(const IndexerTopkProblem& p) {
  return unsupported(p, &portable::indexer_topk_unsupported);
}

size_t indexer_topk_workspace_bytes(const IndexerTopkProblem& p) {
  DeviceScope scope(p.device_index);  // the launch shape comes from the current device
  return portable::indexer_topk_workspace_bytes(p);
}

void indexer_topk_run(const IndexerTopkProblem& p, const ExecContext& ctx) {
  DeviceScope scope(p.device_index);
  portable::indexer_topk(p, ctx.workspace, ctx.workspace_bytes, ctx.stream);
}

std::string indexer_loss_unsupported(const IndexerLossProblem& p) {
  return unsupported(p, &portable::indexer_loss_unsupported);
}

size_t indexer_loss_workspace_bytes(const IndexerLossProblem& p) {
  DeviceScope scope(p.device_index);  // CUB sizes deterministic mode's sort for the current device
  return portable::indexer_loss_workspace_bytes(p);
}

void indexer_loss_run(const IndexerLossProblem& p, const ExecContext& ctx) {
  DeviceScope scope(p.device_index);
  portable::indexer_loss(p, ctx.workspace, ctx.workspace_bytes, ctx.stream);
}

}  // namespace

extern const Implementation kPortableImplementation = {
    SA_IMPL_PORTABLE,
    "portable",
    /*bsa_fwd=*/{&bsa_fwd_unsupported, nullptr, &bsa_fwd_run},
    /*bsa_bwd=*/{&bsa_bwd_unsupported, &bsa_bwd_workspace_bytes, &bsa_bwd_run},
    /*dsa_fwd=*/{&dsa_fwd_unsupported, nullptr, &dsa_fwd_run},
    /*dsa_bwd=*/{&dsa_bwd_unsupported, &dsa_bwd_workspace_bytes, &dsa_bwd_run},
    /*indexer_scores=*/{&indexer_scores_unsupported, nullptr, &indexer_scores_run},
    /*indexer_topk=*/{&indexer_topk_unsupported, &indexer_topk_workspace_bytes, &indexer_topk_run},
    /*indexer_loss=*/{&indexer_loss_unsupported, &indexer_loss_workspace_bytes, &indexer_loss_run},
};

}  // namespace sa
