// The reference model of the schedules that have one (dpo, kto), as TRL
// makes it: with adapters, the base with them off (a PeftModel's
// disable_adapter()); without, the trainable weights as they were before
// the first update. That copy is kept by the schedule on the device or in
// host memory (reference_weights.hpp), which checkpoints carry, or declared
// as frozen parameters the strategies place (reference_tier = "weights",
// ABI 1.19's declare_param_copies: quantize stores them compact, offload
// keeps a block's in host memory or on disk), which the reference pass reads
// instead of the trained ones (tf_pass.param_copies).
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

#include "tightfit/plugin_sdk.hpp"
#include "tightfit/preference/reference_weights.hpp"

namespace tf_preference {

inline tf_config_key reference_tier_key() {
  return tf_sdk::key("reference_tier", TF_VALUE_STRING, "\"device\"",
                     "where a full fine-tune keeps its reference copy of the trainable weights: "
                     "device, host (host memory, pinned on a GPU; each weight brought in for "
                     "the reference pass and back out), or weights (frozen weights of the "
                     "model, placed by the [[strategy]] list: quantize stores them compact, "
                     "offload keeps the blocks' in host memory or on disk)",
                     1, 0, "device|host|weights");
}

// The copies' names: "reference." + the parameter's.
inline constexpr const char* kReferencePrefix = "reference.";

class ReferenceModel {
 public:
  explicit ReferenceModel(std::string schedule) : schedule_(std::move(schedule)) {}
  const std::string& schedule() const { return schedule_; }

  // reference_tier, refused where there is no copy to place: with the
  // reference's log-probs precomputed (none is kept), and, once the
  // strategies are known, with adapters (adapters()).
  // reference_tier = "weights" declares the copies here, in the schedule's
  // create (the strategies are configured: adapters are known).
  void read(const tf_sdk::Host& host, bool precompute) {
    const std::string tier = host.get_string("reference_tier");
    on_host_ = tier == "host";
    if (tier != "device" && precompute)
      throw std::invalid_argument(
          schedule_ + ": reference_tier = \"" + tier +
          "\" places a full fine-tune's reference copy, and "
          "precompute_ref_log_probs = true keeps none: leave one of them out");
    if (tier == "weights") declare_copies(host);
  }

  // Whether a strategy holds adapters (parameters flagged TF_PARAM_ADAPTER:
  // read, not probed by switching them off and on). The strategies do not
  // change during a run: asked once.
  bool adapters(const tf_sdk::Host& host) {
    if (copies_) return false;  // refused with adapters when declared
    if (!adapters_) {
      const bool adapters = holds_adapters(host);
      if (adapters && on_host_)
        throw std::invalid_argument(
            schedule_ +
            ": reference_tier = \"host\" places a full fine-tune's reference copy, and with "
            "adapters the reference is the base with them off, no copy: leave reference_tier "
            "out");
      adapters_ = adapters;
    }
    return *adapters_;
  }

  // Before a pass at `step` (or an evaluation, step -1): a full
  // fine-tune's copy is taken before the first update; a resumed run has
  // read it from its checkpoint (load).
  void keep(const tf_sdk::Host& host, int64_t step = -1) {
    if (copies_ || !weights_.empty() || adapters(host)) return;
    if (step > 0)
      throw std::logic_error(schedule_ + ": no reference weights at step " + std::to_string(step));
    weights_.take(host, on_host_);
  }

  // f(weights) run as the reference model: the passes f makes read
  // `weights` (adapters off, or the declared copies: each pass's own, ABI
  // 1.20), or the schedule's copy swapped in, the policy back however it
  // ends.
  template <class F>
  auto run(const tf_sdk::Host& host, F&& f) {
    if (copies_) return f(tf_sdk::PassWeights{false, kReferencePrefix});
    if (weights_.empty()) {
      // Nothing turned off would score the policy as its own reference.
      if (!adapters(host))
        throw std::logic_error(schedule_ +
                               ": a reference pass with neither adapters nor a reference copy");
      return f(tf_sdk::PassWeights{true, ""});
    }
    const ReferenceSwapped in(weights_, host);
    return f(tf_sdk::PassWeights{});
  }

  // The copies as parameters are the kernel's to save (frozen weights).
  void save(const tf_sdk::Host& host) const {
    if (!copies_) weights_.save(host);
  }
  void load(const tf_sdk::Host& host) {
    if (copies_) return;
    if (!weights_.load(host, on_host_) && !adapters(host))
      throw std::runtime_error(
          "the checkpoint holds no reference weights for " + schedule_ +
          "'s full fine-tune (it was saved with adapters, or by another schedule): resume with "
          "the recipe that saved it");
  }
  // What the plan adds: a full fine-tune's copy of the trainable weights,
  // in its tier. The swap's temporary (one weight) is left out: the
  // reference pass runs before the policy's, below the step's peak.
  // Declared copies are parameters: the plan counts them where the
  // strategies put them.
  void plan(const tf_sdk::Host& host, tf_memory_estimate* out) {
    if (copies_ || adapters(host)) return;
    out->delta_bytes[on_host_ ? TF_TIER_HOST : TF_TIER_DEVICE][TF_MEM_WEIGHTS] +=
        ReferenceWeights::planned_bytes(host);
  }

 private:
  static bool holds_adapters(const tf_sdk::Host& host) {
    for (const std::string& name : host.param_names())
      if (host.param_info(name).flags & TF_PARAM_ADAPTER) return true;
    return false;
  }

  void declare_copies(const tf_sdk::Host& host) {
    if (holds_adapters(host))
      throw std::invalid_argument(
          schedule_ +
          ": reference_tier = \"weights\" places a full fine-tune's reference copy, and "
          "with adapters the reference is the base with them off, no copy: leave "
          "reference_tier out");
    const int32_t n = host.declare_param_copies(kReferencePrefix);
    if (n < 0)
      throw std::invalid_argument(schedule_ +
                                  ": reference_tier = \"weights\" needs a tightfit with ABI "
                                  "1.19's declare_param_copies");
    if (n == 0)
      throw std::invalid_argument(schedule_ +
                                  ": nothing is trainable, so there is no policy to train");
    copies_ = true;
  }

  std::string schedule_;
  ReferenceWeights weights_;
  bool copies_ = false;
  std::optional<bool> adapters_;
  bool on_host_ = false;
};

}  // namespace tf_preference
