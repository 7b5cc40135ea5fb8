// JSON from outside the process (model folders, checkpoints, data rows,
// plugins' metadata) is untrusted: parsed with a depth bound, so that no
// later copy, dump or destruction recurses past it, and every error names
// where the text came from. Values go into messages only as short excerpts.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace tightfit {

// Real configs, tokenizers and manifests nest under 10 levels.
constexpr int kMaxJsonDepth = 64;

// Throws std::invalid_argument naming `source`: not valid JSON (with the
// byte), or nested deeper than `max_depth`.
nlohmann::json parse_json(const std::string& text, const std::string& source,
                          int max_depth = kMaxJsonDepth);
nlohmann::ordered_json parse_ordered_json(const std::string& text, const std::string& source,
                                          int max_depth = kMaxJsonDepth);

// A regular file of at most `max_bytes` (checked on the opened descriptor),
// parsed as above. Throws std::invalid_argument naming `path`.
nlohmann::json read_json_file(const std::string& path, size_t max_bytes,
                              int max_depth = kMaxJsonDepth);

// A value for a message: its JSON text cut to `max_chars`.
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 80);

}  // namespace tightfit
