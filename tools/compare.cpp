#include "compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace sa_tool {

std::string Check::line() const {
  const char* metric_name = metric == Metric::kRelL2    ? "rel L2"
                            : metric == Metric::kMaxAbs ? "max abs"
                            : metric == Metric::kMaxRel ? "max err / largest"
                            : metric == Metric::kCount  ? "violations"
                                                        : "rel L2 vs central differences";
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%-8s %s %.2e %s %.0e  (%lld elements", name.c_str(), metric_name,
                error, error < tolerance ? "<" : ">=", tolerance, static_cast<long long>(compared));
  std::string s = buf;
  if (metric == Metric::kMaxAbs || metric == Metric::kMaxRel)
    s += ", infinities " + std::string(inf_mismatch == 0 ? "match" : "DIFFER at ") +
         (inf_mismatch == 0 ? "" : std::to_string(inf_mismatch));
  if (metric != Metric::kFiniteDifferences && metric != Metric::kCount)
    s += ", NaN left " + std::to_string(nan);
  s += ")  ";
  s += pass() ? "PASS" : "FAIL";
  return s;
}

Check rel_l2_check(std::string name, const std::vector<double>& got,
                   const std::vector<double>& want, int64_t nan_in_output) {
  Check c;
  c.name = std::move(name);
  c.metric = Check::Metric::kRelL2;
  c.tolerance = kRelL2Tolerance;
  c.compared = static_cast<int64_t>(want.size());
  c.nan = nan_in_output;
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    err2 += (got[i] - want[i]) * (got[i] - want[i]);
    ref2 += want[i] * want[i];
  }
  if (got.size() != want.size()) err2 = NAN;
  c.error = err2 == 0.0 ? 0.0 : std::sqrt(err2) / std::max(std::sqrt(ref2), 1e-300);
  return c;
}

Check lse_check(std::string name, const std::vector<double>& got, const std::vector<double>& want,
                int64_t nan_in_output) {
  Check c;
  c.name = std::move(name);
  c.metric = Check::Metric::kMaxAbs;
  c.tolerance = kLseTolerance;
  c.compared = static_cast<int64_t>(want.size());
  c.nan = nan_in_output;
  if (got.size() != want.size()) c.error = NAN;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const double a = got[i], b = want[i];
    if (std::isnan(a) || std::isnan(b) || std::isinf(a) || std::isinf(b)) {
      if (!(a == b)) ++c.inf_mismatch;  // NaN never equals anything
      continue;
    }
    c.error = std::max(c.error, std::fabs(a - b));
  }
  return c;
}

Check finite_difference_check(double rel_error, int64_t elements) {
  Check c;
  c.name = "oracle";
  c.metric = Check::Metric::kFiniteDifferences;
  c.tolerance = kFiniteDifferenceTolerance;
  c.error = rel_error;
  c.compared = elements;
  return c;
}

Check max_rel_check(std::string name, const std::vector<double>& got,
                    const std::vector<double>& want, int64_t nan_in_output, double tolerance) {
  Check c = lse_check(std::move(name), got, want, nan_in_output);
  c.metric = Check::Metric::kMaxRel;
  c.tolerance = tolerance;
  double largest = 0;
  for (double w : want)
    if (std::isfinite(w)) largest = std::max(largest, std::fabs(w));
  if (c.error > 0) c.error /= std::max(largest, 1e-300);
  return c;
}

Check relative_error_check(std::string name, double error, int64_t elements, double tolerance) {
  Check c;
  c.name = std::move(name);
  c.metric = Check::Metric::kMaxRel;
  c.error = error;
  c.tolerance = tolerance;
  c.compared = elements;
  return c;
}

Check count_check(std::string name, int64_t violations, int64_t elements) {
  Check c;
  c.name = std::move(name);
  c.metric = Check::Metric::kCount;
  c.error = static_cast<double>(violations);
  c.tolerance = 1;
  c.compared = elements;
  return c;
}

}  // namespace sa_tool
