#include "checkpoint_checks.hpp"

#include <algorithm>
#include <stdexcept>

namespace tightfit {

std::string first_non_finite(const std::map<std::string, at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  for (const auto& [name, t] : tensors)
    if (t.defined() && t.is_floating_point() && t.numel() > 0 && !t.isfinite().all().item<bool>())
      return name;
  return {};
}

void validate_optimizer_state(const std::map<std::string, at::Tensor>& state,
                              const ParamStore& store, const std::vector<std::string>& slots,
                              const std::string& file) {
  auto fail = [&](const std::string& entry, const std::string& what) {
    throw std::runtime_error(file + ": \"" + entry + "\" " + what);
  };
  at::NoGradGuard no_grad;
  for (const auto& [key, t] : state) {
    // "<parameter>.<slot>", the parameter's name holding dots of its own.
    const auto dot = key.rfind('.');
    const std::string slot = dot == std::string::npos ? "" : key.substr(dot + 1);
    if (dot == std::string::npos || std::find(slots.begin(), slots.end(), slot) == slots.end())
      fail(
          key, "is not a state this optimizer keeps (its slots: " + [&] {
            std::string s;
            for (const auto& x : slots) s += (s.empty() ? "" : ", ") + x;
            return s.empty() ? std::string("none") : s;
          }() + ")");
    const Param* p = store.find(key.substr(0, dot));
    if (!p) fail(key, "names no parameter of this model");
    if (t.scalar_type() != at::kFloat)
      fail(key, std::string("is ") + c10::toString(t.scalar_type()) + ", not float32");
    if (p->residency != TF_TIER_SHARDED && t.sizes() != at::IntArrayRef(p->shape))
      fail(key, "has shape " + c10::str(t.sizes()) + " but the parameter has " +
                    c10::str(at::IntArrayRef(p->shape)));
    if (t.numel() > 0 && !t.isfinite().all().item<bool>()) fail(key, "holds a NaN or infinity");
    if (slot == "exp_avg_sq" && t.numel() > 0 && t.lt(0).any().item<bool>())
      fail(key, "holds a negative second moment");
  }
}

}  // namespace tightfit
