// Portable DSA backward, host side: support checks, the variant (heads per CTA) and the main
// kernel's policy for the shared driver (src/cuda/dsa_backward_driver.hpp), which plans the
// workspace and runs every step. The main kernel and its design are in dsa_backward_kernel.cuh.
#include <climits>
#include <cstdint>
#include <sstream>

#include "common/cuda_device.hpp"
#include "common/error.hpp"
#include "common/host_numeric.hpp"
#include "cuda/dsa_backward_driver.hpp"
#include "cuda/launch_checks.hpp"
#include "sm80/dsa_backward.hpp"
#include "sm80/dsa_backward_launch.cuh"

namespace sa::portable {
namespace {

using dsa_bwd::BwdConfig;

// Heads per CTA for `p` on its device (support already checked).
int choose_block_m(const DsaBwdProblem& p, const DsaBackwardTuning& tuning) {
  const int dqk = static_cast<int>(p.dims.Dqk);
  const int smem = max_smem_optin(p.device_index);
  if (tuning.block_m != 0) {
    SA_CHECK(tuning.block_m == 32 || tuning.block_m == 64, SA_ERROR_INVALID_ARGUMENT,
             "dsa_backward tuning.block_m: expected 0, 32 or 64, got " << tuning.block_m);
    SA_CHECK(smem >= dsa_backward_smem_bytes(dqk, tuning.block_m), SA_ERROR_UNSUPPORTED,
             "dsa_backward tuning.block_m = "
                 << tuning.block_m << " needs " << dsa_backward_smem_bytes(dqk, tuning.block_m)
                 << " bytes of shared memory per block (device offers " << smem << ")");
    return tuning.block_m;
  }
  return p.dims.H >= 64 && smem >= dsa_backward_smem_bytes(dqk, 64) ? 64 : 32;
}

// The portable main kernels, by (D_qk, heads per CTA) (explicitly instantiated in
// dsa_backward_d<D_qk>_m<heads>.cu).
dsa_bwd::MainKernelLaunch portable_main(int dqk, int block_m) {
  if (dqk == 576)
    return block_m == 64 ? &dsa_bwd::launch_main<576, 64> : &dsa_bwd::launch_main<576, 32>;
  return block_m == 64 ? &dsa_bwd::launch_main<512, 64> : &dsa_bwd::launch_main<512, 32>;
}

// The driver's view of the portable kernel for `p`: one CTA per work item, reductions in natural
// column order.
dsa_bwd::KernelPolicy portable_policy(const DsaBwdProblem& p, const DsaBackwardTuning& tuning) {
  dsa_bwd::KernelPolicy k;
  k.op = "dsa_backward (portable)";
  k.heads_per_cta = choose_block_m(p, tuning);
  k.reduce_columns = dsa_bwd::AccColumns::kNatural;
  k.launch = portable_main(static_cast<int>(p.dims.Dqk), k.heads_per_cta);
  return k;
}

}  // namespace

int dsa_backward_smem_bytes(int dqk, int block_m) {
  if (dqk == 576) {
    return block_m == 64 ? BwdConfig<576, 64>::kSmemBytes : BwdConfig<576, 32>::kSmemBytes;
  }
  return block_m == 64 ? BwdConfig<512, 64>::kSmemBytes : BwdConfig<512, 32>::kSmemBytes;
}

std::string dsa_backward_unsupported(const DsaBwdProblem& p) {
  const DsaDims& d = p.dims;
  std::ostringstream os;
  if (p.device != SA_DEVICE_CUDA) return "needs CUDA tensors";
  if (p.dtype != SA_DTYPE_BF16) {
    os << "dtype " << dtype_name(p.dtype) << " (portable DSA backward supports bf16)";
    return os.str();
  }
  const std::string sizes = dsa_sizes_unsupported(d, "portable DSA backward");
  if (!sizes.empty()) return sizes;
  if (d.Skv > INT32_MAX) {
    os << "S_kv = " << d.Skv << " (portable DSA backward supports < 2^31)";
    return os.str();
  }
  if (d.Sq * ((d.H + 31) / 32) > INT32_MAX) {
    os << "S_q = " << d.Sq << " (portable DSA backward supports S_q * ceil(H / 32) < 2^31)";
    return os.str();
  }
  const std::string layout = dsa_backward_layout_unsupported(p);
  if (!layout.empty()) return layout + " (portable DSA backward)";
  return smem_unsupported(p.device_index, dsa_backward_smem_bytes(static_cast<int>(d.Dqk), 32));
}

size_t dsa_backward_workspace_bytes(const DsaBwdProblem& p, const DsaBackwardTuning& tuning) {
  return dsa_bwd::workspace_bytes(p, portable_policy(p, tuning),
                                  tuning.deterministic_slice_tokens);
}

void dsa_backward(const DsaBwdProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream, const DsaBackwardTuning& tuning) {
  const std::string why = dsa_backward_unsupported(p);
  SA_CHECK(why.empty(), SA_ERROR_UNSUPPORTED, "dsa_backward (portable): " << why);
  dsa_bwd::run(p, workspace, workspace_bytes, stream, portable_policy(p, tuning),
               tuning.deterministic_slice_tokens);
}

}  // namespace sa::portable
