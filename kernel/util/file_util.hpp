// File helpers for crash-safe writes.
//
// remove_tree exists because LibTorch's wheel exports its own copy of several
// std::filesystem functions (remove_all among them) that the dynamic linker
// binds in place of libstdc++'s, and that copy crashes; nftw is plain POSIX.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace tightfit {

// Removes a file or a folder with everything in it; a missing path is fine.
// Throws std::runtime_error on failure.
void remove_tree(const std::string& path);

// fsync a file or folder by path (best effort: errors are ignored).
void fsync_path(const std::string& path);

// The whole file as bytes. Throws std::runtime_error naming `path`.
std::string read_file_text(const std::string& path);

// The whole file as bytes, refusing what is not a regular file (checked on
// the opened descriptor, which a FIFO cannot stall) or is larger than
// `max_bytes`. Throws std::runtime_error naming `path` and the reason.
std::string read_regular_file(const std::string& path, size_t max_bytes);

// Opens `path` for reading, a regular file only: opened O_NONBLOCK so a FIFO
// never stalls the open, then refused by fstat on the descriptor. The
// descriptor is closed when its last owner lets go; *size is the file's
// size. Throws std::runtime_error with the bare reason ("cannot open: ...",
// "cannot stat", "not a regular file") for the caller to prefix.
std::shared_ptr<const int> open_regular_for_reading(const std::string& path, uint64_t* size);

// Reads exactly n bytes at `offset` (pread, in chunks, EINTR retried);
// false when the file ends first.
bool read_at(int fd, void* dst, uint64_t n, uint64_t offset);

// Writes `text` to `path` and fsyncs it, as write_file_replacing does.
// Throws std::runtime_error.
void write_file_synced(const std::string& path, const std::string& text);

// Creates a new file beside `path` (O_EXCL | O_NOFOLLOW: never an existing
// file, never through a planted symlink), lets `fill` write it through the
// descriptor, fsyncs it and renames it over `path` — which replaces a symlink
// there rather than writing where it points. On failure the new file is
// removed and `path` is as it was. Throws std::runtime_error.
void write_file_replacing(const std::string& path, const std::function<void(int fd)>& fill);

// Creates `path` as a new empty file in one step (O_EXCL | O_NOFOLLOW): a
// marker that exists whole or not at all. Throws std::runtime_error.
void create_empty_file(const std::string& path);

// Writes all of [data, data + n) to `fd`; throws std::runtime_error naming `path`.
void write_all(int fd, const void* data, size_t n, const std::string& path);

// Writes all of [data, data + n) at `offset` (pwrite, EINTR retried); throws
// std::runtime_error naming `path`.
void write_at(int fd, const void* data, uint64_t n, uint64_t offset, const std::string& path);

}  // namespace tightfit
