// A full fine-tune's reference model for dpo: the trainable weights as they
// were before the first update, a frozen copy the schedule keeps (TRL's
// create_reference_model: a deep copy of the model when the trainer
// starts). The reference pass swaps the copy in a weight at a time and the
// policy's weights back after it, bit for bit; checkpoints carry the copy,
// so a resumed run's reference is the same model. The copy lives on the
// device or, to leave the device the policy's memory alone, in host memory
// (pinned on a GPU run): then each weight crosses the bus twice a
// reference pass, in and back out.
#pragma once

#include <ATen/ATen.h>

#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tightfit/plugin_sdk.hpp"

namespace tf_preference {

class ReferenceWeights {
 public:
  bool empty() const { return weights_.empty(); }
  // Copies every trainable parameter (counted as weights). Refuses, by
  // name, a parameter that is not a dense tensor in the device tier: its
  // tier's strategy owns how it is read, and the swap would go around it.
  // on_host: the copy in host memory rather than beside the weight.
  void take(const tf_sdk::Host& host, bool on_host);
  // Exchanges the copy and the live weights, a weight at a time (one
  // weight's temporary at most); calling it again swaps back.
  void swap(const tf_sdk::Host& host);
  // Inside save_state / load_state, under "reference.<name>". load returns
  // false when the checkpoint holds none (a run with adapters).
  void save(const tf_sdk::Host& host) const;
  bool load(const tf_sdk::Host& host, bool on_host);
  // The copy's bytes, for the plan: every trainable parameter's dense bytes.
  static int64_t planned_bytes(const tf_sdk::Host& host);

 private:
  std::vector<std::pair<std::string, at::Tensor>> weights_;
};

// The reference weights in while a reference pass runs, the policy's back
// however it ends.
class ReferenceSwapped {
 public:
  ReferenceSwapped(ReferenceWeights& w, const tf_sdk::Host& host) : w_(w), host_(host) {
    w_.swap(host_);
  }
  ~ReferenceSwapped();
  ReferenceSwapped(const ReferenceSwapped&) = delete;
  ReferenceSwapped& operator=(const ReferenceSwapped&) = delete;

 private:
  ReferenceWeights& w_;
  const tf_sdk::Host& host_;
};

}  // namespace tf_preference

// Definitions (the SDK is header-only).
namespace tf_preference {

namespace detail {

inline std::vector<std::string> trainable_names(const tf_sdk::Host& host) {
  std::vector<std::string> names;
  for (const std::string& name : host.param_names())
    if (host.param_info(name).trainable != 0) names.push_back(name);
  return names;
}

// Where the copy of `live` is kept: beside it, or in host memory (pinned
// when the weight is on a GPU, so the swap's copies go at the bus's speed).
inline at::Tensor kept_copy(const at::Tensor& t, const at::Tensor& live, bool on_host) {
  at::TensorOptions where = live.options();
  if (on_host) where = where.device(at::kCPU).pinned_memory(live.is_cuda());
  at::Tensor copy = at::empty(live.sizes(), where);
  copy.copy_(t);
  return copy;
}

}  // namespace detail

inline void ReferenceWeights::take(const tf_sdk::Host& host, bool on_host) {
  at::NoGradGuard no_grad;
  const tf_sdk::MemoryCategory category(host, TF_MEM_WEIGHTS);
  std::vector<std::pair<std::string, at::Tensor>> copy;
  for (const std::string& name : detail::trainable_names(host)) {
    const tf_param_info info = host.param_info(name);
    if (info.format != TF_FORMAT_DENSE || info.residency != TF_TIER_DEVICE)
      throw std::invalid_argument(
          "the reference for a full fine-tune is a frozen copy of the trainable weights, and " +
          name +
          " is not a dense weight in the device tier (a strategy moves or converts it): set "
          "reference_tier = \"weights\" (the copy declared as frozen weights, which the "
          "strategies place too), train adapters ([[strategy]] plugin = \"lora\") or leave "
          "that strategy out");
    const at::Tensor live = host.param_storage(name).detach();
    copy.emplace_back(name, detail::kept_copy(live, live, on_host));
  }
  if (copy.empty())
    throw std::invalid_argument("dpo: nothing is trainable, so there is no policy to train");
  if (on_host && !copy.front().second.is_pinned())
    host.log(TF_LOG_WARN,
             "reference_tier = \"host\" on a CPU run keeps the reference copy in the same "
             "memory as the weights (no saving)");
  weights_ = std::move(copy);
}

// The same three copies wherever the copy lives: copy_ crosses devices
// (synchronously into and out of pinned memory).
inline void ReferenceWeights::swap(const tf_sdk::Host& host) {
  at::NoGradGuard no_grad;
  const tf_sdk::MemoryCategory category(host, TF_MEM_TRANSIENT);
  for (auto& [name, kept] : weights_) {
    at::Tensor live = host.param_storage(name);
    const at::Tensor was = live.detach().clone();
    live.detach().copy_(kept);
    kept.copy_(was);
  }
}

inline void ReferenceWeights::save(const tf_sdk::Host& host) const {
  for (const auto& [name, kept] : weights_) host.save_tensor("reference." + name, kept);
}

inline bool ReferenceWeights::load(const tf_sdk::Host& host, bool on_host) {
  std::vector<std::pair<std::string, at::Tensor>> loaded;
  const std::vector<std::string> names = detail::trainable_names(host);
  for (const std::string& name : names) {
    std::optional<at::Tensor> t = host.find_saved_tensor("reference." + name);
    if (!t) break;
    const at::Tensor live = host.param_storage(name);
    if (t->sizes() != live.sizes())
      throw std::runtime_error("the checkpoint's reference weight " + name +
                               " has another shape than the model's");
    const tf_sdk::MemoryCategory category(host, TF_MEM_WEIGHTS);
    loaded.emplace_back(name, detail::kept_copy(*t, live, on_host));
  }
  if (loaded.empty()) return false;
  if (loaded.size() != names.size())
    throw std::runtime_error("the checkpoint holds dpo's reference weights for " +
                             std::to_string(loaded.size()) + " of the " +
                             std::to_string(names.size()) +
                             " trainable parameters: it is damaged; resume from another");
  weights_ = std::move(loaded);
  return true;
}

inline int64_t ReferenceWeights::planned_bytes(const tf_sdk::Host& host) {
  int64_t bytes = 0;
  for (const std::string& name : detail::trainable_names(host))
    bytes += tf_sdk::dense_bytes(host.param_info(name));
  return bytes;
}

inline ReferenceSwapped::~ReferenceSwapped() {
  try {
    w_.swap(host_);
  } catch (const std::exception&) {
    // A destructor must not throw; the run stops on the error that got here.
  }
}

}  // namespace tf_preference
