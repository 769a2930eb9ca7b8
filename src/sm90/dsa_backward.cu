// Hopper DSA backward, host side: support checks, workspace plan, the two instantiations of the
// kernel in dsa_backward_kernel.cuh (D_qk in {512, 576}; H 64 and 128 share them: H / 64 CTAs per
// token; bf16), and the portable passes around it.
//
//   1. memset of the fp32 dkv accumulator [S_kv, D_qk] (workspace)
//   2. the main kernel: dq written directly, dkv by red.global.add, d_sink terms [H, S_q]
//   3. dkv = accumulator -> bf16, d_sink = fixed-order sum of the terms  (portable passes)
//
// Deterministic mode is the portable backward's (AUTO falls back to it): here dkv order depends
// on the reductions' arrival.
#include "sm90/dsa_backward.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <sstream>

#include "common/cuda_check.hpp"
#include "common/cuda_device.hpp"
#include "common/error.hpp"
#include "common/host_numeric.hpp"
#include "common/narrow.hpp"
#include "portable/dsa_backward.hpp"
#include "portable/dsa_backward_aux.hpp"
#include "portable/dsa_backward_params.cuh"
#include "sm90/dsa_backward_kernel.cuh"

namespace sa::sm90 {
namespace {

using dsa_bwd::DsaBwdTraits;
using dsa_bwd::SharedStorage;

// Opt-in shared memory limit of sm_90 (227 KB).
constexpr size_t kMaxSmemSm90 = 232448;

template <int kDqk>
constexpr size_t smem_bytes() {
  // +1024: the kernel aligns its shared storage to 1024 bytes (128-byte swizzle atoms).
  return sizeof(SharedStorage<DsaBwdTraits<kDqk>>) + 1024;
}
static_assert(smem_bytes<576>() <= kMaxSmemSm90, "sm90 DSA backward exceeds 227 KB of smem");
static_assert(smem_bytes<512>() <= kMaxSmemSm90, "sm90 DSA backward exceeds 227 KB of smem");

template <int kDqk>
void launch(const dsa_bwd::Params& params, int64_t grid, cudaStream_t stream) {
  using Traits = DsaBwdTraits<kDqk>;
  constexpr size_t kSmem = smem_bytes<kDqk>();
  auto* kernel = &dsa_bwd::dsa_backward_sm90_kernel<Traits>;
  // Every launch (cheap, and right for whichever device is current).
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kSmem)));
  kernel<<<static_cast<unsigned>(grid), Traits::kThreads, kSmem, stream>>>(params);
  SA_CUDA_CHECK_LAUNCH();
}

// Workspace: the fp32 dkv accumulator, then the d_sink terms; byte offsets from the 256-aligned
// base.
struct Plan {
  size_t acc = 0, terms = 0, total = 0;
};

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

Plan make_plan(const DsaBwdProblem& p) {
  const DsaDims& d = p.dims;
  Plan plan;
  plan.acc = 0;
  plan.terms = round_up(static_cast<size_t>(d.Skv * d.Dqk) * 4, 256);
  const size_t terms_bytes = p.d_sink != nullptr ? static_cast<size_t>(d.H * d.Sq) * 4 : 0;
  plan.total = plan.terms + terms_bytes + 256;  // + the alignment slack of the base
  return plan;
}

}  // namespace

std::string dsa_backward_unsupported(const DsaBwdProblem& p) {
  const DsaDims& d = p.dims;
  std::ostringstream os;
  if (p.device != SA_DEVICE_CUDA) return "needs CUDA tensors";
  if (p.dtype != SA_DTYPE_BF16) {
    os << "dtype " << dtype_name(p.dtype) << " (sm90 DSA backward supports bf16)";
    return os.str();
  }
  if (d.Dqk != 512 && d.Dqk != 576) {
    os << "D_qk = " << d.Dqk << " (sm90 DSA backward supports 512, 576)";
    return os.str();
  }
  if (d.Dv != 512) {
    os << "d_v = " << d.Dv << " (sm90 DSA backward supports 512)";
    return os.str();
  }
  if (d.H != 64 && d.H != 128) {
    os << "H = " << d.H << " (sm90 DSA backward supports 64, 128)";
    return os.str();
  }
  if (p.options.deterministic)
    return "deterministic mode (the portable DSA backward serves it)";
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  if (d.Sq * (d.H / 64) > kMaxInt) {
    os << "S_q = " << d.Sq << " (sm90 DSA backward supports S_q * H / 64 < 2^31)";
    return os.str();
  }
  // Sizes, layouts and alignment (16-byte rows of q, kv, out, dout; dq pairs; dkv quads of the
  // conversion pass): the portable backward's checks, whose passes this path runs too.
  const std::string shared = portable::dsa_backward_unsupported(p);
  if (!shared.empty()) return shared;
  if (max_smem_optin(p.device_index) < static_cast<int>(smem_bytes<576>())) {
    os << "needs " << smem_bytes<576>() << " bytes of shared memory per block (device "
       << p.device_index << " offers " << max_smem_optin(p.device_index) << ")";
    return os.str();
  }
  return "";
}

size_t dsa_backward_workspace_bytes(const DsaBwdProblem& p) { return make_plan(p).total; }

void dsa_backward(const DsaBwdProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream) {
  const std::string why = dsa_backward_unsupported(p);
  SA_CHECK(why.empty(), SA_ERROR_UNSUPPORTED, "sm90 dsa_backward: " << why);
  const DsaDims& d = p.dims;
  const Plan plan = make_plan(p);
  SA_CHECK(workspace != nullptr && workspace_bytes >= plan.total, SA_ERROR_WORKSPACE,
           "sm90 dsa_backward: needs " << plan.total << " bytes of workspace, got "
                                       << workspace_bytes << (workspace == nullptr ? " (null)" : ""));
  uint8_t* base = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(workspace), 256));
  float* acc = reinterpret_cast<float*>(base + plan.acc);

  dsa_bwd::Params prm = portable::dsa_bwd::make_params(p, DsaBwdTraits<576>::kHeads);
  prm.dkv_acc = acc;
  prm.dkv_part = nullptr;
  prm.sink_terms = p.d_sink != nullptr ? reinterpret_cast<float*>(base + plan.terms) : nullptr;
  prm.tok_begin = 0;

  SA_CUDA_CHECK(cudaMemsetAsync(acc, 0, static_cast<size_t>(d.Skv * d.Dqk) * 4, stream));
  const int64_t grid = d.Sq * prm.head_groups;
  if (grid > 0) {
    if (d.Dqk == 576) {
      launch<576>(prm, grid, stream);
    } else {
      launch<512>(prm, grid, stream);
    }
  }
  const int dqk = static_cast<int>(d.Dqk);
  portable::dsa_bwd::convert_dkv(acc, p.dkv.data, p.dtype, d.Skv, dqk, p.dkv.ss, stream);
  if (p.d_sink != nullptr) {
    portable::dsa_bwd::reduce_d_sink(prm.sink_terms, d.Sq, d.H, p.d_sink, p.d_sink_stride,
                                     p.meta.sink != nullptr, stream);
  }
}

}  // namespace sa::sm90
