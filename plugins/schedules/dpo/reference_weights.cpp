#include "reference_weights.hpp"

#include <exception>
#include <stdexcept>

namespace tf_preference {

namespace {

std::vector<std::string> trainable_names(const tf_sdk::Host& host) {
  std::vector<std::string> names;
  for (const std::string& name : host.param_names())
    if (host.param_info(name).trainable != 0) names.push_back(name);
  return names;
}

// Where the copy of `live` is kept: beside it, or in host memory (pinned
// when the weight is on a GPU, so the swap's copies go at the bus's speed).
at::Tensor kept_copy(const at::Tensor& t, const at::Tensor& live, bool on_host) {
  at::TensorOptions where = live.options();
  if (on_host) where = where.device(at::kCPU).pinned_memory(live.is_cuda());
  at::Tensor copy = at::empty(live.sizes(), where);
  copy.copy_(t);
  return copy;
}

}  // namespace

void ReferenceWeights::take(const tf_sdk::Host& host, bool on_host) {
  at::NoGradGuard no_grad;
  const tf_sdk::MemoryCategory category(host, TF_MEM_WEIGHTS);
  std::vector<std::pair<std::string, at::Tensor>> copy;
  for (const std::string& name : trainable_names(host)) {
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
    copy.emplace_back(name, kept_copy(live, live, on_host));
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
void ReferenceWeights::swap(const tf_sdk::Host& host) {
  at::NoGradGuard no_grad;
  const tf_sdk::MemoryCategory category(host, TF_MEM_TRANSIENT);
  for (auto& [name, kept] : weights_) {
    at::Tensor live = host.param_storage(name);
    const at::Tensor was = live.detach().clone();
    live.detach().copy_(kept);
    kept.copy_(was);
  }
}

void ReferenceWeights::save(const tf_sdk::Host& host) const {
  for (const auto& [name, kept] : weights_) host.save_tensor("reference." + name, kept);
}

bool ReferenceWeights::load(const tf_sdk::Host& host, bool on_host) {
  std::vector<std::pair<std::string, at::Tensor>> loaded;
  const std::vector<std::string> names = trainable_names(host);
  for (const std::string& name : names) {
    std::optional<at::Tensor> t = host.find_saved_tensor("reference." + name);
    if (!t) break;
    const at::Tensor live = host.param_storage(name);
    if (t->sizes() != live.sizes())
      throw std::runtime_error("the checkpoint's reference weight " + name +
                               " has another shape than the model's");
    const tf_sdk::MemoryCategory category(host, TF_MEM_WEIGHTS);
    loaded.emplace_back(name, kept_copy(*t, live, on_host));
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

int64_t ReferenceWeights::planned_bytes(const tf_sdk::Host& host) {
  int64_t bytes = 0;
  for (const std::string& name : trainable_names(host))
    bytes += tf_sdk::dense_bytes(host.param_info(name));
  return bytes;
}

ReferenceSwapped::~ReferenceSwapped() {
  try {
    w_.swap(host_);
  } catch (const std::exception&) {
    // A destructor must not throw; the run stops on the error that got here.
  }
}

}  // namespace tf_preference
