// Hopper DSA forward, host side: support checks, kernel arguments, launch, and the six
// instantiations, bf16, D_qk in {512, 576} each: the 64-row kernel of dsa_forward_kernel.cuh (the
// seesaw schedule, dsa_forward_seesaw.cuh) for H 64 and 128 (H / 64 items per token) and H 8
// and 32 (one 64-row item per token, rows >= H padding); the transposed kernel of
// dsa_forward_small_h.cuh for H 16 (one item per token, the keys on wgmma's M side).
#include "sm90/dsa_forward.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "common/cuda_check.hpp"
#include "common/cuda_device.hpp"
#include "common/dsa_params.hpp"
#include "common/host_numeric.hpp"
#include "common/narrow.hpp"
#include "common/tuning.hpp"
#include "cuda/launch_checks.hpp"
#include "sm90/dsa_forward_kernel.cuh"
#include "sm90/dsa_forward_small_h.cuh"

namespace sa::sm90 {
namespace {

using dsa_fwd::DsaFwdSm90Params;
using dsa_fwd::DsaFwdTraits;
using dsa_fwd::SharedStorage;

// Opt-in shared memory limit of sm_90 (227 KB).
constexpr size_t kMaxSmemSm90 = 232448;

template <int kDqk>
constexpr size_t smem_bytes() {
  // +1024: the kernel aligns its shared storage to 1024 bytes (128-byte swizzle atoms).
  return sizeof(SharedStorage<DsaFwdTraits<kDqk>>) + 1024;
}
static_assert(smem_bytes<576>() <= kMaxSmemSm90, "sm90 DSA forward exceeds 227 KB of smem");
static_assert(smem_bytes<512>() <= kMaxSmemSm90, "sm90 DSA forward exceeds 227 KB of smem");

template <int kDqk, int kH>
constexpr size_t small_h_smem_bytes() {
  return sizeof(dsa_fwd::SmallHStorage<dsa_fwd::DsaFwdSmallHTraits<kDqk, kH>>) + 1024;
}
static_assert(small_h_smem_bytes<576, 16>() <= kMaxSmemSm90, "small-H DSA forward exceeds 227 KB");

// H 16: the transposed kernel (dsa_forward_small_h.cuh).
template <int kDqk, int kH>
void launch_small_h(const DsaFwdSm90Params& params, int64_t grid, cudaStream_t stream) {
  using Traits = dsa_fwd::DsaFwdSmallHTraits<kDqk, kH>;
  constexpr size_t kSmem = small_h_smem_bytes<kDqk, kH>();
  auto* kernel = &dsa_fwd::dsa_forward_small_h_kernel<Traits>;
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kSmem)));
  kernel<<<static_cast<unsigned>(grid), Traits::kThreads, kSmem, stream>>>(params);
  SA_CUDA_CHECK_LAUNCH();
}

template <int kDqk, bool kPadHeads>
void launch(const DsaFwdSm90Params& params, int64_t grid, cudaStream_t stream) {
  using Traits = DsaFwdTraits<kDqk, kPadHeads>;
  constexpr size_t kSmem = smem_bytes<kDqk>();
  auto* kernel = &dsa_fwd::dsa_forward_sm90_kernel<Traits>;
  // Every launch (cheap, and right for whichever device is current).
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kSmem)));
  kernel<<<static_cast<unsigned>(grid), Traits::kThreads, kSmem, stream>>>(params);
  SA_CUDA_CHECK_LAUNCH();
}

}  // namespace

std::string dsa_forward_unsupported(const DsaFwdProblem& p) {
  const DsaDims& d = p.dims;
  std::ostringstream os;
  if (p.device != SA_DEVICE_CUDA) return "needs CUDA tensors";
  if (p.dtype != SA_DTYPE_BF16) {
    os << "dtype " << dtype_name(p.dtype) << " (sm90 DSA forward supports bf16)";
    return os.str();
  }
  if (d.Dqk != 512 && d.Dqk != 576) {
    os << "D_qk = " << d.Dqk << " (sm90 DSA forward supports 512, 576)";
    return os.str();
  }
  if (d.Dv != 512) {
    os << "d_v = " << d.Dv << " (sm90 DSA forward supports 512)";
    return os.str();
  }
  if (d.H != 8 && d.H != 16 && d.H != 32 && d.H != 64 && d.H != 128) {
    os << "H = " << d.H << " (sm90 DSA forward supports 8, 16, 32, 64, 128)";
    return os.str();
  }
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  if (d.topk > kMaxInt - 64) {
    os << "topk = " << d.topk << " (sm90 DSA forward supports < 2^31 - 64)";
    return os.str();
  }
  if (d.Sq * std::max<int64_t>(1, d.H / 64) > kMaxInt) {
    os << "S_q = " << d.Sq << " (sm90 DSA forward supports S_q * H / 64 < 2^31)";
    return os.str();
  }
  const std::string layout = portable::dsa_forward_layout_unsupported(p, "sm90 DSA forward");
  if (!layout.empty()) return layout;
  if (p.lse == nullptr) return "lse is missing";
  return "";
}

