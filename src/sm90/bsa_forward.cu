// Hopper BSA forward, host side: problem checks, TMA descriptors, launch configuration and the
// instantiations of the kernel in bsa_forward_kernel.cuh: {block 64, 128} x {D 64, 128} x
// {bf16, fp16}, plus the split-KV mode's four bf16 ones (chosen automatically when the query
// blocks cannot fill the GPU; see forward_splits), plus the token mask's eight (the same axes,
// FwdTraits::kMasked; dense batches, no split-KV), plus the packed batches' eight (the same axes,
// FwdTraits::kVarlen, on the masked kernel's filtered walk; with or without a mask, no split-KV).
// The masked and packed kernels take their tiles from a counter in the workspace where it has room
// (dynamic tiles, each head's last query block first; see tile_counter below); the others in the
// static order.
#include "sm90/bsa_forward.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "common/cuda_check.hpp"
#include "common/cuda_device.hpp"
#include "common/host_numeric.hpp"
#include "common/narrow.hpp"
#include "common/tuning.hpp"
#include "cuda/bsa_forward_combine.hpp"
#include "cuda/launch_checks.hpp"
#include "sm90/bsa_forward_kernel.cuh"
#include "sm90/tma_descriptor.hpp"

namespace sa::sm90 {
namespace {

template <int kBlock, int kHeadDim, class Element, bool kSplit = false, bool kMasked = false,
          bool kVarlen = false>
void launch(const BsaFwdSm90Params& params, cudaStream_t stream) {
  using Traits = FwdTraits<kBlock, kHeadDim, Element, kSplit, kMasked, kVarlen>;
  // +1024: the kernel aligns its shared storage to 1024 bytes (128-byte swizzle atoms).
  constexpr size_t kSmem = sizeof(SharedStorage<Traits>) + 1024;
  static_assert(kSmem <= 227 * 1024, "shared storage exceeds an sm_90 block's opt-in maximum");
  auto* kernel = &bsa_forward_sm90_kernel<Traits>;
  int device = 0;
  SA_CUDA_CHECK(cudaGetDevice(&device));
  const int sms = sm_count(device);
  // Every launch (cheap, and right for whichever device is current).
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kSmem)));
  // Up to ~200 KB per CTA: ask for the largest shared-memory carveout.
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared));
  const int64_t ctas = std::min<int64_t>(params.num_tiles, int64_t{sms} * Traits::kCtasPerSm);
  kernel<<<static_cast<unsigned>(ctas), Traits::kThreads, kSmem, stream>>>(params);
  SA_CUDA_CHECK_LAUNCH();
}

template <class Element, bool kSplit = false, bool kMasked = false, bool kVarlen = false>
void launch_for(const BsaDims& d, const BsaFwdSm90Params& params, cudaStream_t stream) {
  if (d.block == 128) {
    if (d.D == 128)
      launch<128, 128, Element, kSplit, kMasked, kVarlen>(params, stream);
    else
      launch<128, 64, Element, kSplit, kMasked, kVarlen>(params, stream);
  } else {
    if (d.D == 128)
      launch<64, 128, Element, kSplit, kMasked, kVarlen>(params, stream);
    else
      launch<64, 64, Element, kSplit, kMasked, kVarlen>(params, stream);
  }
}

constexpr int kMaxSplits = 16;

// The automatic split-KV rule: split only when the query blocks cannot fill the GPU (fewer work
// tiles than CTA slots), into as many slices as keep the split tiles within one wave
// (floor(slots / tiles): one slice more would start a second, mostly idle wave), and only rows
// long enough to share (at least 4 KV blocks per slice, by the row capacity K_max: the counts
// live on the device). Measured (bench/notes-archive, session 10): B1 H1 S4096 block 128 at 50%
// (32 tiles of 16 blocks) runs 1.58x faster with 4 slices, 1.32x with 2.
int auto_splits(const BsaFwdProblem& p) {
  const BsaDims& d = p.dims;
  const int64_t tiles = d.B * d.Hq * d.Nq;
  const int64_t slots = sm_count(p.device_index);  // one CTA per SM (both block sizes)
  if (tiles <= 0 || tiles >= slots) return 1;
  const int64_t by_tiles = slots / tiles;
  // The longest row: K_max, or the fixed count when there is no per-row count tensor.
  const int64_t longest = p.meta.q2k_count.data != nullptr
                              ? d.Kmax
                              : std::min<int64_t>(d.Kmax, p.meta.fixed_count);
  const int64_t by_length = std::max<int64_t>(1, longest / 4);
  return static_cast<int>(std::min<int64_t>({by_tiles, by_length, kMaxSplits}));
}

