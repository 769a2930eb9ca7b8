#include "calls.hpp"

#include <chrono>

#include "tool_error.hpp"

namespace sa_tool {
namespace api = sparse_attention;

void check_call(const api::Status& st, const std::string& what) {
  if (st.ok()) return;
  const bool refused = st.code() == SA_ERROR_INVALID_ARGUMENT || st.code() == SA_ERROR_UNSUPPORTED;
  throw ToolError(refused ? kExitBadArgument : kExitCheckFailed, what + ": " + st.to_string());
}

Timing cpu_call(const Run& run, const std::string& what) {
  Timing t;
  sa_context ctx = api::context();
  ctx.impl_used = &t.impl;
  const auto start = std::chrono::steady_clock::now();
  const api::Status st = run(ctx);
  const auto stop = std::chrono::steady_clock::now();
  check_call(st, what);
  t.ms = std::chrono::duration<double, std::milli>(stop - start).count();
  t.calls = 1;
  return t;
}

bool gpu_supported(const GpuCall& call, size_t* workspace, std::string* why) {
  *workspace = 0;
  const api::Status st = call.workspace_size(workspace);
  if (st.code() == SA_ERROR_UNSUPPORTED) {
    *why = st.message();
    return false;
  }
  check_call(st, call.what);
  return true;
}

Timing gpu_run(const GpuCall& call, size_t workspace, DeviceArena& arena,
               const std::vector<std::pair<sa_tensor, HostTensor*>>& outputs, int repeats) {
  Timing t;
  sa_context ctx = api::context();  // the legacy default stream
  ctx.workspace = arena.allocate(workspace);
  ctx.workspace_bytes = workspace;
  ctx.impl_used = &t.impl;
  for (const auto& out : outputs) poison(out.first);
  check_call(call.run(ctx), call.what);
  synchronize();
  for (const auto& out : outputs) download(out.first, *out.second);
  if (repeats <= 0) return t;
  GpuTimer timer;
  timer.start();
  for (int i = 0; i < repeats; ++i) check_call(call.run(ctx), call.what);
  t.ms = timer.stop_ms() / repeats;
  t.calls = repeats;
  synchronize();
  return t;
}

}  // namespace sa_tool
