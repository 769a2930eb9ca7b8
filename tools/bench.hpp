// The `bench` subcommand: the benchmark mode of BENCHMARKING.md (median timings, anchors, results
// files). Reserved: not written yet.
#pragma once

namespace sa_tool {

// Returns the exit status.
int run_bench(int argc, const char* const* argv);

}  // namespace sa_tool
