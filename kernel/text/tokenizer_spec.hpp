// Reading a tokenizer.json's normalizer, pre-tokenizer and decoder specs:
// the helpers tokenizer_steps.cpp and tokenizer_decoder.cpp share (internal).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "pcre_regex.hpp"

namespace tightfit::tokenizer_spec {

using nlohmann::json;

// A "Sequence" deeper than this is a damaged or hostile file (real ones nest 1).
constexpr int kMaxSequenceDepth = 16;

inline std::string type_of(const json& j, const std::string& source, const char* part) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    throw std::invalid_argument(source + ": a " + part + " without a \"type\"");
  return j["type"].get<std::string>();
}

// Calls `each` on every step of `spec`, flattening "Sequence" (under `list_key`).
template <typename Each>
void flatten(const json& spec, const std::string& source, const char* part, const char* list_key,
             Each&& each, int depth = 0) {
  if (depth > kMaxSequenceDepth)
    throw std::invalid_argument(source + ": " + part + " Sequence nested deeper than " +
                                std::to_string(kMaxSequenceDepth) + " levels");
  const std::string type = type_of(spec, source, part);
  if (type != "Sequence") return each(type, spec);
  const json& list = spec.at(list_key);
  if (!list.is_array())
    throw std::invalid_argument(source + ": " + part + " Sequence needs a \"" + list_key +
                                "\" list");
  for (const auto& s : list) flatten(s, source, part, list_key, each, depth + 1);
}

// The pattern of a Split/Replace: {"String": "..."} or {"Regex": "..."}.
std::unique_ptr<Pcre2Regex> pattern_of(const json& step, const std::string& source);

std::string replace_all(const std::string& text, const Pcre2Regex& re, const std::string& with);

// Metaspace's prepend_scheme (or the older add_prefix_space).
enum class Prepend { kAlways, kFirst, kNever };
Prepend prepend_scheme_of(const json& step, const std::string& source);

}  // namespace tightfit::tokenizer_spec
