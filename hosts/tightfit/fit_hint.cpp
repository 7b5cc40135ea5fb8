#include "fit_hint.hpp"

#include "byte_size.hpp"

namespace tightfit::host {

std::optional<std::string> fit_hint(const std::string& recipe_path, const MemoryBudget& budget,
                                    int64_t data_bytes) {
  if (budget.scope == MemoryBudget::Scope::kNone || budget.bytes <= 0) return std::nullopt;  // none
  const int64_t data = budget.counts_host_data() ? data_bytes : 0;
  // Under a host budget, data 0 means the data itself was refused.
  if (budget.counts_host_data() && (data <= 0 || data >= budget.bytes)) return std::nullopt;
  std::string why = data > 0 ? "the budget less the " + format_bytes(data) + " the data holds; "
                             : "the device's budget (the data stays on the host); ";
  return "to fit it     tightfit fit " + recipe_path + " --budget " +
         std::to_string(budget.bytes - data) + " --out fitted.toml\n              (" + why +
         "it plans every stack of the installed strategies and writes the fastest that fits)";
}

}  // namespace tightfit::host