namespace {
// With topk_length the items differ in length: persistent CTAs then take them from a counter.
bool wants_item_counter(const DsaFwdProblem& p) {
  return p.meta.topk_length.data != nullptr;
}
constexpr size_t kItemCounterBytes = 256;  // one uint32_t, padded to an allocation granule
}  // namespace

size_t dsa_forward_workspace_bytes(const DsaFwdProblem& p) {
  return wants_item_counter(p) ? kItemCounterBytes : 0;
}

void dsa_forward(const DsaFwdProblem& p, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream) {
  const std::string why = dsa_forward_unsupported(p);
  SA_CHECK(why.empty(), SA_ERROR_UNSUPPORTED, "sm90 dsa_forward: " << why);
  const DsaDims& d = p.dims;

  DsaFwdSm90Params prm{};
  fill_dsa_common_params(prm, p);
  // H 8, 16 or 32: one 64-row item per token, rows >= H padding. At H 8 the kv gathers are those
  // of any H, so the padding costs tensor work the gathers mostly hide, not bytes.
  const bool pad_heads = d.H < 64;
  prm.head_groups = pad_heads ? 1 : narrow_i32(d.H / 64, "H / 64");
  prm.heads = narrow_i32(d.H, "H");

  prm.items = d.Sq * prm.head_groups;
  if (prm.items == 0) return;
  // The seesaw kernels are persistent: one CTA per SM walks items b, b + grid, ...
  // when the items are equal (no topk_length). With topk_length (a static stride over items of
  // random lengths would leave the CTAs' sums far apart) the CTAs take their items after the first
  // from a counter in the workspace (zeroed here, in stream order); without that workspace, one
  // CTA per item, balanced by the hardware.
  // The counter at the workspace's first 4-byte boundary (the caller's pointer may be less
  // aligned; kItemCounterBytes leaves room).
  const uintptr_t base = reinterpret_cast<uintptr_t>(workspace);
  const uintptr_t counter = (base + 3) & ~uintptr_t{3};
  const bool dynamic = wants_item_counter(p) && workspace != nullptr &&
                       counter + sizeof(uint32_t) <= base + workspace_bytes;
  if (dynamic) {
    prm.item_counter = reinterpret_cast<uint32_t*>(counter);
    SA_CUDA_CHECK(cudaMemsetAsync(prm.item_counter, 0, sizeof(uint32_t), stream));
  }
  const bool persistent = p.meta.topk_length.data == nullptr || dynamic;
  const int64_t grid =
      persistent ? std::min<int64_t>(prm.items, std::max(1, sm_count(p.device_index)))
                 : prm.items;
  // H 16: the transposed kernel (1.15-1.17x the padded one; at H 32 it measured 0.90x, so H 32
  // stays padded: bench/notes-archive, session 21). The internal tuning
  // (Tuning::sm90_dsa_fwd_pad_h16, set by the bench and tests only) runs H 16 padded as well.
  if (d.H == 16 && !detail::tuning().sm90_dsa_fwd_pad_h16) {
    if (d.Dqk == 576)
      launch_small_h<576, 16>(prm, grid, stream);
    else
      launch_small_h<512, 16>(prm, grid, stream);
    return;
  }
  if (d.Dqk == 576) {
    if (pad_heads)
      launch<576, true>(prm, grid, stream);
    else
      launch<576, false>(prm, grid, stream);
  } else {
    if (pad_heads)
      launch<512, true>(prm, grid, stream);
    else
      launch<512, false>(prm, grid, stream);
  }
}

}  // namespace sa::sm90
