// Hopper BSA backward, host side: problem checks, the kernel policy (CTA slots, tail order, TMA
// descriptors, the launches) and the instantiations of bsa_backward_kernel.cuh:
// {block 64, 128} x {D 64, 128}, bf16, and the same four with the token mask (BwdTraits::kMask;
// dense batches). Packed batches run the kVarlen kernels of bsa_backward_varlen.cu. The steps around them are the driver's
// (cuda/bsa_backward_driver.hpp); Hopper-specific are step 3, the main kernel, and the dQ
// conversion launched beside it (bsa_dq_convert.hpp).
#include "sm90/bsa_backward.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "common/cuda_check.hpp"
#include "common/cuda_device.hpp"
#include "common/host_numeric.hpp"
#include "common/narrow.hpp"
#include "common/tuning.hpp"
#include "cuda/bsa_backward_driver.hpp"
#include "cuda/bsa_backward_plan.hpp"
#include "cuda/bsa_packed_rows.hpp"
#include "cuda/launch_checks.hpp"
#include "cuda/reverse_map_gpu.hpp"
#include "sm90/bsa_backward_kernel.cuh"
#include "sm90/bsa_backward_launch.cuh"
#include "sm90/bsa_dq_convert.hpp"
#include "sm90/tma_descriptor.hpp"

