#include "common/cuda_device.hpp"

#include <cuda_runtime_api.h>

#include <mutex>
#include <unordered_map>

#include "common/cuda_check.hpp"

namespace sa {

std::string device_capability(int32_t device, int* major, int* minor) {
  struct Entry {
    cudaError_t status;
    int major, minor;
  };
  static std::mutex mutex;
  static std::unordered_map<int32_t, Entry> cache;
  Entry e{};
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(device);
    if (it != cache.end()) {
      e = it->second;
    } else {
      e.status = cudaDeviceGetAttribute(&e.major, cudaDevAttrComputeCapabilityMajor, device);
      if (e.status == cudaSuccess)
        e.status = cudaDeviceGetAttribute(&e.minor, cudaDevAttrComputeCapabilityMinor, device);
      if (e.status != cudaSuccess) (void)cudaGetLastError();  // do not leave the error pending
      cache.emplace(device, e);
    }
  }
  if (e.status != cudaSuccess)
    return "cannot query CUDA device " + std::to_string(device) + " (" +
           cudaGetErrorString(e.status) + ")";
  *major = e.major;
  *minor = e.minor;
  return "";
}

namespace {
// One device attribute, queried once per (attribute, device); 0 when the query fails (no CUDA
// error is left pending).
int cached_attribute(cudaDeviceAttr attr, int32_t device) {
  static std::mutex mutex;
  static std::unordered_map<int64_t, int> cache;
  const int64_t key = (static_cast<int64_t>(attr) << 32) | static_cast<uint32_t>(device);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int value = 0;
  if (cudaDeviceGetAttribute(&value, attr, device) != cudaSuccess) {
    (void)cudaGetLastError();
    value = 0;
  }
  cache.emplace(key, value);
  return value;
}
}  // namespace

int max_smem_optin(int32_t device) {
  return cached_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
}

int sm_count(int32_t device) { return cached_attribute(cudaDevAttrMultiProcessorCount, device); }

DeviceScope::DeviceScope(int32_t device) {
  SA_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) SA_CUDA_CHECK(cudaSetDevice(device));
}

DeviceScope::~DeviceScope() {
  int now = previous_;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
}

}  // namespace sa
