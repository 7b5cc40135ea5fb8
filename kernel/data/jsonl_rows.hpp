// JSONL rows read one at a time from a file or a folder of .jsonl files
// (sorted, recursive), each named file:line for the messages about it.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace tightfit {

// The machine ran out of memory while preparing the data: what() names the
// file (and line) and the stage (reading, parsing, rendering, tokenizing).
class DataOutOfMemory : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Calls `row` for each non-blank line of `spec` (relative to `base_dir`)
// parsed as JSON; returns how many rows there were. Throws
// std::invalid_argument naming the file (and line) when a file cannot be
// read or a line is not JSON, and DataOutOfMemory naming
// file:line and the stage when memory runs out.
size_t for_each_jsonl_row(
    const std::string& spec, const std::string& base_dir,
    const std::function<void(const nlohmann::ordered_json& row, const std::string& where)>& row);

}  // namespace tightfit
