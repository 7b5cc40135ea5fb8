// Reading a Hugging Face config.json, for model plugins that take their shape
// from one. Header-only; plugins that include it link nlohmann_json.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace tf_sdk {

struct HfConfig {
  nlohmann::json json;
  std::string source;  // the file, for messages

  // A required integer; throws std::invalid_argument naming the file.
  int64_t need(const char* key) const {
    if (!json.contains(key) || !json[key].is_number_integer())
      throw std::invalid_argument(source + " lacks the integer \"" + std::string(key) + "\"");
    return json[key].get<int64_t>();
  }
  // An optional integer (absent or null: `fallback`).
  int64_t get(const char* key, int64_t fallback) const {
    return json.contains(key) && json[key].is_number_integer() ? json[key].get<int64_t>()
                                                               : fallback;
  }
};

// `path`: a config.json or a model folder holding one.
inline HfConfig read_hf_config(const std::string& path) {
  std::filesystem::path p = path;
  if (std::filesystem::is_directory(p)) p /= "config.json";
  std::ifstream in(p);
  if (!in) throw std::invalid_argument("cannot read Hugging Face config " + p.string());
  HfConfig c{nlohmann::json::parse(in, nullptr, false), p.string()};
  if (c.json.is_discarded() || !c.json.is_object())
    throw std::invalid_argument(c.source + " is not a JSON object");
  return c;
}

}  // namespace tf_sdk