// How many slices of each row's block list the forward runs as separate tiles (1: no split-KV).
// bf16 dense batches without a token mask only (its instantiations). The rule above, unless the
// internal tuning (Tuning::sm90_fwd_splits, set by the bench and tests only) names a count in
// [1, 16].
int forward_splits(const BsaFwdProblem& p) {
  if (p.dtype != SA_DTYPE_BF16 || p.meta.mask.on || p.meta.varlen()) return 1;
  const int32_t forced = detail::tuning().sm90_fwd_splits;
  const int n = forced <= 0 ? auto_splits(p) : forced;
  return std::clamp(n, 1, kMaxSplits);
}

size_t split_workspace_bytes(const BsaDims& d, int splits) {
  if (splits <= 1) return 0;
  const size_t rows = static_cast<size_t>(splits) * d.B * d.Hq * d.Sq;
  // o_part, then lse_part, each 256-byte aligned (the caller's pointer need not be).
  return rows * (d.D + 1) * sizeof(float) + 2 * 256;
}

// Dynamic tiles (FwdTraits::kDynamicTiles, bsa_forward_kernel.cuh): the masked and packed kernels,
// whose rows differ in length (causal lists grow with the query block), take each CTA's tiles
// after its first from a counter, query blocks in descending order (under a causal list, the
// longest rows first), instead of the static round robin. Those calls never split
// (forward_splits is 1 for them), so the counter sits alone at the workspace's first 4-byte
// boundary; it is placed after the split-KV partials anyway, which it then cannot overlap.
bool wants_tile_counter(const BsaFwdProblem& p) { return p.meta.mask.on || p.meta.varlen(); }
constexpr size_t kTileCounterBytes = 256;  // one uint32_t, padded to an allocation granule

size_t tile_counter_offset(const BsaFwdProblem& p) {
  return split_workspace_bytes(p.dims, forward_splits(p));
}

// The counter of a masked or packed call, or null: the static order. Tuning::sm90_fwd_dyn (set by
// the bench and tests only): 0 the rule (dynamic at block 128 where the workspace holds the
// counter, static at block 64), 1 static, 2 dynamic, an error where the workspace lacks room. A
// null or short workspace is not an error under the rule: the C ABI passes none when the caller
// gave neither workspace nor allocator. The rule, measured on an H100 (session 47, causal MoBA,
// B1 H32 S8192 D128, against the static order of the same build): block 128 dynamic +4.9%, block
// 64 dynamic -2.5% (the L2-bound block-64 kernel loses more to the claim than the balance gives;
// docs/decisions/sm90_bsa_forward.md, "Session 47").
uint32_t* tile_counter(const BsaFwdProblem& p, void* workspace, size_t workspace_bytes) {
  const int32_t mode = detail::tuning().sm90_fwd_dyn;
  if (!wants_tile_counter(p) || mode == 1 || (mode == 0 && p.dims.block == 64)) return nullptr;
  const uintptr_t base = reinterpret_cast<uintptr_t>(workspace);
  const uintptr_t at = (base + tile_counter_offset(p) + 3) & ~uintptr_t{3};
  const bool fits = workspace != nullptr && at + sizeof(uint32_t) <= base + workspace_bytes;
  SA_CHECK(fits || mode != 2, SA_ERROR_WORKSPACE,
           "sm90 bsa_forward: dynamic tiles (tuning 2) need " << bsa_forward_workspace_bytes(p)
                                                              << " bytes of workspace, got "
                                                              << workspace_bytes);
  return fits ? reinterpret_cast<uint32_t*>(at) : nullptr;
}

}  // namespace

