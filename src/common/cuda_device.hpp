// Host-side facts about CUDA devices that every GPU implementation's dispatcher entry needs.
#pragma once

#include <cstdint>
#include <string>

namespace sa {

// Compute capability of a CUDA device, queried once per device (thread-safe cache). "" on
// success, else the reason ("cannot query CUDA device 3 (...)"); no CUDA error is left pending.
std::string device_capability(int32_t device, int* major, int* minor);

// Largest dynamic shared memory (bytes) a block may opt into on `device`, queried once per device;
// 0 when the query fails (reads as "unsupported"; no CUDA error is left pending).
int max_smem_optin(int32_t device);

// Number of SMs of `device`, queried once per device; 0 when the query fails.
int sm_count(int32_t device);

// Makes `device` current for the scope of a call, restoring the caller's device after.
class DeviceScope {
 public:
  explicit DeviceScope(int32_t device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace sa
