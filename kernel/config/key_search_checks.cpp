#include "key_search_checks.hpp"

#include <algorithm>
#include <stdexcept>

namespace tightfit {

void check_key_searches(const std::vector<KeySpec>& keys, const std::string& plugin) {
  auto find = [&](const std::string& name) {
    return std::find_if(keys.begin(), keys.end(), [&](const KeySpec& k) { return k.name == name; });
  };
  auto numeric = [](const KeySpec& k) {
    return (k.type == TF_VALUE_INT || k.type == TF_VALUE_FLOAT) && k.default_value;
  };
  for (const KeySpec& k : keys) {
    if (!k.search) continue;
    const std::string where = plugin + "." + k.name + "'s search";
    if (!k.search->with.empty()) {
      const auto with = find(k.search->with);
      if (with == keys.end() || with->name == k.name)
        throw std::runtime_error(where + " names \"" + k.search->with +
                                 "\", which is not another key of the plugin");
      if ((k.search->flags & TF_SEARCH_KEY_FOLLOWS) && !(numeric(k) && numeric(*with)))
        throw std::runtime_error(where + " follows \"" + k.search->with +
                                 "\": both must be numbers with defaults");
    }
    for (const SearchValue& v : k.search->values) {
      try {
        const Recipe r = Recipe::parse(k.name + " = " + v.value, where);
        r.validate(&r.root(), plugin, {k});
      } catch (const std::exception& e) {
        throw std::runtime_error(where + ": value " + v.value + " is not one the key takes (" +
                                 e.what() + ")");
      }
    }
  }
}

}  // namespace tightfit
