#include "plugin_loader.hpp"

#define BOOST_DLL_USE_STD_FS
#include <dlfcn.h>
#include <torch/version.h>

#include <algorithm>
#include <boost/dll/shared_library.hpp>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <sstream>

namespace tightfit {
namespace fs = std::filesystem;

namespace {

// Libraries are never unloaded: deleters, autograd nodes and tensors a plugin
// created may live until exit.
std::vector<boost::dll::shared_library>& open_libraries() {
  static auto* libs = new std::vector<boost::dll::shared_library>();
  return *libs;
}
std::mutex& open_mutex() {
  static std::mutex m;
  return m;
}

std::string str_or_empty(const char* s) {
  return s ? s : "";
}

// The smallest descriptor this host can use: everything up to the vtable.
constexpr size_t kMinDescriptorSize = offsetof(tf_plugin_descriptor, vtable) + sizeof(void*);

}  // namespace

const char* plugin_kind_name(tf_plugin_kind kind) {
  switch (kind) {
    case TF_PLUGIN_MODEL:
      return "model";
    case TF_PLUGIN_STRATEGY:
      return "strategy";
    case TF_PLUGIN_SCHEDULE:
      return "schedule";
  }
  return "unknown";
}

std::string abi_version_string(uint32_t v) {
  return std::to_string(TF_VERSION_MAJOR(v)) + "." + std::to_string(TF_VERSION_MINOR(v));
}

const char* host_libtorch_version() {
  return TORCH_VERSION;
}

const tf_model_vtable* LoadedPlugin::model() const {
  return descriptor.kind == TF_PLUGIN_MODEL ? static_cast<const tf_model_vtable*>(descriptor.vtable)
                                            : nullptr;
}
const tf_strategy_vtable* LoadedPlugin::strategy() const {
  return descriptor.kind == TF_PLUGIN_STRATEGY
             ? static_cast<const tf_strategy_vtable*>(descriptor.vtable)
             : nullptr;
}
const tf_schedule_vtable* LoadedPlugin::schedule() const {
  return descriptor.kind == TF_PLUGIN_SCHEDULE
             ? static_cast<const tf_schedule_vtable*>(descriptor.vtable)
             : nullptr;
}

LoadedPlugin load_plugin_file(const std::string& path, const std::string& origin) {
  auto fail = [&](const std::string& why) -> PluginLoadError {
    return PluginLoadError("plugin " + path + ": " + why);
  };
  boost::dll::shared_library lib;
  std::error_code ec;
  lib.load(path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, ec);
  if (ec || !lib.is_loaded()) {
    const char* err = dlerror();
    throw fail("cannot open the library (" + (err ? std::string(err) : ec.message()) +
               "); check that it exists and was built for this machine");
  }
  if (!lib.has(TF_PLUGIN_ENTRY_SYMBOL))
    throw fail(std::string("no entry symbol \"") + TF_PLUGIN_ENTRY_SYMBOL +
               "\": not a tightfit plugin, or built without TF_DEFINE_PLUGIN_ENTRY / "
               "tightfit_add_plugin()");
  auto entry = lib.get<tf_status(const tf_host_offer*, const tf_plugin_descriptor**)>(
      TF_PLUGIN_ENTRY_SYMBOL);

  tf_host_offer offer{sizeof(tf_host_offer), TF_ABI_VERSION, TORCH_VERSION};
  const tf_plugin_descriptor* desc = nullptr;
  const tf_status st = entry(&offer, &desc);
  if (st == TF_ERR_ABI)
    throw fail("the plugin refuses this host's ABI " + abi_version_string(TF_ABI_VERSION) +
               "; rebuild it against this tightfit's plugin-api headers");
  if (st != TF_OK || desc == nullptr)
    throw fail("entry function failed (status " + std::to_string(st) + ")");

  // Check the size before copying anything (a short struct must not be over-read).
  if (desc->struct_size < kMinDescriptorSize)
    throw fail("descriptor struct_size " + std::to_string(desc->struct_size) +
               " is smaller than the " + std::to_string(kMinDescriptorSize) +
               " bytes ABI 1.0 requires; the plugin was built against a broken or foreign "
               "plugin_api.h — rebuild it against this tightfit's headers");
  const uint32_t plugin_abi = desc->abi_version;
  if (TF_VERSION_MAJOR(plugin_abi) != TF_ABI_VERSION_MAJOR)
    throw fail("built for plugin ABI " + abi_version_string(plugin_abi) + ", this host speaks " +
               abi_version_string(TF_ABI_VERSION) +
               " (major versions must match); rebuild the plugin against this tightfit");
  if (TF_VERSION_MINOR(plugin_abi) > TF_ABI_VERSION_MINOR)
    throw fail("needs plugin ABI " + abi_version_string(plugin_abi) + " but this host has only " +
               abi_version_string(TF_ABI_VERSION) + "; upgrade tightfit or use an older plugin");

  LoadedPlugin out{};
  std::memset(&out.descriptor, 0, sizeof out.descriptor);
  std::memcpy(&out.descriptor, desc, std::min<size_t>(desc->struct_size, sizeof out.descriptor));
  const tf_plugin_descriptor& d = out.descriptor;
  out.path = fs::absolute(path).string();
  out.origin = origin;
  out.name = str_or_empty(d.name);
  out.version = str_or_empty(d.version);
  out.description = str_or_empty(d.description);
  out.libtorch_version = str_or_empty(d.libtorch_version);
  if (out.name.empty()) throw fail("descriptor has no name");
  if (d.kind != TF_PLUGIN_MODEL && d.kind != TF_PLUGIN_STRATEGY && d.kind != TF_PLUGIN_SCHEDULE)
    throw fail("unknown plugin kind " + std::to_string(static_cast<int>(d.kind)));
  if (!(d.flags & TF_PLUGIN_FLAG_STABLE_ABI_ONLY) && out.libtorch_version != TORCH_VERSION)
    throw fail("built against LibTorch " +
               (out.libtorch_version.empty() ? std::string("(unknown)") : out.libtorch_version) +
               " but this host uses LibTorch " + TORCH_VERSION +
               "; rebuild the plugin with this LibTorch (scripts/setup pins it), or build it on "
               "LibTorch's stable C subset and set TF_PLUGIN_FLAG_STABLE_ABI_ONLY");
  if (d.vtable == nullptr) throw fail("descriptor has no vtable");
  const uint32_t vt_size = *static_cast<const uint32_t*>(d.vtable);
  const size_t vt_min =
      d.kind == TF_PLUGIN_MODEL      ? offsetof(tf_model_vtable, stage_forward) + sizeof(void*)
      : d.kind == TF_PLUGIN_STRATEGY ? offsetof(tf_strategy_vtable, configure)
                                     : offsetof(tf_schedule_vtable, run_step) + sizeof(void*);
  if (vt_size < vt_min)
    throw fail("vtable struct_size " + std::to_string(vt_size) + " is smaller than the " +
               std::to_string(vt_min) + " bytes its kind requires");
  // The functions every instance needs must be present.
  const void* const* fns = reinterpret_cast<const void* const*>(static_cast<const char*>(d.vtable) +
                                                                offsetof(tf_model_vtable, create));
  static_assert(offsetof(tf_model_vtable, create) == offsetof(tf_strategy_vtable, create) &&
                offsetof(tf_model_vtable, create) == offsetof(tf_schedule_vtable, create));
  const bool has_main =
      d.kind == TF_PLUGIN_MODEL
          ? static_cast<const tf_model_vtable*>(d.vtable)->stage_forward != nullptr
      : d.kind == TF_PLUGIN_SCHEDULE
          ? static_cast<const tf_schedule_vtable*>(d.vtable)->run_step != nullptr
          : true;
  if (fns[0] == nullptr || !has_main)
    throw fail(std::string("the ") + plugin_kind_name(d.kind) + " vtable lacks create" +
               (d.kind == TF_PLUGIN_MODEL      ? " or stage_forward"
                : d.kind == TF_PLUGIN_SCHEDULE ? " or run_step"
                                               : ""));
  if (d.kind == TF_PLUGIN_MODEL &&
      vt_size >= offsetof(tf_model_vtable, hf_model_types) + sizeof(const char*)) {
    const char* types = static_cast<const tf_model_vtable*>(d.vtable)->hf_model_types;
    std::stringstream list(types ? std::string(types, strnlen(types, 4096)) : std::string());
    for (std::string t; std::getline(list, t, ',');)
      if (!t.empty()) out.hf_model_types.push_back(t);
  }
  if (d.kind == TF_PLUGIN_MODEL &&
      vt_size >= offsetof(tf_model_vtable, features) + sizeof(uintptr_t))
    out.model_features = static_cast<const tf_model_vtable*>(d.vtable)->features;
  try {
    out.keys = key_specs_from_abi(d.config_keys, d.n_config_keys);
  } catch (const std::exception& e) {
    throw fail(e.what());
  }
  std::lock_guard<std::mutex> lock(open_mutex());
  open_libraries().push_back(std::move(lib));
  return out;
}

std::string builtin_plugin_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&builtin_plugin_dir), &info) == 0 || !info.dli_fname)
    return {};
  const fs::path lib_dir = fs::absolute(info.dli_fname).parent_path();
  for (const fs::path& candidate : {lib_dir / ".." / "plugins", lib_dir / "tightfit" / "plugins"})
    if (fs::is_directory(candidate)) return fs::canonical(candidate).string();
  return {};
}

