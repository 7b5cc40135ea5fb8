// Reading a Hugging Face config.json, for model plugins that take their shape
// from one. Header-only; plugins that include it link nlohmann_json.
//
// A downloaded config is untrusted input: every value is read typed and
// range-checked like a recipe key (a float is never cast into an integer,
// NaN and infinities never pass), and every message names the file and key.
#pragma once

#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>

namespace tf_sdk {

struct HfConfig {
  nlohmann::json json;
  std::string source;  // the file, for messages

  bool has(const char* key) const { return json.contains(key) && !json[key].is_null(); }

  // A required integer in [lo, hi]; throws std::invalid_argument naming the file.
  int64_t need(const char* key, int64_t lo = 1,
               int64_t hi = std::numeric_limits<int64_t>::max()) const {
    if (!has(key)) throw std::invalid_argument(source + " lacks the integer \"" + key + "\"");
    return checked_int(key, lo, hi);
  }
  // An optional integer (absent or null: `fallback`) in [lo, hi].
  int64_t get(const char* key, int64_t fallback, int64_t lo = 0,
              int64_t hi = std::numeric_limits<int64_t>::max()) const {
    return has(key) ? checked_int(key, lo, hi) : fallback;
  }
  // An optional finite number (absent or null: `fallback`) in (lo, hi] when
  // `lo_open`, else [lo, hi].
  double real(const char* key, double fallback, double lo, double hi, bool lo_open = true) const {
    return has(key) ? real_of(json[key], key, lo, hi, lo_open) : fallback;
  }
  double real_of(const nlohmann::json& v, const std::string& key, double lo, double hi,
                 bool lo_open = true) const {
    if (!v.is_number()) throw std::invalid_argument(source + ": \"" + key + "\" must be a number");
    const double x = v.get<double>();
    if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo))
      throw std::invalid_argument(source + ": \"" + key + "\" = " + std::to_string(x) +
                                  " is out of range " + (lo_open ? "(" : "[") + fmt(lo) + ", " +
                                  fmt(hi) + "]");
    return x;
  }
  // An optional boolean (absent or null: `fallback`).
  bool flag(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!json[key].is_boolean())
      throw std::invalid_argument(source + ": \"" + key + "\" must be true or false");
    return json[key].get<bool>();
  }
  // An optional string (absent or null: `fallback`).
  std::string text(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!json[key].is_string())
      throw std::invalid_argument(source + ": \"" + key + "\" must be a string");
    return json[key].get<std::string>();
  }

 private:
  static std::string fmt(double x) {
    std::ostringstream s;
    s << x;
    return s.str();
  }
  int64_t checked_int(const char* key, int64_t lo, int64_t hi) const {
    const nlohmann::json& v = json[key];
    // Not get<int64_t> on any number: a float (1e30) would be cast, not refused.
    if (!v.is_number_integer())
      throw std::invalid_argument(source + ": \"" + key + "\" must be an integer");
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw std::invalid_argument(source + ": \"" + key + "\" is out of range");
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi)
      throw std::invalid_argument(source + ": \"" + key + "\" = " + std::to_string(x) +
                                  " is out of range [" + std::to_string(lo) + ", " +
                                  std::to_string(hi) + "]");
    return x;
  }
};

// `path`: a config.json or a model folder holding one. Refuses anything but a
// regular file of at most 16 MiB (a FIFO would hang the read) and JSON nested
// deeper than 64 levels (real configs nest 3).
inline HfConfig read_hf_config(const std::string& path) {
  std::filesystem::path p = path;
  if (std::filesystem::is_directory(p)) p /= "config.json";
  std::error_code ec;
  const auto st = std::filesystem::status(p, ec);
  if (ec || !std::filesystem::exists(st))
    throw std::invalid_argument("cannot read Hugging Face config " + p.string() +
                                " (no such file)");
  if (!std::filesystem::is_regular_file(st))
    throw std::invalid_argument("Hugging Face config " + p.string() + " is not a regular file");
  if (std::filesystem::file_size(p, ec) > (16u << 20))
    throw std::invalid_argument("Hugging Face config " + p.string() +
                                " is larger than 16 MiB: not a config.json");
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::invalid_argument("cannot read Hugging Face config " + p.string());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char ch : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (ch == '\\')
        escaped = true;
      else if (ch == '"')
        in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '{' || ch == '[') {
      deepest = std::max(deepest, ++depth);
    } else if (ch == '}' || ch == ']') {
      --depth;
    }
  }
  if (deepest > 64)
    throw std::invalid_argument(p.string() + " nests deeper than 64 levels: not a config.json");
  HfConfig c{nlohmann::json::parse(text, nullptr, false), p.string()};
  if (c.json.is_discarded() || !c.json.is_object())
    throw std::invalid_argument(c.source + " is not a JSON object");
  return c;
}

}  // namespace tf_sdk
