// The bench's pieces shared by its per-operation set-ups (bench.cpp: BSA and DSA;
// bench_indexer.cpp: the lightning indexer). Internal to the tool.
//
// An operation's set-up builds one random problem on the device and returns an OpSetup: how to
// make a Subject (one timed call) of each variant, how to check a subject's outputs against the
// fp64 reference before timing, the FLOPs of one call and the shape for the JSON records.
// bench.cpp times the subjects (BENCHMARKING.md's method) and writes the records.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "bench.hpp"
#include "compare.hpp"
#include "cuda_device.hpp"

namespace sa_tool {

// One benchmarked call: a variant's run function on device views, its outputs, and how to
// compare them with the reference after a checked call.
struct Subject {
  BenchVariant variant;
  std::function<sparse_attention::Status(const sa_context&)> run;
  std::function<sparse_attention::Status(size_t*)> workspace_size;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  sa_impl impl = SA_IMPL_AUTO;
  const char* impl_label = nullptr;  // an anchor's name instead of sa_impl_name(impl)
  bool ok = true;
  bool checked = false;  // compared with the reference (not with --no-check)
  double max_rel_l2 = 0;
  std::vector<double> rounds_ms;
  double median_ms = 0;
};

struct OpSetup {
  std::string op;          // the record's "op"
  std::string shape_json;  // the record's "shape"
  double flops = 0;        // of one call (BENCHMARKING.md: useful work only)
  // Runs one checked call of the variant (outputs poisoned first) and compares.
  std::function<void(Subject&)> check;
  std::function<Subject(const BenchVariant&)> make;
};

// The context of a subject's calls: its workspace, and impl_used into s.impl.
sa_context context_of(Subject& s);
// A variant's impl, bucket and deterministic overrides (null: the option does not exist).
void apply(const BenchVariant& v, sa_impl* impl, int32_t* bucket, int32_t* deterministic);
// The largest rel L2 error of the checks; *ok becomes false when one fails.
double worst(const std::vector<Check>& checks, bool* ok);
// Prints each failed check's line under the variant's label.
void report_failures(const Subject& s, const std::vector<Check>& checks);

// The indexer's operations (bench_indexer.cpp): indexer_scores, indexer_topk, indexer_loss
// (sparse, or dense with --loss-mode dense). Device tensors live in `arena`.
OpSetup indexer_setup(const std::string& op, const DemoOptions& demo, DeviceArena& arena);

}  // namespace sa_tool
