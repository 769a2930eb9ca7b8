// Correctness checks of the demo: one Check per output, each with its own metric and tolerance.
// Any NaN left in an output (they are filled with NaN before every call) fails its check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sa_tool {

// SPEC 3: bf16/fp16 outputs and gradients within a relative L2 error of 1e-2 of the fp64
// reference; LSE within 1e-4 absolute, infinities at the same positions.
constexpr double kRelL2Tolerance = 1e-2;
constexpr double kLseTolerance = 1e-4;
// The oracle's own backward against central differences of its forward, all in double.
constexpr double kFiniteDifferenceTolerance = 1e-5;
// The indexer's fp32 scores: within 1e-4 of the largest |score| of the fp64 reference on the same
// bf16 values (tests/test_gpu_indexer.cpp); a top-k key's reference score within 2e-4 of it below
// the k-th best (near-ties may swap); the loss against the sum of its per-token terms.
constexpr double kScoreTolerance = 1e-4;
constexpr double kTopkRegretTolerance = 2e-4;

struct Check {
  // kMaxRel: max |got - want| over the largest |want|; kCount: violations of a rule (pass: 0).
  enum class Metric { kRelL2, kMaxAbs, kFiniteDifferences, kMaxRel, kCount };
  std::string name;
  Metric metric = Metric::kRelL2;
  double error = 0;
  double tolerance = 0;
  int64_t compared = 0;      // elements compared
  int64_t nan = 0;           // NaN left in the output (the whole tensor)
  int64_t inf_mismatch = 0;  // kMaxAbs: positions where the infinities (or a NaN) differ

  bool pass() const { return nan == 0 && inf_mismatch == 0 && error < tolerance; }  // NaN fails
  std::string line() const;  // "o     rel L2 1.3e-03 < 1e-02  (65536 elements, NaN 0)  PASS"
};

// ||got - want|| / ||want|| over the compared elements (0 when both are 0).
Check rel_l2_check(std::string name, const std::vector<double>& got,
                   const std::vector<double>& want, int64_t nan_in_output);
// max |got - want| over the entries finite in both; infinities must sit at the same positions.
Check lse_check(std::string name, const std::vector<double>& got, const std::vector<double>& want,
                int64_t nan_in_output);
Check finite_difference_check(double rel_error, int64_t elements);
// max |got - want| over the entries finite in both, divided by the largest finite |want|;
// infinities must sit at the same positions.
Check max_rel_check(std::string name, const std::vector<double>& got,
                    const std::vector<double>& want, int64_t nan_in_output, double tolerance);
// `error` already relative (e.g. a top-k regret over the largest score).
Check relative_error_check(std::string name, double error, int64_t elements, double tolerance);
// A rule checked element by element: passes when no element broke it.
Check count_check(std::string name, int64_t violations, int64_t elements);

}  // namespace sa_tool
