#include "plugin_loader.hpp"

#define BOOST_DLL_USE_STD_FS
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <boost/dll/shared_library.hpp>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <sstream>

#include "key_search_checks.hpp"
#include "plugin_hooks.hpp"
#include "plugin_scan.hpp"
#include "sha256.hpp"

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
    case TF_PLUGIN_REWARD:
      return "reward";
    case TF_PLUGIN_KIND_MAX_ENUM:
      break;
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
  return descriptor.kind == TF_PLUGIN_MODEL ? &model_vtable_ : nullptr;
}
const tf_strategy_vtable* LoadedPlugin::strategy() const {
  return descriptor.kind == TF_PLUGIN_STRATEGY ? &strategy_vtable_ : nullptr;
}
const tf_schedule_vtable* LoadedPlugin::schedule() const {
  return descriptor.kind == TF_PLUGIN_SCHEDULE ? &schedule_vtable_ : nullptr;
}
const tf_reward_vtable* LoadedPlugin::reward() const {
  return descriptor.kind == TF_PLUGIN_REWARD ? &reward_vtable_ : nullptr;
}

namespace {

// The hooks a vtable offers, by name, as `plugins check` lists them.
std::vector<std::string> vtable_hooks(const LoadedPlugin& p) {
  std::vector<std::string> hooks;
  auto add = [&](bool present, const char* name) {
    if (present) hooks.push_back(name);
  };
#define TF_HOOK(field) add(v->field != nullptr, #field);
  if (const tf_strategy_vtable* v = p.strategy()) {
    TF_STRATEGY_HOOKS(TF_HOOK)
  } else if (const tf_model_vtable* v = p.model()) {
    TF_MODEL_HOOKS(TF_HOOK)
  } else if (const tf_schedule_vtable* v = p.schedule()) {
    TF_SCHEDULE_HOOKS(TF_HOOK)
  }
#undef TF_HOOK
  return hooks;
}

}  // namespace

