// Portable DSA forward, host side: support checks, variant choice (chunk of 32 or 64 keys by the
// device's shared memory), launch. The kernel and its design are in dsa_forward_kernel.cuh.
#include "sm80/dsa_forward.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <sstream>

#include "common/cuda_check.hpp"
#include "common/cuda_device.hpp"
#include "common/host_numeric.hpp"
#include "cuda/launch_checks.hpp"
#include "sm80/dsa_forward_kernel.cuh"

namespace sa::portable {
namespace {

using dsa_fwd::DsaFwdConfig;
using dsa_fwd::DsaFwdParams;

constexpr int kSmemBlockN32 = DsaFwdConfig<__nv_bfloat16, 32>::kSmemBytes;
constexpr int kSmemBlockN64 = DsaFwdConfig<__nv_bfloat16, 64>::kSmemBytes;

template <class Cfg>
void launch(const DsaFwdParams& prm, int64_t grid, cudaStream_t stream) {
  auto* kernel = &dsa_fwd::dsa_fwd_kernel<Cfg>;
  // The shared-memory opt-in belongs to the current device (and context): set on every call, a
  // host-side attribute write that does not synchronise.
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     Cfg::kSmemBytes));
  kernel<<<static_cast<unsigned>(grid), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(prm);
  SA_CUDA_CHECK_LAUNCH();
}

template <class Element>
void launch_block_n(int block_n, const DsaFwdParams& prm, int64_t grid, cudaStream_t stream) {
  if (block_n == 64) {
    launch<DsaFwdConfig<Element, 64>>(prm, grid, stream);
  } else {
    launch<DsaFwdConfig<Element, 32>>(prm, grid, stream);
  }
}

}  // namespace

int dsa_forward_smem_bytes(int block_n) { return block_n == 64 ? kSmemBlockN64 : kSmemBlockN32; }

std::string dsa_forward_unsupported(const DsaFwdProblem& p) {
  const DsaDims& d = p.dims;
  std::ostringstream os;
  if (p.device != SA_DEVICE_CUDA) return "needs CUDA tensors";
  if (p.dtype != SA_DTYPE_BF16 && p.dtype != SA_DTYPE_FP16) {
    os << "dtype " << dtype_name(p.dtype) << " (portable DSA forward supports bf16, fp16)";
    return os.str();
  }
  const std::string sizes = dsa_sizes_unsupported(d, "portable DSA forward");
  if (!sizes.empty()) return sizes;
  const int64_t groups = (d.H + 63) / 64;
  if (d.Sq * groups > INT32_MAX) {
    os << "S_q = " << d.Sq << " (portable DSA forward supports S_q * ceil(H / 64) < 2^31)";
    return os.str();
  }
  const std::string layout = dsa_forward_layout_unsupported(p, "portable DSA forward");
  if (!layout.empty()) return layout;
  return smem_unsupported(p.device_index, kSmemBlockN32);
}

void dsa_forward(const DsaFwdProblem& p, cudaStream_t stream, const DsaForwardTuning& tuning) {
  const std::string why = dsa_forward_unsupported(p);
  SA_CHECK(why.empty(), SA_ERROR_UNSUPPORTED, "dsa_forward (portable): " << why);
  int current = -1;
  SA_CUDA_CHECK(cudaGetDevice(&current));
  SA_CHECK(current == p.device_index, SA_ERROR_INTERNAL,
           "dsa_forward (portable): device " << p.device_index << " is not current (" << current
                                             << " is)");
  const int smem = max_smem_optin(p.device_index);
  int block_n = tuning.block_n;
  if (block_n == 0) block_n = smem >= kSmemBlockN64 ? 64 : 32;
  SA_CHECK(block_n == 32 || block_n == 64, SA_ERROR_INVALID_ARGUMENT,
           "dsa_forward tuning.block_n: expected 0, 32 or 64, got " << block_n);
  SA_CHECK(smem >= (block_n == 64 ? kSmemBlockN64 : kSmemBlockN32), SA_ERROR_UNSUPPORTED,
           "dsa_forward tuning.block_n = " << block_n << " needs "
                                           << (block_n == 64 ? kSmemBlockN64 : kSmemBlockN32)
                                           << " bytes of shared memory per block (device offers "
                                           << smem << ")");

  const DsaFwdParams prm = dsa_fwd::make_params(p);
  const int64_t grid = p.dims.Sq * prm.head_groups;
  if (grid == 0) return;
  if (p.dtype == SA_DTYPE_BF16) {
    launch_block_n<__nv_bfloat16>(block_n, prm, grid, stream);
  } else {
    launch_block_n<__half>(block_n, prm, grid, stream);
  }
}

}  // namespace sa::portable