PluginRegistry PluginRegistry::discover() {
  PluginRegistry r;
  const std::string builtin = builtin_plugin_dir();
  if (!builtin.empty()) r.add_path(builtin, "built-in");
  if (const char* env = std::getenv("TIGHTFIT_PLUGIN_PATH")) {
    std::stringstream ss(env);
    for (std::string dir; std::getline(ss, dir, ':');)
      if (!dir.empty()) r.add_path(dir, "TIGHTFIT_PLUGIN_PATH");
  }
  return r;
}

void PluginRegistry::add_path(const std::string& dir, const std::string& origin) {
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) {
    files.push_back(dir);
  } else if (fs::is_directory(dir, ec)) {
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.is_regular_file() && e.path().extension() == ".so") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
  } else {
    problems_.push_back("plugin path " + dir + " (" + origin + ") does not exist");
    return;
  }
  for (const auto& f : files) {
    try {
      auto p = std::make_shared<LoadedPlugin>(load_plugin_file(f, origin));
      auto [it, added] = by_name_.emplace(p->name, p);
      if (added || fs::equivalent(it->second->path, p->path, ec)) continue;
      const std::string message = "two plugins are named \"" + p->name + "\": " + it->second->path +
                                  " (" + it->second->origin + ") and " + p->path + " (" + origin +
                                  "); remove one from the plugin folders or rename it";
      if (conflicts_.emplace(p->name, message).second) problems_.push_back(message);
    } catch (const PluginLoadError& e) {
      problems_.push_back(e.what());
    }
  }
}

