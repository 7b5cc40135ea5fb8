// Byte sizes as people write and read them: "8GiB", "512MB", "1.5G".
#pragma once

#include <cstdint>
#include <string>

namespace tightfit {

// Parses "8GiB", "512MB", "1.5G", "123" (bytes). Throws std::invalid_argument.
int64_t parse_byte_size(const std::string& text);
// 1536 -> "1.5KiB".
std::string format_bytes(int64_t bytes);

}  // namespace tightfit