std::string bsa_forward_unsupported(const BsaFwdProblem& p) {
  const BsaDims& d = p.dims;
  std::ostringstream os;
  if (p.dtype != SA_DTYPE_BF16 && p.dtype != SA_DTYPE_FP16) {
    os << "dtype " << dtype_name(p.dtype) << " (sm90 forward supports bf16, fp16)";
    return os.str();
  }
  if (d.D != d.Dv || (d.D != 64 && d.D != 128)) {
    os << "D = " << d.D << ", D_v = " << d.Dv << " (sm90 forward supports D == D_v in {64, 128})";
    return os.str();
  }
  if (d.block != 64 && d.block != 128) {
    os << "block size " << d.block << " (sm90 forward supports 64 and 128)";
    return os.str();
  }
  constexpr int64_t kMaxSeq = std::numeric_limits<int32_t>::max() - 256;
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  if (d.Sq > kMaxSeq || d.Skv > kMaxSeq) {
    os << "S_q = " << d.Sq << ", S_kv = " << d.Skv << " (sm90 forward supports at most " << kMaxSeq
       << ")";
    return os.str();
  }
  // Packed batches: N_q_max is the metadata's own dim; a query block's first row (m * block, int32
  // in the kernel) must not wrap.
  if (p.meta.varlen() && d.Nq > kMaxSeq / d.block) {
    os << "N_q_max = " << d.Nq << " (sm90 forward supports N_q_max * block_size <= " << kMaxSeq
       << ")";
    return os.str();
  }
  if (d.B > kMaxInt || d.Hq > kMaxInt || d.B * d.Hq * d.Nq > kMaxInt) {
    os << "B * H_q * N_q = " << d.B * d.Hq * d.Nq << " work tiles (sm90 forward supports at most "
       << kMaxInt << ")";
    return os.str();
  }
  // Packed batches: [T, H, D] tensors (sb = 0), described as one batch entry of T tokens.
  const int64_t tensor_b = p.meta.varlen() ? 1 : d.B;
  for (std::string why : {check_tma_tensor("q", p.q, tensor_b, d.Hq, d.Sq),
                          check_tma_tensor("k", p.k, tensor_b, d.Hkv, d.Skv),
                          check_tma_tensor("v", p.v, tensor_b, d.Hkv, d.Skv)}) {
    if (!why.empty()) return why;
  }
  const std::string o = portable::check_tensor_addressing("o", p.o, tensor_b, d.Hq, d.Sq);
  if (!o.empty()) return o;
  if (p.lse == nullptr) return "lse is missing";
  return "";
}

size_t bsa_forward_workspace_bytes(const BsaFwdProblem& p) {
  return split_workspace_bytes(p.dims, forward_splits(p)) +
         (wants_tile_counter(p) ? kTileCounterBytes : 0);
}

bool bsa_forward_workspace_optional(const BsaFwdProblem& p) { return forward_splits(p) <= 1; }

