// Small statistics for `tightfit ab`: means and 95% confidence intervals
// over seeds (Student's t, as the seeds are few).
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace tightfit::host {

// `v` with `digits` decimals, or "-" when it is not finite (a run that failed).
inline std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "-";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

inline double mean(const std::vector<double>& v) {
  if (v.empty()) return std::nan("");
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

// Half-width of the two-sided 95% interval of the mean; NaN below 2 values.
inline double ci95(const std::vector<double>& v) {
  const size_t n = v.size();
  if (n < 2) return std::nan("");
  const double m = mean(v);
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  const double sd = std::sqrt(ss / static_cast<double>(n - 1));
  // t quantile 0.975 for n - 1 degrees of freedom.
  static const double t[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                             2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                             2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  const double q = n - 1 <= 30 ? t[n - 2] : 1.96;
  return q * sd / std::sqrt(static_cast<double>(n));
}

}  // namespace tightfit::host