LoadedPlugin load_plugin_file(const std::string& path, const std::string& origin,
                              const std::string& sha256_pin, const FileIdentity* scanned) {
  auto fail = [&](const std::string& why) -> PluginLoadError {
    return PluginLoadError("plugin " + path + ": " + why);
  };
  // One descriptor for everything: stat, hash and the dynamic linker's
  // mapping (through /proc/self/fd). It stays open while the library is
  // loaded — for ever — so that no later library is ever opened under the
  // same /proc name, which the dynamic linker would take for this one.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    throw fail(std::string("cannot open it (") + std::strerror(errno) +
               "); check that it exists and is readable");
  bool keep_fd = false;
  struct FdCloser {
    int fd;
    bool& keep;
    ~FdCloser() {
      if (!keep) ::close(fd);
    }
  } closer{fd, keep_fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    throw fail("not a regular file; give the path of a plugin library (.so)");
  LoadedPlugin out{};
  out.file = file_identity(st);
  if (scanned && !(out.file == *scanned))
    throw fail(
        "changed after it was scanned (rebuilt or replaced while tightfit started?); "
        "run tightfit again");
  try {
    out.sha256 = sha256_fd_hex(fd, path);
  } catch (const std::exception& e) {
    throw fail(e.what());
  }
  if (!sha256_pin.empty() && out.sha256 != sha256_pin)
    throw PluginPinMismatch(
        "plugin " + path + " has SHA-256 " + out.sha256 + ", not the pinned " + sha256_pin,
        out.sha256);

  boost::dll::shared_library lib;
  std::error_code ec;
  // Without /proc (a bare container) the path is all there is: the file is
  // then loaded by name and its identity checked again below.
  const std::string by_fd = "/proc/self/fd/" + std::to_string(fd);
  const bool have_proc = ::access(by_fd.c_str(), R_OK) == 0;
  lib.load(have_proc ? by_fd : path,
           boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, ec);
  if (ec || !lib.is_loaded()) {
    const char* err = dlerror();
    throw fail("cannot open the library (" + (err ? std::string(err) : ec.message()) +
               "); check that it was built for this machine");
  }
  // Its constructors ran: it stays loaded, refused or not.
  keep_fd = true;
  struct stat now {};
  if (!have_proc && (::stat(path.c_str(), &now) != 0 || !(file_identity(now) == out.file)))
    throw fail("was replaced while it was being loaded; run tightfit again");
  const bool has_entry = lib.has(TF_PLUGIN_ENTRY_SYMBOL);
  tf_status (*entry)(const tf_host_offer*, const tf_plugin_descriptor**) = nullptr;
  if (has_entry)
    entry = &lib.get<tf_status(const tf_host_offer*, const tf_plugin_descriptor**)>(
        TF_PLUGIN_ENTRY_SYMBOL);
  {
    std::lock_guard<std::mutex> lock(open_mutex());
    open_libraries().push_back(std::move(lib));
  }
  if (!has_entry)
    throw fail(std::string("no entry symbol \"") + TF_PLUGIN_ENTRY_SYMBOL +
               "\": not a tightfit plugin, or built without TF_DEFINE_PLUGIN_ENTRY / "
               "tightfit_add_plugin()");

  tf_host_offer offer{sizeof(tf_host_offer), TF_ABI_VERSION, TORCH_VERSION};
  const tf_plugin_descriptor* desc = nullptr;
  tf_status st_entry = TF_ERROR;
  try {  // a C entry point; one written in C++ may still let an exception out
    st_entry = entry(&offer, &desc);
  } catch (const std::exception& e) {
    throw fail(std::string("entry function threw an exception (") + e.what() +
               "); a plugin must return a status instead");
  } catch (...) {
    throw fail("entry function threw an exception; a plugin must return a status instead");
  }
  if (st_entry == TF_ERR_ABI)
    throw fail("the plugin refuses this host's ABI " + abi_version_string(TF_ABI_VERSION) +
               "; rebuild it against this tightfit's plugin-api headers");
  if (st_entry != TF_OK || desc == nullptr)
    throw fail("entry function failed (status " + std::to_string(st_entry) + ")");
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
  if (d.kind != TF_PLUGIN_MODEL && d.kind != TF_PLUGIN_STRATEGY && d.kind != TF_PLUGIN_SCHEDULE &&
      !(d.kind == TF_PLUGIN_REWARD && TF_VERSION_MINOR(plugin_abi) >= 25))
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
      : d.kind == TF_PLUGIN_REWARD   ? offsetof(tf_reward_vtable, score) + sizeof(void*)
                                     : offsetof(tf_schedule_vtable, run_step) + sizeof(void*);
  if (vt_size < vt_min)
    throw fail("vtable struct_size " + std::to_string(vt_size) + " is smaller than the " +
               std::to_string(vt_min) + " bytes its kind requires");
  // Copied into the host's zeroed struct: nothing past the plugin's size is
  // read, and every later use sees absent hooks as NULL.
  auto copy_vtable = [&](auto& host_vt) {
    std::memcpy(&host_vt, d.vtable, std::min<size_t>(vt_size, sizeof host_vt));
    host_vt.struct_size = sizeof host_vt;
  };
  if (d.kind == TF_PLUGIN_MODEL) copy_vtable(out.model_vtable_);
  if (d.kind == TF_PLUGIN_STRATEGY) copy_vtable(out.strategy_vtable_);
  if (d.kind == TF_PLUGIN_SCHEDULE) copy_vtable(out.schedule_vtable_);
  if (d.kind == TF_PLUGIN_REWARD) copy_vtable(out.reward_vtable_);
  out.plugin_vtable_size = vt_size;
  out.kind = d.kind;
  // The functions every instance needs must be present.
  const bool has_main = out.model()      ? out.model()->create && out.model()->stage_forward
                        : out.schedule() ? out.schedule()->create && out.schedule()->run_step
                        : out.reward()   ? out.reward()->create && out.reward()->score
                                         : out.strategy()->create != nullptr;
  if (!has_main)
    throw fail(std::string("the ") + plugin_kind_name(d.kind) + " vtable lacks create" +
               (d.kind == TF_PLUGIN_MODEL      ? " or stage_forward"
                : d.kind == TF_PLUGIN_SCHEDULE ? " or run_step"
                : d.kind == TF_PLUGIN_REWARD   ? " or score"
                                               : ""));
  if (const tf_strategy_vtable* v = out.strategy();
      v && (v->pack_activation == nullptr) != (v->unpack_activation == nullptr))
    throw fail(
        "the strategy vtable has only one of pack_activation and unpack_activation; an "
        "activation it packs could never come back");
  if (const tf_model_vtable* m = out.model()) {
    const char* types = m->hf_model_types;
    std::stringstream list(types ? std::string(types, strnlen(types, 4096)) : std::string());
    for (std::string t; std::getline(list, t, ',');)
      if (!t.empty()) out.hf_model_types.push_back(t);
    out.model_features = m->features;
  }
  try {
    out.keys = key_specs_from_abi(d.config_keys, d.n_config_keys);
    check_key_searches(out.keys, out.name);
    // The slot was reserved (zero) before 1.23.
    if (TF_VERSION_MINOR(d.abi_version) >= 23) out.search = plugin_search_from_abi(d.search);
  } catch (const std::exception& e) {
    throw fail(e.what());
  }
  out.abi_version = d.abi_version;
  out.flags = d.flags;
  out.hooks = vtable_hooks(out);
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
    for (std::string dir; std::getline(ss, dir, ':');) {
      if (dir.empty()) continue;
      if (dir.front() != '/') {
        r.path_problems_.push_back(
            "TIGHTFIT_PLUGIN_PATH entry \"" + dir +
            "\" is relative and is ignored: plugins never load from the working directory. "
            "Give the folder's absolute path (for example \"$PWD/" +
            dir + "\")");
        r.problems_.push_back(r.path_problems_.back());
        continue;
      }
      r.add_path(dir, "TIGHTFIT_PLUGIN_PATH");
    }
  }
  return r;
}