const LoadedPlugin* PluginRegistry::find_any(const std::string& name) const {
  if (auto c = conflicts_.find(name); c != conflicts_.end()) throw PluginLoadError(c->second);
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second.get();
}

const LoadedPlugin* PluginRegistry::find_hf_model_type(const std::string& model_type) const {
  for (const auto& [name, p] : by_name_)
    if (p->descriptor.kind == TF_PLUGIN_MODEL &&
        std::find(p->hf_model_types.begin(), p->hf_model_types.end(), model_type) !=
            p->hf_model_types.end())
      return p.get();
  return nullptr;
}

const LoadedPlugin& PluginRegistry::find(const std::string& name, tf_plugin_kind kind) const {
  const LoadedPlugin* p = find_any(name);
  if (p && p->descriptor.kind == kind) return *p;
  std::ostringstream os;
  os << "no " << plugin_kind_name(kind) << " plugin named \"" << name << "\"";
  if (p) os << " (\"" << name << "\" is a " << plugin_kind_name(p->descriptor.kind) << " plugin)";
  os << ". Installed " << plugin_kind_name(kind) << " plugins:";
  bool any = false;
  for (const auto& [n, q] : by_name_)
    if (q->descriptor.kind == kind) {
      os << " " << n;
      any = true;
    }
  if (!any) os << " (none)";
  for (const auto& prob : problems_)
    if (prob.find(name) != std::string::npos) os << "\n  note: " << prob;
  os << "\nAdd a plugin folder with TIGHTFIT_PLUGIN_PATH or [run] plugin_paths";
  throw PluginLoadError(os.str());
}

std::vector<const LoadedPlugin*> PluginRegistry::all() const {
  std::vector<const LoadedPlugin*> out;
  for (const auto& [n, p] : by_name_) out.push_back(p.get());
  return out;
}

}  // namespace tightfit
