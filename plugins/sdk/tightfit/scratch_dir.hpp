// A private scratch folder for a plugin's own files (offloaded weights,
// optimizer state, activations). Made fresh with mkdtemp (mode 0700) inside
// the folder the user names, so nothing can be planted in it and no file of
// the user's is ever written or deleted; removed with everything in it when
// the plugin is done. Header-only.
#pragma once

#include <ftw.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace tf_sdk {

class ScratchDir {
 public:
  ScratchDir() = default;
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() { remove(); }

  // Creates `parent` if needed, then a new folder `prefix`XXXXXX inside it;
  // the first call only. Throws std::runtime_error naming the folder.
  const std::string& ensure(const std::string& parent, const std::string& prefix) {
    if (!path_.empty()) return path_;
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    std::string tmpl = (std::filesystem::path(parent) / (prefix + "XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr)
      throw std::runtime_error("cannot create a scratch folder in " + parent + ": " +
                               std::strerror(errno));
    path_ = tmpl;
    return path_;
  }
  const std::string& path() const { return path_; }

  // Removes the folder and what is in it (nftw, not std::filesystem::remove_all:
  // LibTorch's wheel exports a copy of it that the linker may bind instead).
  void remove() noexcept {
    if (path_.empty()) return;
    ::nftw(
        path_.c_str(),
        [](const char* p, const struct stat*, int, struct FTW*) {
          return ::remove(p) == 0 ? 0 : 0;
        },
        16, FTW_DEPTH | FTW_PHYS);
    path_.clear();
  }

 private:
  std::string path_;
};

}  // namespace tf_sdk
