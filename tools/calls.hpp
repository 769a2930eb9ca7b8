// Calling the library from the demo: status handling, and a timed call on the CPU or the GPU.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cuda_device.hpp"
#include "sparse_attention/sparse_attention.hpp"

namespace sa_tool {

// Throws ToolError for a failed call: exit 2 when the library refused it (invalid argument,
// unsupported request), 1 otherwise. `what` names the call, e.g. "bsa_fwd on cpu".
void check_call(const sparse_attention::Status& st, const std::string& what);

using Run = std::function<sparse_attention::Status(const sa_context&)>;

struct Timing {
  sa_impl impl = SA_IMPL_AUTO;  // from sa_context.impl_used
  double ms = 0;                // per call
  int calls = 0;                // timed calls
};

// One call on CPU tensors (the reference), timed with a steady clock.
Timing cpu_call(const Run& run, const std::string& what);

// A call on CUDA tensors. The workspace query doubles as the support probe: it validates and
// selects the implementation exactly as the call does, and launches nothing.
struct GpuCall {
  std::function<sparse_attention::Status(size_t*)> workspace_size;
  Run run;
  std::string what;  // "bsa_fwd on cuda:0"
};

// True when an implementation serves the call on the GPU (then *workspace is its size); false
// with the library's message in *why for SA_ERROR_UNSUPPORTED; throws for any other failure.
bool gpu_supported(const GpuCall& call, size_t* workspace, std::string* why);

// Fills `outputs` with NaN, calls once, downloads them into their host tensors, then times
// `repeats` more calls with CUDA events (none when repeats is 0).
Timing gpu_run(const GpuCall& call, size_t workspace, DeviceArena& arena,
               const std::vector<std::pair<sa_tensor, HostTensor*>>& outputs, int repeats);

}  // namespace sa_tool
