// The disk tier's files (plugins/strategies/offload/tier_file.hpp): what is
// written is read back byte for byte at every length around O_DIRECT's
// 4096-byte blocks and from memory at any alignment, past the page cache
// where the file system allows it and through it where not, and a file cut
// short from outside is refused naming it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "file_util.hpp"
#include "tier_file.hpp"

namespace fs = std::filesystem;
using offload::read_tier_file;
using offload::TierIo;
using offload::write_tier_file;

namespace {

// A fresh folder under `parent` (LibTorch's wheel exports its own
// std::filesystem::remove_all, which crashes here: the kernel's remove_tree).
struct TempDir {
  fs::path path;
  explicit TempDir(const fs::path& parent) {
    std::string templ = (parent / "tightfit-tier-XXXXXX").string();
    path = mkdtemp(templ.data()) ? fs::path(templ) : fs::path();
  }
  ~TempDir() {
    try {
      if (!path.empty()) tightfit::remove_tree(path.string());
    } catch (const std::exception&) {
    }
  }
};

std::vector<unsigned char> random_bytes(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(gen());
  return v;
}

void round_trips(const fs::path& dir, TierIo io) {
  const size_t big = (size_t{4} << 20) * 2 + 4096 + 3;  // past two bounce buffers
  const std::vector<unsigned char> source = random_bytes(big + 64, 1);
  for (const size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4097},
                         size_t{8192}, size_t{1} << 20, big}) {
    for (const size_t offset : {size_t{0}, size_t{1}, size_t{64}}) {
      SCOPED_TRACE(std::to_string(n) + " bytes at offset " + std::to_string(offset));
      const std::string path = (dir / ("w" + std::to_string(n) + ".bin")).string();
      EXPECT_EQ(write_tier_file(path, source.data() + offset, n, io), io);
      EXPECT_EQ(fs::file_size(path), n);
      std::vector<unsigned char> back(n + 64, 0xAB);
      read_tier_file(path, back.data() + offset, n, io);
      ASSERT_TRUE(std::equal(back.begin() + static_cast<long>(offset),
                             back.begin() + static_cast<long>(offset + n),
                             source.begin() + static_cast<long>(offset)));
      // Nothing written past the bytes asked for.
      for (size_t i = offset + n; i < back.size(); ++i) ASSERT_EQ(back[i], 0xAB) << i;
      // Written again shorter: the file is the new bytes alone.
      if (n > 1) {
        EXPECT_EQ(write_tier_file(path, source.data() + 7, n / 2, io), io);
        EXPECT_EQ(fs::file_size(path), n / 2);
      }
    }
  }
}

}  // namespace

TEST(TierFile, BytesComeBackAtEveryLengthAndAlignment) {
  TempDir dir(fs::temp_directory_path());
  ASSERT_FALSE(dir.path.empty());
  // Where the temp folder's file system refuses O_DIRECT the buffered path
  // runs here too, and the bytes must come back all the same.
  const TierIo io = write_tier_file((dir.path / "probe").string(), "x", 1, TierIo::kDirect);
  std::printf("temp folder's tier files: %s\n", offload::describe(io));
  round_trips(dir.path, io);
}

// Through the page cache: the reads, the files written every step, and
// every file on a file system without O_DIRECT.
TEST(TierFile, ThePageCachePathGivesTheSameBytes) {
  TempDir dir(fs::temp_directory_path());
  ASSERT_FALSE(dir.path.empty());
  round_trips(dir.path, TierIo::kBuffered);
}

TEST(TierFile, AFileCutShortOrMissingIsRefusedNamingIt) {
  TempDir dir(fs::temp_directory_path());
  const std::string path = (dir.path / "w.bin").string();
  const std::vector<unsigned char> bytes = random_bytes(10000, 2);
  write_tier_file(path, bytes.data(), bytes.size(), TierIo::kDirect);
  ASSERT_EQ(truncate(path.c_str(), 5000), 0);
  std::vector<unsigned char> back(bytes.size());
  for (const TierIo io : {TierIo::kDirect, TierIo::kBuffered}) {
    try {
      read_tier_file(path, back.data(), back.size(), io);
      FAIL() << "a short file was read";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("holds less than the 10000 bytes"), std::string::npos)
          << e.what();
    }
  }
  ASSERT_EQ(::unlink(path.c_str()), 0);
  try {
    read_tier_file(path, back.data(), back.size());
    FAIL() << "a missing file was read";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  // A symlink planted at a tier file's path is not followed.
  const std::string target = (dir.path / "target").string();
  write_tier_file(target, bytes.data(), 10, TierIo::kBuffered);
  fs::create_symlink(target, path);
  for (const TierIo io : {TierIo::kDirect, TierIo::kBuffered})
    EXPECT_THROW(write_tier_file(path, bytes.data(), bytes.size(), io), std::runtime_error);
  EXPECT_EQ(fs::file_size(target), 10u);
}
