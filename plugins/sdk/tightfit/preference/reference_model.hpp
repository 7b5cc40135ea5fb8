// The reference model of the schedules that have one (dpo, kto), as TRL
// makes it: with adapters, the base with them off (a PeftModel's
// disable_adapter()); without, a frozen copy of the trainable weights as
// training finds them (create_reference_model). The copies are parameters
// the passes read instead of the trained ones (tf_pass.param_copies):
// kept by the host, dense, on the device or in host memory
// (reference_tier = "device" | "host", ABI 1.24's
// declare_kept_param_copies), or frozen weights the strategies place
// (reference_tier = "weights", ABI 1.19's declare_param_copies: quantize
// stores them compact, offload keeps a block's in host memory or on disk).
// Either way the kernel checkpoints them and the plan counts them.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

#include "tightfit/plugin_sdk.hpp"

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
  // reference's log-probs precomputed (none is kept) and with adapters.
  // Declares the copies (a full fine-tune's, not precomputed) here, in the
  // schedule's create: the strategies are configured, adapters are known.
  void read(const tf_sdk::Host& host, bool precompute) {
    const std::string tier = host.get_string("reference_tier");
    if (tier != "device" && precompute)
      throw std::invalid_argument(
          schedule_ + ": reference_tier = \"" + tier +
          "\" places a full fine-tune's reference copy, and "
          "precompute_ref_log_probs = true keeps none: leave one of them out");
    adapters_ = holds_adapters(host);
    if (*adapters_) {
      if (tier != "device")
        throw std::invalid_argument(
            schedule_ + ": reference_tier = \"" + tier +
            "\" places a full fine-tune's reference copy, and with adapters the reference is "
            "the base with them off, no copy: leave reference_tier out");
      return;
    }
    if (precompute) return;
    if (tier == "weights") {
      declare(host.declare_param_copies(kReferencePrefix), "ABI 1.19's declare_param_copies");
    } else {
      tier_ = tier == "host" ? TF_TIER_HOST : TF_TIER_DEVICE;
      declare(host.declare_kept_param_copies(kReferencePrefix, *tier_),
              "ABI 1.24's declare_kept_param_copies");
    }
  }

  // Whether a strategy holds adapters (parameters flagged TF_PARAM_ADAPTER:
  // read, not probed by switching them off and on), as read() found them.
  bool adapters(const tf_sdk::Host& host) {
    if (!adapters_) adapters_ = holds_adapters(host);
    return *adapters_;
  }

  // Before a pass at `step` (or an evaluation, step -1): the copies the
  // host keeps are taken from weights a strategy keeps dense on the device
  // (refused by name otherwise), when the first pass reads them.
  void keep(const tf_sdk::Host& host, int64_t /*step*/ = -1) {
    if (!tier_ || checked_) return;
    bool on_gpu = false;
    for (const std::string& name : host.param_names()) {
      const tf_param_info info = host.param_info(name);
      if (info.trainable == 0 || (info.flags & TF_PARAM_ADAPTER)) continue;
      on_gpu = on_gpu || host.param_storage(name).is_cuda();
      if (info.format != TF_FORMAT_DENSE || info.residency != TF_TIER_DEVICE)
        throw std::invalid_argument(
            "the reference for a full fine-tune is a frozen copy of the trainable weights, and " +
            name +
            " is not a dense weight in the device tier (a strategy moves or converts it): set "
            "reference_tier = \"weights\" (the copy declared as frozen weights, which the "
            "strategies place too), train adapters ([[strategy]] plugin = \"lora\") or leave "
            "that strategy out");
    }
    if (*tier_ == TF_TIER_HOST && !on_gpu)
      host.log(TF_LOG_WARN,
               "reference_tier = \"host\" on a CPU run keeps the reference copy in the same "
               "memory as the weights (no saving)");
    checked_ = true;
  }

  // f(weights) run as the reference model: the passes f makes read
  // `weights`, each pass its own (ABI 1.20): the copies, or the adapters off.
  template <class F>
  auto run(const tf_sdk::Host& host, F&& f) {
    if (copies_) return f(tf_sdk::PassWeights{false, kReferencePrefix});
    // Nothing turned off would score the policy as its own reference.
    if (!adapters(host))
      throw std::logic_error(schedule_ +
                             ": a reference pass with neither adapters nor a reference copy");
    return f(tf_sdk::PassWeights{true, ""});
  }

  // The copies are parameters: the kernel saves and loads them. A
  // checkpoint saved before ABI 1.24 held the device and host tiers' copy
  // in the schedule's state, under the same names: handed to the host's.
  void save(const tf_sdk::Host&) const {}
  void load(const tf_sdk::Host& host) {
    if (!tier_) return;
    for (const std::string& name : host.param_names()) {
      const tf_param_info info = host.param_info(name);
      if (info.trainable == 0 || (info.flags & TF_PARAM_ADAPTER)) continue;
      const std::string copy = kReferencePrefix + name;
      if (std::optional<at::Tensor> kept = host.find_saved_tensor(copy))
        host.set_param_storage(copy, *kept, TF_FORMAT_DENSE, *tier_);
    }
  }
  // The copies are parameters: the plan counts them in their tier.
  void plan(const tf_sdk::Host&, tf_memory_estimate*) {}

 private:
  static bool holds_adapters(const tf_sdk::Host& host) {
    for (const std::string& name : host.param_names())
      if (host.param_info(name).flags & TF_PARAM_ADAPTER) return true;
    return false;
  }

  void declare(int32_t n, const char* service) {
    if (n < 0)
      throw std::invalid_argument(schedule_ + ": reference_tier needs a tightfit with " + service);
    if (n == 0)
      throw std::invalid_argument(schedule_ +
                                  ": nothing is trainable, so there is no policy to train");
    copies_ = true;
  }

  std::string schedule_;
  bool copies_ = false;               // declared: the reference passes read them
  std::optional<tf_residency> tier_;  // kept by the host, in this tier
  std::optional<bool> adapters_;
  bool checked_ = false;
};

}  // namespace tf_preference
