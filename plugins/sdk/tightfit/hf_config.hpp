// Reading a Hugging Face config.json, for model plugins that take their shape
// from one. Header-only; plugins that include it link nlohmann_json.
//
// A downloaded config is untrusted input: every value is read typed and
// range-checked like a recipe key (a float is never cast into an integer,
// NaN and infinities never pass), and every message names the file and key.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>

namespace tf_sdk {

struct HfConfig {
  nlohmann::json json;
  std::string source;  // the file, for messages

  bool has(const char* key) const { return json.contains(key) && !json[key].is_null(); }

  // A required integer in [lo, hi]; throws std::invalid_argument naming the file.
  int64_t need(const char* key, int64_t lo = 1,
               int64_t hi = std::numeric_limits<int64_t>::max()) const {
    if (!has(key)) throw std::invalid_argument(source + " lacks the integer \"" + key + "\"");
    return checked_int(key, lo, hi);
  }
  // An optional integer (absent or null: `fallback`) in [lo, hi].
  int64_t get(const char* key, int64_t fallback, int64_t lo = 0,
              int64_t hi = std::numeric_limits<int64_t>::max()) const {
    return has(key) ? checked_int(key, lo, hi) : fallback;
  }
  // An optional finite number (absent or null: `fallback`) in (lo, hi] when
  // `lo_open`, else [lo, hi].
  double real(const char* key, double fallback, double lo, double hi, bool lo_open = true) const {
    return has(key) ? real_of(json[key], key, lo, hi, lo_open) : fallback;
  }
  double real_of(const nlohmann::json& v, const std::string& key, double lo, double hi,
                 bool lo_open = true) const {
    if (!v.is_number()) throw std::invalid_argument(source + ": \"" + key + "\" must be a number");
    const double x = v.get<double>();
    if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo))
      throw std::invalid_argument(source + ": \"" + key + "\" = " + std::to_string(x) +
                                  " is out of range " + (lo_open ? "(" : "[") + fmt(lo) + ", " +
                                  fmt(hi) + "]");
    return x;
  }
  // An optional boolean (absent or null: `fallback`).
  bool flag(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!json[key].is_boolean())
      throw std::invalid_argument(source + ": \"" + key + "\" must be true or false");
    return json[key].get<bool>();
  }
  // An optional string (absent or null: `fallback`).
  std::string text(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!json[key].is_string())
      throw std::invalid_argument(source + ": \"" + key + "\" must be a string");
    return json[key].get<std::string>();
  }

 private:
  static std::string fmt(double x) {
    std::ostringstream s;
    s << x;
    return s.str();
  }
  int64_t checked_int(const char* key, int64_t lo, int64_t hi) const {
    const nlohmann::json& v = json[key];
    // Not get<int64_t> on any number: a float (1e30) would be cast, not refused.
    if (!v.is_number_integer())
      throw std::invalid_argument(source + ": \"" + key + "\" must be an integer");
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw std::invalid_argument(source + ": \"" + key + "\" is out of range");
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi)
      throw std::invalid_argument(source + ": \"" + key + "\" = " + std::to_string(x) +
                                  " is out of range [" + std::to_string(lo) + ", " +
                                  std::to_string(hi) + "]");
    return x;
  }
};

// A JSON object from a Hugging Face file (config.json, adapter_config.json):
// read from the opened descriptor only if it is a regular file of at most
// `max_bytes` (a FIFO would hang the read; O_NONBLOCK keeps the open from
// waiting for a writer), parsed refusing nesting past 64 levels (real files
// nest 3) so no later copy or dump recurses deep. `what` names the kind of
// file in messages.
inline HfConfig read_hf_json(const std::string& path, size_t max_bytes, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    throw std::invalid_argument("cannot open " + what + " " + path + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    throw std::invalid_argument(what + " " + path + " is not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    throw std::invalid_argument(what + " " + path + " is larger than " +
                                std::to_string(max_bytes >> 20) + " MiB: not a " + what);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  text.resize(done);
  constexpr int kMaxDepth = 64;
  auto guard = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxDepth)
      throw std::invalid_argument(path + " nests deeper than 64 levels: not a " + what);
    return true;
  };
  HfConfig c{nlohmann::json::parse(text, guard, /*allow_exceptions=*/false), path};
  if (c.json.is_discarded() || !c.json.is_object())
    throw std::invalid_argument(what + " " + path + " is not a JSON object");
  return c;
}

// `path`: a config.json or a model folder holding one (at most 16 MiB).
inline HfConfig read_hf_config(const std::string& path) {
  std::filesystem::path p = path;
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) p /= "config.json";
  return read_hf_json(p.string(), size_t{16} << 20, "Hugging Face config");
}

}  // namespace tf_sdk
