// The tool's use of the CUDA runtime: finding a device (a machine without a driver or a GPU is
// not an error: the demo then runs on the CPU), device copies of host tensors, NaN poisoning and
// event timing. Failures throw ToolError (exit 1).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "testing/host_tensor.hpp"

namespace sa_tool {

// Host tensors and their views come from the testing library (testing/host_tensor.hpp), which
// the tests share.
using sa_testing::count_nan;
using sa_testing::HostTensor;
using sa_testing::narrow;
using sa_testing::values;

struct CudaDevice {
  bool present = false;
  int index = 0;
  std::string name;     // "NVIDIA H200 (sm_90)"
  std::string why_not;  // when !present: why, in words ("no NVIDIA GPU or driver found")
};
CudaDevice find_cuda_device();

// Owns the device buffers of one operation; frees them on destruction.
class DeviceArena {
 public:
  explicit DeviceArena(int device) : device_(device) {}
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  sa_tensor upload(HostTensor& t);  // a device copy of t, same shape and dtype
  void* allocate(size_t bytes);     // nullptr for 0 bytes
  // A new contiguous device tensor (contents undefined).
  sa_tensor tensor(sa_dtype dtype, const std::vector<int64_t>& shape);
  int device() const { return device_; }

 private:
  int device_;
  std::vector<void*> buffers_;
};

size_t view_bytes(const sa_tensor& t);      // a contiguous view's size in bytes
void poison(const sa_tensor& device_view);  // all bits set: NaN in bf16, fp16 and fp32
void download(const sa_tensor& device_view, HostTensor& host);  // synchronous
void upload_into(const HostTensor& host, const sa_tensor& device_view);
void synchronize();  // the device; a sticky error of an earlier launch shows here

// Milliseconds between two events recorded on the default stream.
class GpuTimer {
 public:
  GpuTimer();
  ~GpuTimer();
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;
  void start();
  double stop_ms();

 private:
  void* start_ = nullptr;  // cudaEvent_t
  void* stop_ = nullptr;
};

}  // namespace sa_tool
