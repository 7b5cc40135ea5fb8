// The reference model of the schedules that have one (dpo, kto), as TRL
// makes it: with adapters, the base with them off (a PeftModel's
// disable_adapter()); without, the trainable weights as they were before
// the first update (reference_weights.hpp), which checkpoints carry.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

#include "reference_weights.hpp"
#include "tightfit/plugin_sdk.hpp"

namespace tf_preference {

class ReferenceModel {
 public:
  explicit ReferenceModel(std::string schedule) : schedule_(std::move(schedule)) {}

  // Whether a strategy holds adapters. The strategies do not change during
  // a run: asked once.
  bool adapters(const tf_sdk::Host& host) {
    if (!adapters_) {
      adapters_ = host.set_adapters_enabled(false) > 0;
      if (*adapters_) host.set_adapters_enabled(true);
    }
    return *adapters_;
  }

  // Before a pass at `step` (or an evaluation, step -1): a full
  // fine-tune's copy is taken before the first update; a resumed run has
  // read it from its checkpoint (load).
  void keep(const tf_sdk::Host& host, int64_t step = -1) {
    if (!weights_.empty() || adapters(host)) return;
    if (step > 0)
      throw std::logic_error(schedule_ + ": no reference weights at step " + std::to_string(step));
    weights_.take(host);
  }

  // f() run as the reference model, the policy back however it ends.
  template <class F>
  auto run(const tf_sdk::Host& host, F&& f) {
    if (weights_.empty()) {
      const AdaptersOff off(host, schedule_);
      return f();
    }
    const ReferenceSwapped in(weights_, host);
    return f();
  }

  void save(const tf_sdk::Host& host) const { weights_.save(host); }
  void load(const tf_sdk::Host& host) {
    if (!weights_.load(host) && !adapters(host))
      throw std::runtime_error(
          "the checkpoint holds no reference weights for " + schedule_ +
          "'s full fine-tune (it was saved with adapters, or by another schedule): resume with "
          "the recipe that saved it");
  }
  // What the plan adds: a full fine-tune's copy of the trainable weights.
  int64_t planned_bytes(const tf_sdk::Host& host) {
    return adapters(host) ? 0 : ReferenceWeights::planned_bytes(host);
  }

 private:
  // The adapters off while a reference pass runs, back on however it ends.
  class AdaptersOff {
   public:
    AdaptersOff(const tf_sdk::Host& host, const std::string& schedule) : host_(host) {
      // Nothing turned off would score the policy as its own reference.
      if (host_.set_adapters_enabled(false) == 0)
        throw std::logic_error(schedule +
                               ": a reference pass with neither adapters nor a reference copy");
    }
    ~AdaptersOff() {
      try {
        host_.set_adapters_enabled(true);
      } catch (...) {
        // Reported by the host's last error; a destructor must not throw.
      }
    }
    AdaptersOff(const AdaptersOff&) = delete;
    AdaptersOff& operator=(const AdaptersOff&) = delete;

   private:
    const tf_sdk::Host& host_;
  };

  std::string schedule_;
  ReferenceWeights weights_;
  std::optional<bool> adapters_;
};

}  // namespace tf_preference
