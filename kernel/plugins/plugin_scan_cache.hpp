// The plugin scanner's cache: what each library declared (or why it was
// refused), keyed by its path and by the device, inode, size and
// modification time the scan saw. Entries are valid only for the kernel
// library that wrote them (its own identity is the cache's key), so a
// rebuilt tightfit scans again. The file is the user's own: one owned by
// someone else or writable by others is ignored, never trusted.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "plugin_info.hpp"

namespace tightfit {

class PluginScanCache {
 public:
  // $TIGHTFIT_CACHE_DIR, else $XDG_CACHE_HOME/tightfit, else
  // $HOME/.cache/tightfit, with plugin-scan.json in it; "" = no cache.
  static std::string default_path();

  // Loads `path`; a missing, damaged, untrusted or foreign file is an empty cache.
  explicit PluginScanCache(std::string path);

  std::optional<PluginScanResult> lookup(const std::string& plugin_path,
                                         const FileIdentity& id) const;
  void store(const std::string& plugin_path, const FileIdentity& id,
             const PluginScanResult& result);
  // Writes what was stored, merged with what other processes wrote since
  // (replacing the file in one rename). Best effort: a cache that cannot be
  // written only costs a scan next time.
  void save();

 private:
  std::string path_;
  nlohmann::json entries_ = nlohmann::json::object();  // path -> entry
  nlohmann::json stored_ = nlohmann::json::object();   // this process's new entries
};

}  // namespace tightfit
