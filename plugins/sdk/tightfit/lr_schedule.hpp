// The learning-rate schedule every built-in trainer schedule offers: linear
// warmup, then cosine, linear or no decay down to a floor. Its recipe keys are
// `lr_schedule_keys`, appended to a schedule's own.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "tightfit/plugin_sdk.hpp"

namespace tf_sdk {

struct LrSchedule {
  int64_t warmup = 0;
  std::string decay = "cosine";
  double min_ratio = 0.1;

  static LrSchedule read(const Host& host) {
    const LrSchedule s{host.get_int("warmup_steps"), host.get_string("decay"),
                       host.get_double("min_lr_ratio")};
    s.warn_if_capped(host);
    return s;
  }

  // A warmup longer than the run keeps the learning rate below what the
  // recipe says for every step: said at the start, not found in the curves.
  void warn_if_capped(const Host& host) const {
    const int64_t total = host.run_info().total_steps;
    if (total <= 0 || warmup <= total) return;
    const double peak = static_cast<double>(total) / static_cast<double>(warmup);
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.2g", peak);
    host.log(TF_LOG_WARN, "[schedule] warmup_steps = " + std::to_string(warmup) +
                              " is longer than the run's " + std::to_string(total) +
                              " steps: the learning rate climbs to " + ratio +
                              " x optimizer.lr at the last step and never reaches it; set "
                              "warmup_steps below the steps (a tenth of them is common)");
  }

  // lr(step) = base * (step+1)/warmup during warmup, then decays to base * min_ratio.
  double at(double base, int64_t step, int64_t total) const {
    if (step < warmup) return base * static_cast<double>(step + 1) / static_cast<double>(warmup);
    if (decay == "constant" || total <= warmup) return base;
    const double progress =
        std::min(1.0, static_cast<double>(step - warmup) /
                          static_cast<double>(std::max<int64_t>(1, total - warmup)));
    const double floor = base * min_ratio;
    if (decay == "linear") return floor + (base - floor) * (1.0 - progress);
    return floor + (base - floor) * 0.5 * (1.0 + std::cos(M_PI * progress));
  }

  // Sets this step's learning rate from the recipe's optimizer.lr; returns it.
  double apply(const Host& host, int64_t step, int64_t total) const {
    double base = 0;
    host.check(host.api()->base_lr(host.ctx(), &base));
    const double lr = at(base, step, total);
    host.check(host.api()->set_lr(host.ctx(), lr));
    return lr;
  }
};

// A schedule's recipe keys: its own, then the learning-rate schedule's.
inline std::vector<tf_config_key> with_lr_schedule_keys(std::initializer_list<tf_config_key> own) {
  std::vector<tf_config_key> keys(own);
  keys.push_back(key("warmup_steps", TF_VALUE_INT, "100", "linear warmup steps", 0, 1e12));
  keys.push_back(key("decay", TF_VALUE_STRING, "\"cosine\"", "decay after warmup", 1, 0,
                     "cosine|linear|constant"));
  keys.push_back(
      key("min_lr_ratio", TF_VALUE_FLOAT, "0.1", "final lr as a fraction of optimizer.lr", 0, 1));
  return keys;
}

// The optimizer update at the end of a step. A non-finite gradient skips the
// update (the kernel changes nothing) and is counted in `skipped`.
inline void step_or_skip(const Host& host, int64_t step, int64_t& skipped) {
  const tf_status st = host.api()->optimizer_step(host.ctx());
  if (st != TF_ERR_NON_FINITE) {
    host.check(st);
    return;
  }
  ++skipped;
  host.log(TF_LOG_WARN, "step " + std::to_string(step) + ": non-finite gradient, update skipped");
  host.log_metric("skipped_steps", static_cast<double>(skipped));
}

// save_state / load_state hooks for a schedule whose checkpointed state is
// its count of skipped steps: S has `Host host` and `int64_t skipped`.
template <class S>
tf_status save_skipped_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<S*>(state);
  return guard(s->host.api(), ctx, [&] {
    s->host.check(s->host.api()->state_put_double(ctx, "skipped", static_cast<double>(s->skipped)));
    return TF_OK;
  });
}
template <class S>
tf_status load_skipped_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<S*>(state);
  return guard(s->host.api(), ctx, [&] {
    double v = 0;
    s->host.check(s->host.api()->state_get_double(ctx, "skipped", &v));
    s->skipped = static_cast<int64_t>(v);
    return TF_OK;
  });
}

}  // namespace tf_sdk
