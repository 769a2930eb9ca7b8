// The `demo` subcommand: BSA and DSA forward and backward on a random problem, timed, with a
// correctness summary per operation.
//
// Where each operation runs (--device auto): on the GPU when a CUDA device is present and the
// library serves the operation there; its results are compared with the library's fp64 CPU
// reference on exact sub-problems (reference_sample.hpp). Otherwise on the fp64 CPU reference at
// a small size, compared with the tool's own dense oracle (oracle.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "calls.hpp"
#include "compare.hpp"
#include "cuda_device.hpp"
#include "problems.hpp"

namespace sa_tool {

enum class DeviceChoice { kAuto, kCpu, kCuda };
enum class Target { kCpu, kGpu };

inline const std::vector<std::string>& all_ops() {
  static const std::vector<std::string> ops = {"bsa_fwd", "bsa_bwd", "dsa_fwd", "dsa_bwd"};
  return ops;
}

// The lightning indexer's operations: bench only (bench_indexer.cpp), not in "all".
inline const std::vector<std::string>& indexer_ops() {
  static const std::vector<std::string> ops = {"indexer_scores", "indexer_topk", "indexer_loss"};
  return ops;
}

struct DemoOptions {
  std::vector<std::string> ops = all_ops();
  DeviceChoice device = DeviceChoice::kAuto;
  sa_dtype dtype = SA_DTYPE_BF16;
  uint64_t seed = 1;
  int repeats = 10;  // timed GPU calls

  // Shape flags: unset ones take the default of where the operation runs (default_bsa_shape).
  std::optional<int64_t> batch, heads, kv_heads, seq, dim, block;
  std::optional<double> density;
  sa_layout layout = SA_LAYOUT_BHSD;
  std::optional<int64_t> dsa_heads, dsa_dqk, dsa_seq, dsa_queries, topk;
  bool topk_length = true, sink = true;

  // The bench's indexer operations: S = --seq, k = --topk, the loss's attention H and D_qk =
  // --dsa-heads and --dsa-dqk; these three flags are theirs (bench only).
  std::optional<int64_t> indexer_heads;  // H_I (64)
  bool causal = true;                    // k_start = 0, k_end = t + 1 (DeepSeek-V3.2 prefill)
  bool dense_loss = false;               // indexer_loss in dense mode (the warm-up stage)
  // The bench's BSA forward only: the causal block pattern (BsaShape::causal_blocks) and
  // options.mask. Either BSA op: each row's random blocks in ascending order
  // (BsaShape::sorted_blocks).
  bool bsa_causal_blocks = false;
  bool bsa_sorted_blocks = false;
  sa_mask bsa_mask = SA_MASK_NONE;
};

// Defaults: small on the CPU (the whole CPU demo takes seconds), larger on the GPU.
BsaShape default_bsa_shape(Target target);
DsaShape default_dsa_shape(Target target);
BsaShape bsa_shape(const DemoOptions& opt, Target target);
DsaShape dsa_shape(const DemoOptions& opt, Target target);
// The CPU runs' problems: their size is checked with the dense oracle's buffers included.
BsaProblem make_cpu_bsa_problem(const DemoOptions& opt);
DsaProblem make_cpu_dsa_problem(const DemoOptions& opt);

// What one operation did and how it compared.
struct OpReport {
  std::string op;       // "bsa_fwd"
  std::string problem;  // shape, block, density, dtype, layout
  std::string device;   // "cpu" or "cuda:0 NVIDIA H200 (sm_90)"
  std::string impl;     // the implementation that ran (sa_context.impl_used)
  std::string timing;
  std::vector<std::string> notes;  // fallbacks; where the backward's o and lse came from
  std::string compared;            // what the outputs were compared with, over which part
  std::vector<Check> checks;
  bool pass() const;
};

// "0.123 ms per call (mean of 10 calls, CUDA events)" / "12.3 ms (1 call)".
std::string describe_timing(const Timing& t, Target target);
std::string describe_device(const CudaDevice& dev);  // "cuda:0 NVIDIA H200 (sm_90)"

// Helpers of the per-operation runs (bsa_demo.cpp, dsa_demo.cpp).
sa_tensor host_place(HostTensor& t);  // a host tensor's own view: the Place of the CPU runs
OpReport start_report(const char* op, std::string problem, std::string device);
void finish(OpReport& r, const Timing& t, Target target);  // impl and timing of the timed call

// One operation on the CPU reference, or on the GPU: nullopt (and the library's message in *why)
// when no GPU implementation serves it.
OpReport bsa_forward_cpu(const DemoOptions& opt);
OpReport bsa_backward_cpu(const DemoOptions& opt);
OpReport dsa_forward_cpu(const DemoOptions& opt);
OpReport dsa_backward_cpu(const DemoOptions& opt);
std::optional<OpReport> bsa_forward_gpu(const DemoOptions& opt, const CudaDevice& dev,
                                        std::string* why);
std::optional<OpReport> bsa_backward_gpu(const DemoOptions& opt, const CudaDevice& dev,
                                         std::string* why);
std::optional<OpReport> dsa_forward_gpu(const DemoOptions& opt, const CudaDevice& dev,
                                        std::string* why);
std::optional<OpReport> dsa_backward_gpu(const DemoOptions& opt, const CudaDevice& dev,
                                         std::string* why);

// Runs the demo; returns the exit status (0 all checks pass, 1 a check failed). Bad arguments
// and refused calls throw ToolError (exit 2).
int run_demo(const DemoOptions& opt);

}  // namespace sa_tool
