// The Hopper indexer KL loss (SPEC 5): the shared driver (cuda/indexer_loss_driver.hpp: plan,
// loss kernel, deterministic mode, dense slices) with the wgmma attention target of
// indexer_target_rs_kernel.cuh (Q in registers, RS; the default: 1.07x the SS kernel on an H100,
// session 35), or with the internal tuning sm90_indexer_target = 3 of indexer_target_kernel.cuh
// (Q in shared memory, SS); one CTA per (token, pair of 64-head groups), D_qk 512 or 576. The loss
// kernel (the driver's step 3) is the wgmma one (indexer_loss_kernel.cuh: sparse and dense mode,
// not deterministic, H_I 16 / 32 / 64, its shared memory within 227 KB; the pipelined kernels of
// indexer_loss_pipe_kernel.cuh: dense mode's pair kernel, two tokens per CTA, and sparse mode's
// one-token kernel), injected as the driver's LossLaunch; the driver launches the portable kernel
// where it declines and under the internal tuning sm90_indexer_loss_kernel = 3.
#include <algorithm>
#include <cstdint>
#include <string>

#include "common/cuda_check.hpp"
#include "common/tuning.hpp"
#include "cuda/indexer_loss_driver.hpp"
#include "sm90/indexer.hpp"
#include "sm90/indexer_loss_kernel.cuh"
#include "sm90/indexer_loss_pipe_kernel.cuh"
#include "sm90/indexer_target_kernel.cuh"
#include "sm90/indexer_target_rs_kernel.cuh"

