// SHA-256 of a file, for pinning plugins in recipes (`sha256 = "..."`).
#pragma once

#include <string>

namespace tightfit {

// Lower-case hex digest of the file's bytes. Throws std::runtime_error
// naming `path` when it cannot be read.
std::string sha256_file_hex(const std::string& path);

// Lower-case hex digest of `bytes`.
std::string sha256_hex(const std::string& bytes);

// The same for the bytes of an open descriptor, read from offset 0 with
// pread (the descriptor's own offset is left as it was); `path` names it in
// errors. A pin is checked this way on the very descriptor that is loaded.
std::string sha256_fd_hex(int fd, const std::string& path);

}  // namespace tightfit
