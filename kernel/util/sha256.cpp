#include "sha256.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace tightfit {

namespace {

using Digest = std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)>;

Digest start_sha256() {
  Digest md(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!md || EVP_DigestInit_ex(md.get(), EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("SHA-256 is unavailable (OpenSSL)");
  return md;
}

std::string finish_hex(const Digest& md) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(md.get(), digest.data(), &len);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

}  // namespace

std::string sha256_hex(const std::string& bytes) {
  const Digest md = start_sha256();
  EVP_DigestUpdate(md.get(), bytes.data(), bytes.size());
  return finish_hex(md);
}

std::string sha256_fd_hex(int fd, const std::string& path) {
  const Digest md = start_sha256();
  std::array<unsigned char, 1 << 16> buf{};
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf.data(), buf.size(), at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error("error reading " + path + ": " + std::strerror(errno));
    if (n == 0) break;
    EVP_DigestUpdate(md.get(), buf.data(), static_cast<size_t>(n));
    at += n;
  }
  return finish_hex(md);
}

std::string sha256_file_hex(const std::string& path) {
  // O_NONBLOCK: a FIFO in the file's place is refused below, not waited on.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno));
  try {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
      throw std::runtime_error("cannot hash " + path + ": not a regular file");
    std::string hex = sha256_fd_hex(fd, path);
    ::close(fd);
    return hex;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

}  // namespace tightfit
