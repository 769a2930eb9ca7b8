#include "cuda_device.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <string>

#include "common/host_numeric.hpp"
#include "tool_error.hpp"

namespace sa_tool {
namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw ToolError(kExitCheckFailed, std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

// Whether the NVIDIA driver's library can be loaded on this machine.
bool driver_present() {
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h == nullptr) return false;
  dlclose(h);
  return true;
}

// Why cudaGetDeviceCount found no device, in words. The runtime reports a machine without the
// driver as "CUDA driver version is insufficient"; that message is kept for a driver that is
// present but older than the runtime needs.
std::string no_device_reason(cudaError_t e) {
  if (e == cudaErrorNoDevice || (e == cudaErrorInsufficientDriver && !driver_present()))
    return "no NVIDIA GPU or driver found";
  if (e == cudaErrorInsufficientDriver)
    return std::string("the NVIDIA driver is older than this build's CUDA runtime needs (") +
           cudaGetErrorString(e) + ")";
  return std::string("no usable CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")";
}

}  // namespace

CudaDevice find_cuda_device() {
  CudaDevice d;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    d.why_not = no_device_reason(e);
    return d;
  }
  if (count == 0) {
    d.why_not = no_device_reason(cudaErrorNoDevice);
    return d;
  }
  cudaDeviceProp prop{};
  e = cudaGetDeviceProperties(&prop, 0);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    d.why_not = std::string("no usable CUDA device (cudaGetDeviceProperties: ") +
                cudaGetErrorString(e) + ")";
    return d;
  }
  d.present = true;
  d.index = 0;
  d.name = std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
           std::to_string(prop.minor) + ")";
  return d;
}

DeviceArena::~DeviceArena() {
  for (void* p : buffers_) (void)cudaFree(p);
}

size_t view_bytes(const sa_tensor& t) {
  int64_t n = 1;
  for (int d = 0; d < t.rank; ++d) n *= t.shape[d];
  return static_cast<size_t>(n * sa::dtype_size(t.dtype));
}

void* DeviceArena::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  cuda_check(cudaSetDevice(device_), "cudaSetDevice");
  cuda_check(cudaMalloc(&p, bytes), ("cudaMalloc(" + std::to_string(bytes) + " bytes)").c_str());
  buffers_.push_back(p);
  return p;
}

sa_tensor DeviceArena::tensor(sa_dtype dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return sa_tensor_contiguous(allocate(static_cast<size_t>(n * sa::dtype_size(dtype))), dtype,
                              static_cast<int32_t>(shape.size()), shape.data(), SA_DEVICE_CUDA,
                              device_);
}

sa_tensor DeviceArena::upload(HostTensor& t) {
  sa_tensor v = t.view();
  v.data = allocate(t.nbytes());
  v.device = SA_DEVICE_CUDA;
  v.device_index = device_;
  upload_into(t, v);
  return v;
}

void upload_into(const HostTensor& host, const sa_tensor& device_view) {
  cuda_check(cudaMemcpy(device_view.data, host.data(), host.nbytes(), cudaMemcpyHostToDevice),
             "cudaMemcpy to the device");
}

void poison(const sa_tensor& v) {
  cuda_check(cudaMemset(v.data, 0xff, view_bytes(v)), "cudaMemset");
}

void download(const sa_tensor& v, HostTensor& host) {
  cuda_check(cudaMemcpy(host.data(), v.data, host.nbytes(), cudaMemcpyDeviceToHost),
             "cudaMemcpy to the host");
}

void synchronize() { cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

GpuTimer::GpuTimer() {
  cudaEvent_t a = nullptr, b = nullptr;
  cuda_check(cudaEventCreate(&a), "cudaEventCreate");
  cuda_check(cudaEventCreate(&b), "cudaEventCreate");
  start_ = a;
  stop_ = b;
}

GpuTimer::~GpuTimer() {
  (void)cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  (void)cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

void GpuTimer::start() {
  cuda_check(cudaEventRecord(static_cast<cudaEvent_t>(start_), nullptr), "cudaEventRecord");
}

double GpuTimer::stop_ms() {
  cuda_check(cudaEventRecord(static_cast<cudaEvent_t>(stop_), nullptr), "cudaEventRecord");
  cuda_check(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)), "cudaEventSynchronize");
  float ms = 0.f;
  cuda_check(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)),
      "cudaEventElapsedTime");
  return ms;
}

}  // namespace sa_tool
