// The portable tensor-core path (sm80 and newer) as the dispatcher sees it. Operations whose
// kernels are not written yet have no entry, so the dispatcher reports "not implemented".
#include <cuda_runtime_api.h>

#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>

#include "api/implementation.hpp"
#include "common/cuda_check.hpp"
#include "portable/bsa_backward.hpp"
#include "portable/bsa_forward.hpp"
#include "portable/bsa_metadata_check.hpp"
#include "portable/dsa_backward.hpp"
#include "portable/dsa_forward.hpp"

namespace sa {
namespace {

// Compute capability of a CUDA device, queried once per device. "" on success, else the reason.
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
      cudaDeviceProp prop{};
      e.status = cudaGetDeviceProperties(&prop, device);
      if (e.status != cudaSuccess) (void)cudaGetLastError();  // do not leave the error pending
      e.major = prop.major;
      e.minor = prop.minor;
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

// Makes `device` current for the scope of a call, restoring the caller's device after.
class DeviceScope {
 public:
  explicit DeviceScope(int32_t device) {
    SA_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) SA_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

// ---- the checks every entry makes before its path's own ----------------------------------------
// "" when the portable path can run on a problem's device (CUDA tensors on a device of compute
// capability 8.0 or newer), else the reason.
std::string device_unsupported(sa_device_type device, int32_t device_index) {
  if (device != SA_DEVICE_CUDA) return "needs CUDA tensors";
  int major = 0, minor = 0;
  std::string why = device_capability(device_index, &major, &minor);
  if (!why.empty()) return why;
  if (major < 8) {
    std::ostringstream os;
    os << "needs compute capability 8.0 or newer (device " << device_index << " is " << major
       << "." << minor << ")";
    return os.str();
  }
  return "";
}

// The device's reason when it has one, otherwise that of the path's own check.
template <class Problem>
std::string unsupported(const Problem& p, std::string (*path_unsupported)(const Problem&)) {
  std::string why = device_unsupported(p.device, p.device_index);
  if (!why.empty()) return why;
  return path_unsupported(p);
}

// ---- BSA forward ------------------------------------------------------------------------------
std::string bsa_fwd_unsupported(const BsaFwdProblem& p) {
  return unsupported(p, &portable::bsa_forward_unsupported);
}

void bsa_fwd_run(const BsaFwdProblem& p, const ExecContext& ctx) {
  DeviceScope scope(p.device_index);
  cudaStream_t stream = ctx.stream;
  if (p.options.validate) portable::check_bsa_metadata_gpu(p.dims, p.meta, stream);
  portable::bsa_forward(p, stream);
}

// ---- BSA backward -----------------------------------------------------------------------------
std::string bsa_bwd_unsupported(const BsaBwdProblem& p) {
  return unsupported(p, &portable::bsa_backward_unsupported);
}

size_t bsa_bwd_workspace_bytes(const BsaBwdProblem& p) {
  DeviceScope scope(p.device_index);  // CUB sizes its scan for the current device
  return portable::bsa_backward_workspace_bytes(p);
}

void bsa_bwd_run(const BsaBwdProblem& p, const ExecContext& ctx) {
  DeviceScope scope(p.device_index);
  cudaStream_t stream = ctx.stream;
  if (p.options.validate) portable::check_bsa_metadata_gpu(p.dims, p.meta, stream);
  portable::bsa_backward(p, ctx.workspace, ctx.workspace_bytes, stream);
}

// ---- DSA forward ------------------------------------------------------------------------------
std::string dsa_fwd_unsupported(const DsaFwdProblem& p) {
  return unsupported(p, &portable::dsa_forward_unsupported);
}

void dsa_fwd_run(const DsaFwdProblem& p, const ExecContext& ctx) {
  DeviceScope scope(p.device_index);
  portable::dsa_forward(p, ctx.stream);
}

// ---- DSA backward -----------------------------------------------------------------------------
std::string dsa_bwd_unsupported(const DsaBwdProblem& p) {
  return unsupported(p, &portable::dsa_backward_unsupported);
}

size_t dsa_bwd_workspace_bytes(const DsaBwdProblem& p) {
  DeviceScope scope(p.device_index);  // CUB sizes its sort for the current device
  return portable::dsa_backward_workspace_bytes(p);
}

void dsa_bwd_run(const DsaBwdProblem& p, const ExecContext& ctx) {
  DeviceScope scope(p.device_index);
  portable::dsa_backward(p, ctx.workspace, ctx.workspace_bytes, ctx.stream);
}

}  // namespace

extern const Implementation kPortableImplementation = {
    SA_IMPL_PORTABLE,
    "portable",
    /*bsa_fwd=*/{&bsa_fwd_unsupported, nullptr, &bsa_fwd_run},
    /*bsa_bwd=*/{&bsa_bwd_unsupported, &bsa_bwd_workspace_bytes, &bsa_bwd_run},
    /*dsa_fwd=*/{&dsa_fwd_unsupported, nullptr, &dsa_fwd_run},
    /*dsa_bwd=*/{&dsa_bwd_unsupported, &dsa_bwd_workspace_bytes, &dsa_bwd_run},
};

}  // namespace sa
