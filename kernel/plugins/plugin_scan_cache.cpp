#include "plugin_scan_cache.hpp"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "file_util.hpp"
#include "json_input.hpp"
#include "json_output.hpp"
#include "logging.hpp"

namespace tightfit {
namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxCacheBytes = 16u << 20;
constexpr size_t kMaxEntries = 4096;

// The kernel library that reads and writes entries: a rebuilt kernel (which
// may judge plugins differently) starts from an empty cache.
const std::string& kernel_identity() {
  static const std::string id = [] {
    Dl_info info{};
    struct stat st {};
    if (dladdr(reinterpret_cast<void*>(&kernel_identity), &info) == 0 || !info.dli_fname ||
        ::stat(info.dli_fname, &st) != 0)
      return std::string();
    return std::string(info.dli_fname) + ":" + std::to_string(st.st_dev) + ":" +
           std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) + ":" +
           std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec) + ":" +
           std::to_string(TF_ABI_VERSION);
  }();
  return id;
}

// The entries of the cache file at `path` for this kernel (empty if none).
nlohmann::json read_entries(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return nlohmann::json::object();
  if (const std::string why = plugin_path_trust_problem(path); !why.empty()) {
    log_message(TF_LOG_WARN, "ignoring the plugin scan cache: " + why);
    return nlohmann::json::object();
  }
  try {
    nlohmann::json j = read_json_file(path, kMaxCacheBytes);
    if (j.is_object() && j.value("kernel", std::string()) == kernel_identity() &&
        j.contains("entries") && j["entries"].is_object())
      return std::move(j["entries"]);
  } catch (const std::exception& e) {
    log_message(TF_LOG_DEBUG, std::string("ignoring the plugin scan cache: ") + e.what());
  }
  return nlohmann::json::object();
}

}  // namespace

std::string PluginScanCache::default_path() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v && *v == '/' ? v : "";  // only absolute folders: never the working directory
  };
  std::string dir = env("TIGHTFIT_CACHE_DIR");
  if (dir.empty() && !env("XDG_CACHE_HOME").empty()) dir = env("XDG_CACHE_HOME") + "/tightfit";
  if (dir.empty() && !env("HOME").empty()) dir = env("HOME") + "/.cache/tightfit";
  return dir.empty() ? "" : dir + "/plugin-scan.json";
}

PluginScanCache::PluginScanCache(std::string path) : path_(std::move(path)) {
  if (!kernel_identity().empty()) entries_ = read_entries(path_);
}

std::optional<PluginScanResult> PluginScanCache::lookup(const std::string& plugin_path,
                                                        const FileIdentity& id) const {
  const auto it = entries_.find(plugin_path);
  if (it == entries_.end() || !it->is_object() ||
      it->value("file", nlohmann::json()) != file_identity_json(id))
    return std::nullopt;
  try {
    PluginScanResult r;
    if (it->contains("info")) {
      r.info = plugin_info_from_json(it->at("info"));
      if (r.info->path != plugin_path || !(r.info->file == id)) return std::nullopt;
    } else {
      r.problem = it->at("problem").get<std::string>();
    }
    return r;
  } catch (const std::exception&) {
    return std::nullopt;  // a damaged entry is scanned again
  }
}

void PluginScanCache::store(const std::string& plugin_path, const FileIdentity& id,
                            const PluginScanResult& result) {
  if (!result.cacheable) return;
  nlohmann::json entry = {{"file", file_identity_json(id)}};
  if (result.info)
    entry["info"] = plugin_info_to_json(*result.info);
  else
    entry["problem"] = result.problem;
  entries_[plugin_path] = entry;
  stored_[plugin_path] = std::move(entry);
}

void PluginScanCache::save() {
  if (path_.empty() || stored_.empty() || kernel_identity().empty()) return;
  try {
    const fs::path dir = fs::path(path_).parent_path();
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      fs::create_directories(dir.parent_path(), ec);
      if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return;
    }
    if (!plugin_path_trust_problem(dir.string()).empty()) return;
    // Another process may have written entries since this one read the file.
    nlohmann::json merged = read_entries(path_);
    for (auto& [path, entry] : stored_.items()) merged[path] = entry;
    // Forget files that are gone, and keep the file bounded.
    for (auto it = merged.begin(); it != merged.end();) {
      struct stat st {};
      if (merged.size() > kMaxEntries || ::stat(it.key().c_str(), &st) != 0)
        it = merged.erase(it);
      else
        ++it;
    }
    const std::string text =
        dump_json(nlohmann::json{{"kernel", kernel_identity()}, {"entries", merged}}, 1);
    write_file_replacing(path_, [&](int fd) { write_all(fd, text.data(), text.size(), path_); });
    stored_ = nlohmann::json::object();
  } catch (const std::exception& e) {
    log_message(TF_LOG_DEBUG, std::string("the plugin scan cache was not written: ") + e.what());
  }
}

}  // namespace tightfit