namespace sa::sm90 {
namespace {

using portable::indexer::LossParams;
using portable::indexer::TargetParams;
using indexer::TargetRsTraits;
using indexer::TargetTraits;

// Opt-in shared memory limit of sm_90 (227 KB).
constexpr size_t kMaxSmemSm90 = 232448;
constexpr size_t kSmem576 = indexer::target_smem_bytes<TargetTraits<576>>();
constexpr size_t kSmem512 = indexer::target_smem_bytes<TargetTraits<512>>();
static_assert(kSmem576 <= kMaxSmemSm90, "sm90 indexer target exceeds 227 KB of smem");
static_assert(kSmem512 <= kMaxSmemSm90, "sm90 indexer target exceeds 227 KB of smem");
constexpr size_t kSmemRs576 = indexer::target_rs_smem_bytes<TargetRsTraits<576>>();
constexpr size_t kSmemRs512 = indexer::target_rs_smem_bytes<TargetRsTraits<512>>();
static_assert(kSmemRs576 <= kMaxSmemSm90, "sm90 indexer target (RS) exceeds 227 KB of smem");
static_assert(kSmemRs512 <= kMaxSmemSm90, "sm90 indexer target (RS) exceeds 227 KB of smem");

template <class Kernel>
void launch_kernel(Kernel* kernel, size_t smem, int threads, const TargetParams& prm, int64_t grid,
                   cudaStream_t stream) {
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(grid), threads, smem, stream>>>(prm);
  SA_CUDA_CHECK_LAUNCH();
}

template <int kDqk, bool kDense>
void launch_variant(const TargetParams& prm, int64_t grid, cudaStream_t stream) {
  if (detail::tuning().sm90_indexer_target != 3) {
    using T = TargetRsTraits<kDqk>;
    launch_kernel(&indexer::target_rs_sm90_kernel<T, kDense>, indexer::target_rs_smem_bytes<T>(),
                  T::kThreads, prm, grid, stream);
  } else {
    using T = TargetTraits<kDqk>;
    launch_kernel(&indexer::target_sm90_kernel<T, kDense>, indexer::target_smem_bytes<T>(),
                  T::kThreads, prm, grid, stream);
  }
}

// portable::indexer::TargetLaunch: one CTA per (token, pair of head groups).
void launch_target(const TargetParams& prm, bool dense, int64_t tokens, int /*device*/,
                   cudaStream_t stream) {
  const int64_t pairs = (prm.head_groups + 1) / 2;
  const int64_t grid = tokens * pairs;
  if (grid == 0) return;
  if (prm.qk_chunks == 72) {
    if (dense)
      launch_variant<576, true>(prm, grid, stream);
    else
      launch_variant<576, false>(prm, grid, stream);
  } else {
    if (dense)
      launch_variant<512, true>(prm, grid, stream);
    else
      launch_variant<512, false>(prm, grid, stream);
  }
}

template <int kHeads, bool kDense>
void launch_loss_for(const LossParams& prm, int64_t tokens, cudaStream_t stream) {
  using T = loss::LossTraits<kHeads>;
  auto* kernel = &loss::loss_sm90_kernel<T, kDense>;
  const int smem = kDense ? T::dense_smem_bytes(prm.head_groups) : T::smem_bytes(prm.topk);
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<static_cast<unsigned>(tokens), T::kThreads, smem, stream>>>(prm);
  SA_CUDA_CHECK_LAUNCH();
}

// Dense mode, two tokens per CTA (the pair kernel and the pipelined one): one CTA per two tokens
// of [tok_begin, tok_begin + tokens); the token past the last is absent.
template <class Kernel>
void launch_two_token(Kernel* kernel, int smem, int threads, const LossParams& prm,
                      int64_t tokens, cudaStream_t stream) {
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  LossParams q = prm;
  q.tok_end = prm.tok_begin + tokens;
  kernel<<<static_cast<unsigned>((tokens + 1) / 2), threads, smem, stream>>>(q);
  SA_CUDA_CHECK_LAUNCH();
}

// loss_sm90_pair_kernel.
template <int kHeads>
void launch_loss_pair_for(const LossParams& prm, int64_t tokens, cudaStream_t stream) {
  using T = loss::LossTraits<kHeads>;
  using P = loss::PairTraits<T>;
  launch_two_token(&loss::loss_sm90_pair_kernel<T>, P::smem_bytes(prm.head_groups),
                   2 * T::kThreads, prm, tokens, stream);
}

// loss_sm90_pipe_kernel.
template <int kHeads>
void launch_loss_pipe_for(const LossParams& prm, int64_t tokens, cudaStream_t stream) {
  using T = loss::LossTraits<kHeads>;
  using L = loss::PipeTraits<T>;
  launch_two_token(&loss::loss_sm90_pipe_kernel<T>, L::smem_bytes(prm.head_groups), L::kThreads,
                   prm, tokens, stream);
}

// loss_sm90_sparse_pipe_kernel: one CTA per token.
template <int kHeads>
void launch_loss_sparse_pipe_for(const LossParams& prm, int64_t tokens, cudaStream_t stream) {
  using T = loss::LossTraits<kHeads>;
  using L = loss::SparsePipeTraits<T>;
  auto* kernel = &loss::loss_sm90_sparse_pipe_kernel<T>;
  const int smem = L::smem_bytes(prm.topk);
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<static_cast<unsigned>(tokens), L::kThreads, smem, stream>>>(prm);
  SA_CUDA_CHECK_LAUNCH();
}

// mode: 0 sparse, 1 dense, 2 dense with two tokens per CTA, 3 the same pipelined, 4 sparse
// pipelined.
template <int kHeads>
size_t loss_smem_bytes(int mode, int topk, int groups) {
  using T = loss::LossTraits<kHeads>;
  const int bytes = mode == 0   ? T::smem_bytes(topk)
                    : mode == 1 ? T::dense_smem_bytes(groups)
                    : mode == 2 ? loss::PairTraits<T>::smem_bytes(groups)
                    : mode == 3 ? loss::PipeTraits<T>::smem_bytes(groups)
                                : loss::SparsePipeTraits<T>::smem_bytes(topk);
  return static_cast<size_t>(bytes);
}

// loss_smem_bytes for H_I `heads` (16, 32 or 64).
size_t loss_smem_for(int64_t heads, int mode, int topk, int groups) {
  switch (heads) {
    case 16:
      return loss_smem_bytes<16>(mode, topk, groups);
    case 32:
      return loss_smem_bytes<32>(mode, topk, groups);
    default:
      return loss_smem_bytes<64>(mode, topk, groups);
  }
}

// Whether the wgmma loss kernel of `mode` (as loss_smem_bytes) serves a non-deterministic call of
// H_I `heads` (the tuning aside): sparse with `topk` slots per row, or dense with `groups` head
// groups of log A; its shared memory within 227 KB (sparse: topk <= ~10,700 one token per CTA,
// ~12,000 pipelined, both beyond the driver's 8,192; dense at H_I 64: groups <= ~330, with two
// tokens per CTA ~110, pipelined 9: its six log A_g stages).
bool loss_kernel_serves(int64_t heads, int mode, int topk, int groups) {
  if (heads != 16 && heads != 32 && heads != 64) return false;
  if (mode == 0 || mode == 4 ? topk <= 0 : groups <= 0) return false;
  return loss_smem_for(heads, mode, topk, groups) <= kMaxSmemSm90;
}

// Whether two CTAs of the wgmma loss kernel of `mode` fit one SM's shared memory (228 KB, 1 KB
// of it reserved per CTA).
bool two_ctas_per_sm(int64_t heads, int mode, int topk, int groups) {
  return loss_kernel_serves(heads, mode, topk, groups) &&
         2 * (loss_smem_for(heads, mode, topk, groups) + 1024) <= size_t{233472};
}

// kMode: as loss_smem_bytes's mode.
template <int kMode, int kHeads>
void launch_loss_heads(const LossParams& prm, int64_t tokens, cudaStream_t stream) {
  if constexpr (kMode == 4)
    launch_loss_sparse_pipe_for<kHeads>(prm, tokens, stream);
  else if constexpr (kMode == 3)
    launch_loss_pipe_for<kHeads>(prm, tokens, stream);
  else if constexpr (kMode == 2)
    launch_loss_pair_for<kHeads>(prm, tokens, stream);
  else
    launch_loss_for<kHeads, kMode == 1>(prm, tokens, stream);
}

template <int kMode>
void launch_loss_mode(const LossParams& prm, int64_t heads, int64_t tokens, cudaStream_t stream) {
  switch (heads) {
    case 16:
      launch_loss_heads<kMode, 16>(prm, tokens, stream);
      break;
    case 32:
      launch_loss_heads<kMode, 32>(prm, tokens, stream);
      break;
    default:
      launch_loss_heads<kMode, 64>(prm, tokens, stream);
      break;
  }
}

// portable::indexer::LossLaunch: the wgmma loss kernel (tuning sm90_indexer_loss_kernel 0 / 4:
// the pipelined kernels, dense mode's pair kernel and sparse mode's one-token kernel, or where
// their shared memory does not fit the pair kernel / the one-token kernel; 2: dense mode with two
// tokens per CTA; 1: one token per CTA; sparse mode under 1 and 2 is the unpipelined one-token
// kernel) where it serves the call (sparse or dense, not deterministic); false (nothing
// launched: the driver's portable kernel) elsewhere and under tuning 3.
bool launch_loss(const LossParams& prm, bool dense, int64_t heads, int64_t tokens,
                 cudaStream_t stream) {
  int32_t kernel = detail::tuning().sm90_indexer_loss_kernel;
  if (kernel == 0) kernel = 4;
  if (kernel != 1 && kernel != 2 && kernel != 4) return false;
  int mode = !dense ? (kernel == 4 ? 4 : 0) : kernel == 4 ? 3 : kernel;
  // The pipelined dense kernel's six log A_g stages hold fewer head groups: the pair kernel
  // beyond.
  if (mode == 3 && !loss_kernel_serves(heads, mode, prm.topk, prm.head_groups)) mode = 2;
  // The pipelined sparse kernel (measured at topk 2048, two CTAs per SM) keeps two CTAs per SM up
  // to topk ~2,300 at H_I 64 (~3,800 at 32), the one-token kernel up to ~3,400 (~4,200): between
  // the two the one-token kernel serves (not measured either way there).
  if (mode == 4 && !two_ctas_per_sm(heads, 4, prm.topk, prm.head_groups) &&
      two_ctas_per_sm(heads, 0, prm.topk, prm.head_groups))
    mode = 0;
  if (prm.dk_part != nullptr || !loss_kernel_serves(heads, mode, prm.topk, prm.head_groups))
    return false;
  if (tokens == 0) return true;
  if (mode == 0)
    launch_loss_mode<0>(prm, heads, tokens, stream);
  else if (mode == 1)
    launch_loss_mode<1>(prm, heads, tokens, stream);
  else if (mode == 2)
    launch_loss_mode<2>(prm, heads, tokens, stream);
  else if (mode == 3)
    launch_loss_mode<3>(prm, heads, tokens, stream);
  else
    launch_loss_mode<4>(prm, heads, tokens, stream);
  return true;
}

portable::indexer::LossDriverOptions driver_options() {
  portable::indexer::LossDriverOptions o;
  o.target = &launch_target;
  o.loss = &launch_loss;
  o.loss_columns = portable::dsa_bwd::AccColumns::kQuad16;  // reduce_dk_rows
  o.target_smem_bytes = static_cast<int>(
      std::max(std::max(kSmem576, kSmem512), std::max(kSmemRs576, kSmemRs512)));
  o.path = "sm90 indexer loss";
  return o;
}

}  // namespace

std::string indexer_loss_unsupported(const IndexerLossProblem& p) {
  return portable::indexer::loss_unsupported(p, driver_options());
}

size_t indexer_loss_workspace_bytes(const IndexerLossProblem& p) {
  return portable::indexer::loss_workspace_bytes(p);
}

void indexer_loss(const IndexerLossProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream) {
  portable::indexer::loss_run(p, workspace, workspace_bytes, driver_options(), stream);
}

}  // namespace sa::sm90