void PluginRegistry::add_path(const std::string& dir_in, const std::string& origin) {
  const std::string dir = fs::absolute(dir_in).lexically_normal().string();
  auto refuse_path = [&](const std::string& why) {
    path_problems_.push_back(why);
    problems_.push_back(why);
  };
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) {
    files.push_back(dir);
  } else if (fs::is_directory(dir, ec)) {
    if (const std::string why = plugin_path_trust_problem(dir); !why.empty())
      return refuse_path(why);
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.is_regular_file() && e.path().extension() == ".so") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
  } else {
    return refuse_path("plugin path " + dir + " (" + origin + ") does not exist");
  }
  std::vector<std::string> trusted;
  for (const auto& f : files) {
    if (const std::string why = plugin_path_trust_problem(f); !why.empty())
      problems_.push_back(why);
    else
      trusted.push_back(f);
  }
  const std::vector<PluginScanResult> scans = scan_plugin_files(trusted, origin);
  for (size_t i = 0; i < trusted.size(); ++i) {
    if (!scans[i].info) {
      problems_.push_back(scans[i].problem);
      continue;
    }
    auto entry = std::make_shared<Entry>();
    entry->info = *scans[i].info;
    const PluginInfo& p = entry->info;
    auto [it, added] = by_name_.emplace(p.name, entry);
    if (added || fs::equivalent(it->second->info.path, p.path, ec)) continue;
    const std::string message = "two plugins are named \"" + p.name +
                                "\": " + it->second->info.path + " (" + it->second->info.origin +
                                ") and " + p.path + " (" + origin +
                                "); remove one from the plugin folders or rename it";
    if (conflicts_.emplace(p.name, message).second) problems_.push_back(message);
  }
}

const PluginInfo* PluginRegistry::find_any(const std::string& name) const {
  if (auto c = conflicts_.find(name); c != conflicts_.end()) throw PluginLoadError(c->second);
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second->info;
}

const PluginInfo* PluginRegistry::find_hf_model_type(const std::string& model_type) const {
  for (const auto& [name, e] : by_name_)
    if (e->info.kind == TF_PLUGIN_MODEL &&
        std::find(e->info.hf_model_types.begin(), e->info.hf_model_types.end(), model_type) !=
            e->info.hf_model_types.end())
      return &e->info;
  return nullptr;
}

const LoadedPlugin& PluginRegistry::find(const std::string& name, tf_plugin_kind kind,
                                         const std::string& sha256_pin) const {
  const PluginInfo* info = find_any(name);
  if (info && info->kind == kind) {
    Entry& e = *by_name_.at(name);
    std::lock_guard<std::mutex> lock(e.mutex);
    // A pin is checked on the scanned bytes before loading, and again on
    // the descriptor that is loaded.
    const std::string& known = e.loaded ? e.loaded->sha256 : e.info.sha256;
    if (!sha256_pin.empty() && known != sha256_pin)
      throw PluginPinMismatch(
          "plugin " + e.info.path + " has SHA-256 " + known + ", not the pinned " + sha256_pin,
          known);
    if (!e.loaded) {
      auto loaded = std::make_shared<LoadedPlugin>(
          load_plugin_file(e.info.path, e.info.origin, sha256_pin, &e.info.file));
      if (loaded->name != e.info.name || loaded->kind != e.info.kind)
        throw PluginLoadError("plugin " + e.info.path + " declares \"" + loaded->name +
                              "\" when loaded but \"" + e.info.name +
                              "\" when scanned; a library must declare the same plugin every "
                              "time it is loaded");
      e.loaded = std::move(loaded);
    }
    return *e.loaded;
  }
  std::ostringstream os;
  os << "no " << plugin_kind_name(kind) << " plugin named \"" << name << "\"";
  if (info) os << " (\"" << name << "\" is a " << plugin_kind_name(info->kind) << " plugin)";
  os << ". Installed " << plugin_kind_name(kind) << " plugins:";
  bool any = false;
  for (const auto& [n, q] : by_name_)
    if (q->info.kind == kind) {
      os << " " << n;
      any = true;
    }
  if (!any) os << " (none)";
  for (const auto& prob : problems_)
    if (prob.find(name) != std::string::npos ||
        std::find(path_problems_.begin(), path_problems_.end(), prob) != path_problems_.end())
      os << "\n  note: " << prob;
  os << "\nAdd a plugin folder with TIGHTFIT_PLUGIN_PATH or [run] plugin_paths";
  throw PluginLoadError(os.str());
}

std::vector<const PluginInfo*> PluginRegistry::all() const {
  std::vector<const PluginInfo*> out;
  for (const auto& [n, e] : by_name_) out.push_back(&e->info);
  return out;
}

}  // namespace tightfit
