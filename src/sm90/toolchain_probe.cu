#include <cuda_runtime_api.h>

#include "sm90/toolchain_probe.hpp"

namespace sa::sm90 {
namespace {

__global__ void __launch_bounds__(128, 1) probe_kernel(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::);
  if (threadIdx.x == 0) *out = 42;
#else
  if (threadIdx.x == 0) *out = -2;  // compiled without the sm_90a feature set
#endif
}

}  // namespace

int toolchain_probe() {
  int* dev = nullptr;
  int host = -1;
  if (cudaMalloc(&dev, sizeof(int)) != cudaSuccess) return -1;
  probe_kernel<<<1, 128>>>(dev);
  if (cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess)
    cudaMemcpy(&host, dev, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(dev);
  return host;
}

}  // namespace sa::sm90
