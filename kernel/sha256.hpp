// SHA-256 of a file, for pinning plugins in recipes (`sha256 = "..."`).
#pragma once

#include <string>

namespace tightfit {

// Lower-case hex digest of the file's bytes. Throws std::runtime_error
// naming `path` when it cannot be read.
std::string sha256_file_hex(const std::string& path);

}  // namespace tightfit
