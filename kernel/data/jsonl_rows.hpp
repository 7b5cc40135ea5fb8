// JSONL rows read one at a time from a file or a folder of .jsonl files
// (sorted, recursive), each named file:line for the messages about it.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace tightfit {

// Calls `row` for each non-blank line of `spec` (relative to `base_dir`)
// parsed as JSON; returns how many rows there were. Throws
// std::invalid_argument naming the file (and line) when a file cannot be
// read or a line is not JSON, and DataOutOfMemory (chat_data.hpp) naming
// file:line and the stage when memory runs out.
size_t for_each_jsonl_row(
    const std::string& spec, const std::string& base_dir,
    const std::function<void(const nlohmann::ordered_json& row, const std::string& where)>& row);

}  // namespace tightfit
