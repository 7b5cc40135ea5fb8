// The loader: finds plugin libraries, opens them with Boost.DLL, negotiates
// the ABI and checks the LibTorch version, and keeps every library loaded for
// the life of the process (nothing a plugin created may outlive its code).
#pragma once

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "recipe.hpp"
#include "tightfit/plugin_api.h"

namespace tightfit {

struct PluginLoadError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct LoadedPlugin {
  std::string path;
  std::string origin;               // "built-in", "TIGHTFIT_PLUGIN_PATH", "recipe", "file"
  tf_plugin_descriptor descriptor;  // the host's zero-filled copy
  std::string name, version, description, libtorch_version;
  std::vector<KeySpec> keys;
  std::vector<std::string> hf_model_types;  // a model's Hugging Face model_type values
  uint64_t model_features = 0;              // a model's TF_MODEL_FEATURE_* bits
  const tf_model_vtable* model() const;
  const tf_strategy_vtable* strategy() const;
  const tf_schedule_vtable* schedule() const;
};

const char* plugin_kind_name(tf_plugin_kind kind);
std::string abi_version_string(uint32_t v);

// The LibTorch version this host was built with ("2.11.0").
const char* host_libtorch_version();

// Opens one library and validates it; throws PluginLoadError naming the file
// and the reason.
LoadedPlugin load_plugin_file(const std::string& path, const std::string& origin);

// The folder of plugins built with this kernel (found next to the kernel library).
std::string builtin_plugin_dir();

class PluginRegistry {
 public:
  // Scans the built-in folder and TIGHTFIT_PLUGIN_PATH.
  static PluginRegistry discover();

  // Adds every library in `dir` (or the file `dir`). Broken libraries found
  // by scanning are recorded in problems(), not thrown. A second file with a
  // name already taken is a conflict: recorded in problems(), and using that
  // name throws an error naming both files (the same file seen twice is not).
  void add_path(const std::string& dir, const std::string& origin);

  // Throws PluginLoadError listing what is installed, or naming the files of
  // a conflict.
  const LoadedPlugin& find(const std::string& name, tf_plugin_kind kind) const;
  const LoadedPlugin* find_any(const std::string& name) const;
  // The model plugin that declares Hugging Face `model_type` (hf_model_types),
  // or nullptr.
  const LoadedPlugin* find_hf_model_type(const std::string& model_type) const;
  std::vector<const LoadedPlugin*> all() const;
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  std::map<std::string, std::shared_ptr<LoadedPlugin>> by_name_;
  std::map<std::string, std::string> conflicts_;  // name -> the message
  std::vector<std::string> problems_;
};

}  // namespace tightfit
