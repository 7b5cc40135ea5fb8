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
