// The loader: finds plugin libraries, learns what each one is by scanning it
// in a child process (plugin_scan.hpp), and opens a library in this process
// only when a recipe uses it — from the same descriptor its pin was checked
// on. It negotiates the ABI, checks the LibTorch version, and keeps every
// library loaded for the life of the process (nothing a plugin created may
// outlive its code).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "plugin_info.hpp"
#include "recipe.hpp"
#include "tightfit/plugin_api.h"

namespace tightfit {

struct PluginLoadError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The loaded bytes are not the ones a recipe pinned.
struct PluginPinMismatch : PluginLoadError {
  PluginPinMismatch(const std::string& what, std::string actual_sha256)
      : PluginLoadError(what), actual(std::move(actual_sha256)) {}
  std::string actual;
};

// A plugin opened in this process.
struct LoadedPlugin : PluginInfo {
  tf_plugin_descriptor descriptor;  // the host's zero-filled copy
  // The vtable of its kind, copied into a zeroed struct of this host's size
  // (struct_size set to it): a hook past an older plugin's struct_size is
  // NULL by construction, so a caller checks only for NULL.
  const tf_model_vtable* model() const;
  const tf_strategy_vtable* strategy() const;
  const tf_schedule_vtable* schedule() const;
  const tf_reward_vtable* reward() const;
  uint32_t plugin_vtable_size = 0;  // the struct_size the plugin's own vtable declared

 private:
  friend LoadedPlugin load_plugin_file(const std::string&, const std::string&, const std::string&,
                                       const FileIdentity*);
  tf_model_vtable model_vtable_{};
  tf_strategy_vtable strategy_vtable_{};
  tf_schedule_vtable schedule_vtable_{};
  tf_reward_vtable reward_vtable_{};
};

const char* plugin_kind_name(tf_plugin_kind kind);
std::string abi_version_string(uint32_t v);

// The LibTorch version this host was built with ("2.11.0").
const char* host_libtorch_version();

// Opens one library in this process and validates it; throws PluginLoadError
// naming the file and the reason. The file is opened once: its identity and
// SHA-256 come from that descriptor, and the dynamic linker maps that same
// descriptor, so a file swapped in meanwhile is never what runs. With a pin,
// a mismatch (PluginPinMismatch) is found before any code of it runs; with
// `scanned`, so is a file that is not the one a scan saw.
LoadedPlugin load_plugin_file(const std::string& path, const std::string& origin,
                              const std::string& sha256_pin = {},
                              const FileIdentity* scanned = nullptr);

// The folder of plugins built with this kernel (found next to the kernel library).
std::string builtin_plugin_dir();

class PluginRegistry {
 public:
  // Scans the built-in folder and TIGHTFIT_PLUGIN_PATH (absolute entries only).
  static PluginRegistry discover();

  // Adds every library in `dir` (or the file `dir`), scanned in a child
  // process (a library that crashes or hangs there is a problem, not a crash
  // of this process). Broken libraries are recorded in problems(), not
  // thrown. A second file with a name already taken is a conflict: recorded
  // in problems(), and using that name throws an error naming both files
  // (the same file seen twice is not).
  void add_path(const std::string& dir, const std::string& origin);

  // The plugin, opened in this process on first use. With `sha256_pin`, the
  // bytes loaded must have that SHA-256 (PluginPinMismatch otherwise, before
  // any of its code runs). Throws PluginLoadError listing what is installed,
  // or naming the files of a conflict.
  const LoadedPlugin& find(const std::string& name, tf_plugin_kind kind,
                           const std::string& sha256_pin = {}) const;
  // What a plugin declares, without loading it; nullptr if none has the name.
  const PluginInfo* find_any(const std::string& name) const;
  // The model plugin that declares Hugging Face `model_type` (hf_model_types),
  // or nullptr.
  const PluginInfo* find_hf_model_type(const std::string& model_type) const;
  std::vector<const PluginInfo*> all() const;
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  struct Entry {
    PluginInfo info;
    std::mutex mutex;
    std::shared_ptr<const LoadedPlugin> loaded;
  };
  std::map<std::string, std::shared_ptr<Entry>> by_name_;
  std::map<std::string, std::string> conflicts_;  // name -> the message
  std::vector<std::string> problems_;
  std::vector<std::string> path_problems_;  // folders refused as a whole
};

}  // namespace tightfit
