// What tightfit knows of a plugin library before any of its code runs in
// this process: the file (its identity and whether it may be trusted) and
// what the library declares, as its scan in a child process found it.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "recipe.hpp"
#include "tightfit/plugin_api.h"

namespace tightfit {

// Which file a scan saw: a load refuses a file that changed since.
struct FileIdentity {
  dev_t device = 0;
  ino_t inode = 0;
  off_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};

// The identity of the file `st` describes.
FileIdentity file_identity(const struct stat& st);

// What a plugin declares, known without running its code in this process.
struct PluginInfo {
  std::string path;
  std::string origin;  // "built-in", "TIGHTFIT_PLUGIN_PATH", "recipe", "file"
  FileIdentity file;
  std::string sha256;  // of the bytes scanned (for a LoadedPlugin: the bytes loaded)
  tf_plugin_kind kind = TF_PLUGIN_MODEL;
  uint32_t abi_version = 0;
  uint32_t flags = 0;  // TF_PLUGIN_FLAG_*
  std::string name, version, description, libtorch_version;
  std::vector<KeySpec> keys;
  std::optional<PluginSearch> search;       // whether and how `tightfit fit` adds it
  std::vector<std::string> hf_model_types;  // a model's Hugging Face model_type values
  uint64_t model_features = 0;              // a model's TF_MODEL_FEATURE_* bits
  std::vector<std::string> hooks;           // the hooks its vtable offers
};

struct PluginScanResult {
  std::optional<PluginInfo> info;  // what the library declares, if it loaded
  std::string problem;             // else why not, naming the file
  bool cacheable = true;           // false for a scan cut off by the time limit
};

// Why `path` (a plugin file or folder) must not be trusted: writable by group
// or others, or owned by someone other than this user or root; "" if fine.
std::string plugin_path_trust_problem(const std::string& path);

// A file's identity as the scanner's answers and the cache record it.
nlohmann::json file_identity_json(const FileIdentity& id);

// The scanner's answer for one library, one line of JSON.
nlohmann::json plugin_info_to_json(const PluginInfo& info);
// Reads an answer back, checking every field (the scanner ran untrusted
// code, so its output is untrusted too). Throws std::invalid_argument.
PluginInfo plugin_info_from_json(const nlohmann::json& j);

// A string field of a scan's answer, at most 64 KiB (the answer is untrusted:
// the scanner ran the library's code). Throws std::invalid_argument when it
// is missing and `required`, or too long.
std::string answer_string(const nlohmann::json& j, const char* key, bool required = true);

}  // namespace tightfit
