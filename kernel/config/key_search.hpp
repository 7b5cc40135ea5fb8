// What `tightfit fit` may search, as plugins declare it (tf_key_search and
// tf_plugin_search, ABI 1.23), held in the host's own strings: read from a
// loaded library, or from the scanner's answer for one that is not loaded.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tightfit/plugin_api.h"

namespace tightfit {

struct SearchValue {
  std::string value;  // TOML literal
  std::string label, approximation, claims, needs;
  double quality_penalty = 0;
  uint32_t flags = 0;  // TF_SEARCH_VALUE_*
};

struct KeySearch {
  uint32_t flags = 0;  // TF_SEARCH_KEY_*
  std::vector<SearchValue> values;
  std::string with;
};

struct PluginSearch {
  uint32_t flags = 0;  // TF_SEARCH_PLUGIN_*
  std::string label, approximation, claims, stands_in_for;
  double quality_penalty = 0;
  int32_t stack_order = 0;
};

// Copies of a plugin's declarations; throws std::runtime_error naming what
// is malformed (a struct too small, more values than fit could try).
std::optional<KeySearch> key_search_from_abi(const tf_key_search* search);
std::optional<PluginSearch> plugin_search_from_abi(const tf_plugin_search* search);

// As the scanner's answer carries them (read back checked: it is untrusted).
nlohmann::json key_search_json(const KeySearch& s);
KeySearch key_search_from_json(const nlohmann::json& j);
nlohmann::json plugin_search_json(const PluginSearch& s);
PluginSearch plugin_search_from_json(const nlohmann::json& j);

// A label with "{}" standing for `value_text`.
std::string search_label(const std::string& label, const std::string& value_text);

}  // namespace tightfit
