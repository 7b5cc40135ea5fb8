// The disk tier's files: one tensor's bytes each, written and read whole.
//
// The weights a run places on the disk tier at set-up are written past the
// page cache (O_DIRECT) where the file system allows it: a buffered write
// takes a fresh page of memory for every byte written, and writing a 7B
// model's 3.1 GiB of NF4 codes that way took 12 s of its 36 s set-up on a
// 2-core machine (236 MB/s; 1.8 GB/s past it). Reads, and the files written
// again every step (trained weights, checkpointed inputs), go through the
// page cache: a machine with memory to spare then reads the tier at memory
// speed from the second pass on, as `plan` and `fit` count it ("warm").
//
// O_DIRECT wants the buffer, the offset and the length in whole blocks
// (4096 bytes here); a tensor's memory is 64-byte aligned, so the bytes pass
// through a small aligned buffer of the calling thread's, and a file's last
// block is written whole and the file cut back to its length.
#pragma once

#include <cstddef>
#include <string>

namespace offload {

// How a tier file is read or written: past the page cache, or through it
// (also where the file system refuses O_DIRECT: some network and FUSE ones).
enum class TierIo { kDirect, kBuffered };

// Writes `bytes` from `data` to `path`, created (0600) or truncated; a
// symlink at `path` is not followed. Throws naming the path, the system's
// reason and the fix (offload.dir) when it cannot. Returns how the file was
// written: kBuffered where the file system refuses O_DIRECT, or when `io`
// asks for it (the tests take that path on any file system).
TierIo write_tier_file(const std::string& path, const void* data, size_t bytes,
                       TierIo io = TierIo::kDirect);

// Reads the `bytes` a file holds into `data`; throws naming the path when the
// file is shorter or cannot be read.
void read_tier_file(const std::string& path, void* data, size_t bytes, TierIo io = TierIo::kDirect);

// How the set-up's writes went, for the tier's log line.
const char* describe(TierIo io);

}  // namespace offload
