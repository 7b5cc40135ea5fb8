// The losses of the recent full steps: their mean (the divergence guard's
// yardstick) and their linear trend with its residual spread (what a
// predicted step's loss should be, so a drift ends a predict run early).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <utility>

namespace tf_hybrid {

class LossWatch {
 public:
  explicit LossWatch(size_t window) : window_(std::max<size_t>(window, 2)) {}

  void add(int64_t step, double loss) {
    if (!std::isfinite(loss)) return;
    recent_.emplace_back(step, loss);
    if (recent_.size() > window_) recent_.pop_front();
  }
  size_t size() const { return recent_.size(); }
  const std::deque<std::pair<int64_t, double>>& recent() const { return recent_; }
  void clear() { recent_.clear(); }

  double mean() const {
    double s = 0;
    for (const auto& [step, loss] : recent_) s += loss;
    return recent_.empty() ? 0 : s / static_cast<double>(recent_.size());
  }

  // Non-finite, or above factor x the recent mean.
  bool diverged(double loss, double factor) const {
    return !std::isfinite(loss) || (!recent_.empty() && loss > factor * mean());
  }

  // Above the trend's value at `step` by more than `sigmas` residual spreads
  // (needs a few points; the spread is floored at 0.1% of the mean).
  bool above_trend(int64_t step, double loss, double sigmas) const {
    const size_t n = recent_.size();
    if (n < 4) return false;
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const auto& [x, y] : recent_) {
      sx += static_cast<double>(x);
      sy += y;
      sxx += static_cast<double>(x) * static_cast<double>(x);
      sxy += static_cast<double>(x) * y;
    }
    const double dn = static_cast<double>(n);
    const double var_x = sxx - sx * sx / dn;
    const double slope = var_x > 0 ? (sxy - sx * sy / dn) / var_x : 0;
    const double intercept = (sy - slope * sx) / dn;
    double ss = 0;
    for (const auto& [x, y] : recent_) {
      const double r = y - (intercept + slope * static_cast<double>(x));
      ss += r * r;
    }
    const double spread = std::max(std::sqrt(ss / (dn - 2)), 1e-3 * std::abs(sy / dn));
    return loss > intercept + slope * static_cast<double>(step) + sigmas * spread;
  }

 private:
  size_t window_;
  std::deque<std::pair<int64_t, double>> recent_;
};

}  // namespace tf_hybrid