void bsa_forward(const BsaFwdProblem& p, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream) {
  const std::string why = bsa_forward_unsupported(p);
  SA_CHECK(why.empty(), SA_ERROR_UNSUPPORTED, "sm90 bsa_forward: " << why);
  const BsaDims& d = p.dims;

  BsaFwdSm90Params params{};
  constexpr const char* kOp = "sm90 bsa_forward";
  // Packed batches: (D, T, H, 1), every sequence's rows at its offset along T (the kernel reads
  // the offsets on the device; the descriptors depend on shapes only, so a captured graph replays
  // with new cu_seqlens values).
  const bool packed = p.meta.varlen();
  const int64_t tensor_b = packed ? 1 : d.B;
  params.tma_q = make_tensor_map(kOp, "q", p.q, tensor_b, d.Hq, d.Sq, d.D, d.block, p.dtype);
  params.tma_k = make_tensor_map(kOp, "k", p.k, tensor_b, d.Hkv, d.Skv, d.D, d.block, p.dtype);
  params.tma_v = make_tensor_map(kOp, "v", p.v, tensor_b, d.Hkv, d.Skv, d.Dv, d.block, p.dtype);
  params.o = p.o;
  params.lse = p.lse;
  for (int i = 0; i < 3; ++i) params.lse_stride[i] = p.lse_stride[i];
  params.meta = p.meta;
  params.Sq = narrow_i32(d.Sq, "S_q");
  params.Skv = narrow_i32(d.Skv, "S_kv");
  params.Hq = narrow_i32(d.Hq, "H_q");
  params.Nq = narrow_i32(d.Nq, "N_q");
  params.group = narrow_i32(d.group(), "H_q / H_kv");
  params.num_tiles = narrow_i32(d.B * d.Hq * d.Nq, "B * H_q * N_q");
  params.scale_log2 = scale_times_log2e(p.scale);
  params.masked_score = params.scale_log2 > 0.f ? -INFINITY : INFINITY;
  // The band, clamped to [-S_q, S_kv] by validation: int32 (S_q, S_kv < 2^31 - 256 above).
  // Packed batches: each sequence's own, computed in the kernel (TileSeq: BsaMeta::mask_of).
  if (!packed) {
    params.mask_lo = narrow_i32(p.meta.mask.lo, "mask band lo");
    params.mask_hi = narrow_i32(p.meta.mask.hi, "mask band hi");
  }

  const int splits = forward_splits(p);
  if (splits > 1) {
    const size_t need = split_workspace_bytes(d, splits);
    SA_CHECK(workspace != nullptr && workspace_bytes >= need, SA_ERROR_WORKSPACE,
             kOp << ": split-KV needs " << need << " bytes of workspace, got " << workspace_bytes);
    const size_t rows = static_cast<size_t>(splits) * d.B * d.Hq * d.Sq;
    params.num_splits = splits;
    params.base_tiles = params.num_tiles;
    params.num_tiles = narrow_i32(d.B * d.Hq * d.Nq * splits, "B * H_q * N_q * splits");
    const uintptr_t o_at =
        (reinterpret_cast<uintptr_t>(workspace) + 255) & ~static_cast<uintptr_t>(255);
    params.o_part = reinterpret_cast<float*>(o_at);
    const uintptr_t lse_at = (reinterpret_cast<uintptr_t>(params.o_part + rows * d.D) + 255) &
                             ~static_cast<uintptr_t>(255);
    params.lse_part = reinterpret_cast<float*>(lse_at);
    params.o_part_dim = narrow_i32(d.D, "D");
    launch_for<cutlass::bfloat16_t, true>(d, params, stream);
    portable::BsaCombineArgs c{};
    c.o_part = params.o_part;
    c.lse_part = params.lse_part;
    c.splits = splits;
    c.B = narrow_i32(d.B, "B");
    c.Hq = params.Hq;
    c.Sq = params.Sq;
    c.D = params.o_part_dim;
    c.o = p.o;
    c.lse = p.lse;
    for (int i = 0; i < 3; ++i) c.lse_stride[i] = p.lse_stride[i];
    c.dtype = p.dtype;
    portable::bsa_forward_combine(c, stream);
    return;
  }
  // Packed batches, with or without a mask, run their own instantiations (FwdTraits::kVarlen, on
  // the masked kernel's walk); a token mask on a dense batch its own (FwdTraits::kMasked); the
  // default ones have no mask or sequence code. The first two take dynamic tiles where the
  // workspace holds the counter, zeroed here in stream order (a memset node under graph capture).
  params.tile_counter = tile_counter(p, workspace, workspace_bytes);
  if (params.tile_counter != nullptr)
    SA_CUDA_CHECK(cudaMemsetAsync(params.tile_counter, 0, sizeof(uint32_t), stream));
  if (packed) {
    if (p.dtype == SA_DTYPE_FP16)
      launch_for<cutlass::half_t, false, true, true>(d, params, stream);
    else
      launch_for<cutlass::bfloat16_t, false, true, true>(d, params, stream);
    return;
  }
  if (p.meta.mask.on) {
    if (p.dtype == SA_DTYPE_FP16)
      launch_for<cutlass::half_t, false, true>(d, params, stream);
    else
      launch_for<cutlass::bfloat16_t, false, true>(d, params, stream);
    return;
  }
  if (p.dtype == SA_DTYPE_FP16)
    launch_for<cutlass::half_t>(d, params, stream);
  else
    launch_for<cutlass::bfloat16_t>(d, params, stream);
}

}  // namespace sa::sm90