namespace sa::sm90 {
namespace {

// ---- the instantiations (bsa_backward_launch.cuh; the tuning variants: bsa_backward_tuned.cu) --
using bwd_launch::Kernel;

// The same for a masked call: the mask adds no shared storage. Packed batches: the kVarlen kernel
// (its CTA's sequence words and landing barrier).
size_t main_kernel_smem(int block, int64_t D, bool packed) {
  if (packed) {
    constexpr int k128 = bwd_launch::varlen_tune(128), k64 = bwd_launch::varlen_tune(64);
    if (block == 128)
      return D == 128 ? Kernel<128, 128, true, k128, true>::kSmem
                      : Kernel<128, 64, true, k128, true>::kSmem;
    return D == 128 ? Kernel<64, 128, true, k64, true>::kSmem : Kernel<64, 64, true, k64, true>::kSmem;
  }
  if (block == 128)
    return D == 128 ? Kernel<128, 128, false, 0>::kSmem : Kernel<128, 64, false, 0>::kSmem;
  return D == 128 ? Kernel<64, 128, false, 0>::kSmem : Kernel<64, 64, false, 0>::kSmem;
}
// The variants add at most the loader's ring (about 2 KB) and must fit where the default does.
static_assert(Kernel<128, 128, true, bwd::kTuneStatsWarp | bwd::kTuneFullBlocks>::kSmem <=
                  227 * 1024 &&
              Kernel<64, 128, true, bwd::kTuneStatsWarp | bwd::kTuneFullBlocks>::kSmem <=
                  113 * 1024);

// The main kernel's variant bits (bsa_backward_kernel.cuh, kTune*) of this call: 0 (the default
// kernel) unless the internal tuning (Tuning::sm90_bsa_bwd_stats / sm90_bsa_bwd_full, set by the
// bench and tests only) asks for a variant. The full-block path only where every KV block of the
// call is known to be full on the host: no kv_block_len tensor (its values are on the device) and
// S_kv a multiple of the block; elsewhere the call runs the general kernel.
// Packed batches: the rule's kernel always (bwd_launch::varlen_tune; never the full-block path,
// whose test would read T_kv, not the sequences' lengths).
int main_kernel_variant(const BsaBwdProblem& p) {
  if (p.meta.varlen()) return bwd_launch::varlen_tune(static_cast<int>(p.dims.block));
  const detail::Tuning& t = detail::tuning();
  int tune = 0;
  const bool rule = p.dims.block == 128;  // the default: both at block 128 (Tuning)
  if (t.sm90_bsa_bwd_stats < 0 ? rule : t.sm90_bsa_bwd_stats != 0) tune |= bwd::kTuneStatsWarp;
  const bool full = t.sm90_bsa_bwd_full < 0 ? rule : t.sm90_bsa_bwd_full != 0;
  if (full && p.meta.kv_block_len.data == nullptr && p.dims.Skv % p.dims.block == 0)
    tune |= bwd::kTuneFullBlocks;
  return tune;
}

// ---- the policy (cuda/bsa_backward_driver.hpp) --------------------------------------------------
// Main-kernel CTAs resident on the whole GPU: 1 per SM at block 128, 2 at block 64.
int64_t cta_slots(const BsaBwdProblem& p) {
  return static_cast<int64_t>(sm_count(p.device_index)) * (p.dims.block == 128 ? 1 : 2);
}

// How many of the last work items the reverse map orders longest first (its step 6): the last
// two waves' worth. With items of uneven length (a reverse row's length varies with the pattern)
// the SMs then run out of work closer together. The internal tuning (Tuning::sm90_bwd_tail, set
// by the bench and tests only) can name another count (0: launch order = item order).
int32_t tail_items(const BsaBwdProblem& p) {
  const int32_t forced = detail::tuning().sm90_bwd_tail;
  const int64_t n = forced >= 0 ? forced : 2 * cta_slots(p);
  return static_cast<int32_t>(std::clamp<int64_t>(n, 0, portable::kMaxTailItems));
}

// Step 3 of the backward (bsa_bwd::MainKernelLaunch): dK, dV, and dQ into its
// accumulator (none in deterministic mode: the kernel then skips dQ), and dq converted beside it.
bool launch_main_kernel(const BsaBwdProblem& p, const portable::BsaBwdPlan& plan,
                        const portable::BsaBwdBuffers& buf, const portable::ReverseMapDevice& map,
                        cudaStream_t stream) {
  const BsaDims& d = p.dims;
  BsaBwdSm90Params params{};
  constexpr const char* kOp = "sm90 bsa_backward";
  // Packed batches: (D, T, H, 1), every sequence's rows at its offset along T (the kernel reads
  // the offsets on the device; the descriptors depend on shapes only, so a captured graph replays
  // with new cu_seqlens values).
  const bool packed = p.meta.varlen();
  const int64_t tb = packed ? 1 : d.B;
  params.tma_q = make_tensor_map(kOp, "q", p.q, tb, d.Hq, d.Sq, d.D, 64);
  params.tma_do = make_tensor_map(kOp, "dout", p.dout, tb, d.Hq, d.Sq, d.D, 64);
  params.tma_k = make_tensor_map(kOp, "k", p.k, tb, d.Hkv, d.Skv, d.D, d.block);
  params.tma_v = make_tensor_map(kOp, "v", p.v, tb, d.Hkv, d.Skv, d.Dv, d.block);
  params.tma_dk = make_tensor_map(kOp, "dk", p.dk, tb, d.Hkv, d.Skv, d.D, 64);
  params.tma_dv = make_tensor_map(kOp, "dv", p.dv, tb, d.Hkv, d.Skv, d.Dv, 64);
  params.dk = p.dk;
  params.dv = p.dv;
  portable::fill_bsa_bwd_common_params(params, p, plan, buf);
  portable::fill_bsa_bwd_map_params(params, map);
  params.item_order = map.item_order;  // the last waves' launch order (map step 6)
  params.tail_items = map.tail_items;
  params.dq_ready = buf.dq_ready;
  // The token mask's band, clamped to [-S_q, S_kv] by validation (int32: S_q, S_kv < 2^31 - 256,
  // bsa_backward_unsupported). A masked call runs the kMask instantiations; the others have no
  // mask code. Packed batches: each sequence's band comes from meta on the device.
  const bool masked = p.meta.mask.on;
  params.mask_lo = masked && !packed ? narrow_i32(p.meta.mask.lo, "mask band lo") : 0;
  params.mask_hi = masked && !packed ? narrow_i32(p.meta.mask.hi, "mask band hi") : 0;
  const int tune = main_kernel_variant(p);
  if (map.max_items > 0) {
    if (packed)
      bwd_launch::launch_varlen(params, d.block, d.D, map.max_items, stream);
    else if (tune != 0)
      bwd_launch::launch_tuned(params, d.block, d.D, masked, tune, map.max_items, stream);
    else if (masked)
      bwd_launch::dispatch<true, 0>(params, d.block, d.D, map.max_items, stream);
    else
      bwd_launch::dispatch<false, 0>(params, d.block, d.D, map.max_items, stream);
  }
  // The conversion beside the kernel waits for the kernel's dq_ready signals; without them (no
  // accumulator, no main kernel, or no SM count to size the grid) step 4 converts.
  const int sms = sm_count(p.device_index);
  if (buf.dq_accum == nullptr || map.max_items == 0 || sms <= 0) return false;
  DqConvertBeside c;
  c.dq_accum = buf.dq_accum;
  c.ready = buf.dq_ready;
  c.row_scan = map.row_scan;
  c.max_items = map.max_items;
  c.Sq_pad = plan.Sq_pad;
  c.signals_per_item = bwd::consumer_warpgroups(d.block);
  c.sm_count = sms;
  launch_dq_convert_beside(p, c, stream);
  return true;
}

// dq: the accumulator in the fragment-tile order of the bulk reduction (dq_tiled), or, in
// deterministic mode (no accumulator), the portable query-major kernel.
constexpr portable::bsa_bwd::KernelPolicy kPolicy = {
    "sm90 bsa_backward", /*dq_tiled=*/true, &cta_slots, &tail_items, &launch_main_kernel,
    &portable::bsa_bwd::query_major_dq};

}  // namespace

std::string bsa_backward_unsupported(const BsaBwdProblem& p) {
  const BsaDims& d = p.dims;
  std::ostringstream os;
  // Token masks: the reverse map drops the block pairs the mask hides entirely; the kernel
  // classifies each 64-row tile (bsa_backward_kernel.cuh, "Token masks"). Packed batches: the
  // kVarlen kernels, each work item's sequence read on the device.
  const bool packed = p.meta.varlen();
  if (p.dtype != SA_DTYPE_BF16) {
    os << "dtype " << dtype_name(p.dtype) << " (sm90 backward supports bf16)";
    return os.str();
  }
  if (d.D != d.Dv || (d.D != 64 && d.D != 128)) {
    os << "D = " << d.D << ", D_v = " << d.Dv << " (sm90 backward supports D == D_v in {64, 128})";
    return os.str();
  }
  if (d.block != 64 && d.block != 128) {
    os << "block size " << d.block << " (sm90 backward supports 64 and 128)";
    return os.str();
  }
  if (p.options.deterministic) {
    // The query-major dQ pass is the portable one: its limits apply too.
    const std::string why = portable::bsa_bwd::query_major_dq_unsupported(p);
    if (!why.empty()) return "deterministic mode: " + why;
  }
  constexpr int64_t kMaxSeq = std::numeric_limits<int32_t>::max() - 256;
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  if (d.Sq > kMaxSeq || d.Skv > kMaxSeq) {
    os << "S_q = " << d.Sq << ", S_kv = " << d.Skv << " (sm90 backward supports at most "
       << kMaxSeq << ")";
    return os.str();
  }
  // Packed batches: N_q_max is the metadata's own dim; a query block's first row (m * block, int32
  // in the kernel) must not wrap.
  if (packed && d.Nq > kMaxSeq / d.block) {
    os << "N_q_max = " << d.Nq << " (sm90 backward supports N_q_max * block_size <= " << kMaxSeq
       << ")";
    return os.str();
  }
  // Rows of the stats and dQ accumulator of all heads: B H_q N_q block dense, H_q Sq_pad packed
  // (cuda/bsa_packed_rows.hpp).
  const int64_t stat_rows =
      packed ? d.Hq * portable::packed_stat_rows(d.Sq, d.B, static_cast<int32_t>(d.block))
             : d.B * d.Hq * d.Nq * d.block;
  // The dQ conversion beside the kernel hands out B H_q (N_q block / 64) tiles by an int32 ticket
  // (packed: N_q_max block rows per sequence and head), with up to one grid of spare tickets.
  const int64_t dq_tiles = d.B * d.Hq * ((d.Nq * d.block + 63) / 64) + 4096;
  if (d.B > kMaxInt || d.Hq > kMaxInt || stat_rows > kMaxInt || d.B * d.Hkv * d.Nkv > kMaxInt ||
      dq_tiles > kMaxInt) {
    os << "B = " << d.B << ", H_q = " << d.Hq << ", S_q = " << d.Sq
       << " (sm90 backward indexes rows of all heads with int32)";
    return os.str();
  }
  // Packed batches: [T, H, D] tensors (sb = 0), described as one batch entry of T tokens.
  const int64_t tb = packed ? 1 : d.B;
  for (std::string why : {check_tma_tensor("q", p.q, tb, d.Hq, d.Sq),
                          check_tma_tensor("dout", p.dout, tb, d.Hq, d.Sq),
                          check_tma_tensor("k", p.k, tb, d.Hkv, d.Skv),
                          check_tma_tensor("v", p.v, tb, d.Hkv, d.Skv),
                          portable::check_tensor_addressing("o", p.o, tb, d.Hq, d.Sq),
                          portable::check_tensor_addressing("dq", p.dq, tb, d.Hq, d.Sq),
                          check_tma_tensor("dk", p.dk, tb, d.Hkv, d.Skv),
                          check_tma_tensor("dv", p.dv, tb, d.Hkv, d.Skv)}) {
    if (!why.empty()) return why;
  }
  if (p.lse == nullptr) return "lse is missing";
  const std::string smem =
      portable::smem_unsupported(p.device_index, main_kernel_smem(d.block, d.D, packed));
  if (!smem.empty()) {
    os << "block " << d.block << ", D = " << d.D << ": " << smem;
    return os.str();
  }
  return "";
}

size_t bsa_backward_workspace_bytes(const BsaBwdProblem& p) {
  return portable::bsa_bwd::workspace_bytes(p, kPolicy);
}

void bsa_backward(const BsaBwdProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream) {
  const std::string why = bsa_backward_unsupported(p);
  SA_CHECK(why.empty(), SA_ERROR_UNSUPPORTED, "sm90 bsa_backward: " << why);
  portable::bsa_bwd::run(p, workspace, workspace_bytes, stream, kPolicy);
}

}  // namespace sa::sm90
