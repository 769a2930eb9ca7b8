// Launch of the portable DSA backward's main kernel, one explicit instantiation per (D_qk, heads
// per CTA) in its own file (dsa_backward_d{512,576}_m{32,64}.cu, the table in
// DSA_BWD_INSTANTIATIONS below); dsa_backward.cu only declares them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <set>

#include "common/cuda_check.hpp"
#include "sm80/dsa_backward_kernel.cuh"

namespace sa::portable::dsa_bwd {

// The bf16 kernels (the only dtype the portable backward serves).
template <int kDqk, int kBlockM>
using BwdConfig = DsaBwdConfig<__nv_bfloat16, kDqk, kBlockM>;

// `grid` CTAs of the kernel of (kDqk, kBlockM) on `stream`; device `device` is current.
template <int kDqk, int kBlockM>
void launch_main(const DsaBwdParams& prm, int64_t grid, int device, cudaStream_t stream) {
  using Cfg = BwdConfig<kDqk, kBlockM>;
  auto* kernel = &dsa_bwd_kernel<Cfg>;
  {
    // The opt-in is per device and per kernel; set it once for each.
    static std::mutex mutex;
    static std::set<int> done;
    std::lock_guard<std::mutex> lock(mutex);
    if (done.count(device) == 0) {
      SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Cfg::kSmemBytes));
      done.insert(device);
    }
  }
  kernel<<<static_cast<unsigned>(grid), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(prm);
  SA_CUDA_CHECK_LAUNCH();
}

// X(D_qk, heads per CTA) for every instantiation.
#define DSA_BWD_INSTANTIATIONS(X) X(512, 32) X(512, 64) X(576, 32) X(576, 64)

#define DSA_BWD_DECLARE(D, M) \
  extern template void launch_main<D, M>(const DsaBwdParams&, int64_t, int, cudaStream_t);
DSA_BWD_INSTANTIATIONS(DSA_BWD_DECLARE)
#undef DSA_BWD_DECLARE

}  // namespace sa::portable::dsa_bwd
