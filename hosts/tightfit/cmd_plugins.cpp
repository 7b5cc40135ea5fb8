// `tightfit plugins list|info NAME|check FILE`: what is installed, its recipe
// keys, and whether one library would load.
#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <iomanip>
#include <iostream>

#include "commands.hpp"
#include "plugin_loader.hpp"
#include "plugin_scan.hpp"
#include "recipe.hpp"

namespace tightfit::host {

namespace {
namespace fs = std::filesystem;

void print_keys(const std::vector<KeySpec>& keys) {
  // The name column fits the longest name, so no name runs into its type.
  size_t width = 15;
  for (const auto& k : keys) width = std::max(width, k.name.size());
  for (const auto& k : keys) {
    std::cout << "  " << std::left << std::setw(static_cast<int>(width + 1)) << k.name
              << std::setw(17) << value_type_name(k.type)
              << (k.default_value ? "default " + *k.default_value : std::string("required"))
              << "\n";
    std::cout << "      " << k.doc;
    if (k.min_value <= k.max_value) std::cout << " [" << k.min_value << ", " << k.max_value << "]";
    if (!k.choices.empty()) std::cout << " (one of: " << k.choices << ")";
    std::cout << "\n";
  }
}

// The registry `tightfit run` would use for `recipe` (empty: the installed
// plugins): the built-in folder, TIGHTFIT_PLUGIN_PATH, the recipe's plugin_paths.
PluginRegistry registry_for(const std::string& recipe_path) {
  PluginRegistry reg = PluginRegistry::discover();
  if (recipe_path.empty()) return reg;
  const Recipe recipe = Recipe::load(recipe_path);
  const toml::table* run = recipe.table("run");
  const fs::path base = fs::absolute(recipe_path).parent_path();
  if (const toml::array* paths = run ? run->get_as<toml::array>("plugin_paths") : nullptr)
    for (const auto& v : *paths)
      if (const auto* str = v.as_string()) {
        fs::path path = str->get();
        reg.add_path((path.is_relative() ? base / path : path).string(), "recipe");
      }
  return reg;
}

void print_list(const PluginRegistry& reg) {
  std::cout << std::left << std::setw(18) << "NAME" << std::setw(10) << "KIND" << std::setw(9)
            << "VERSION" << std::setw(5) << "ABI" << std::setw(10) << "LIBTORCH" << std::setw(22)
            << "ORIGIN"
            << "PATH\n";
  for (const PluginInfo* p : reg.all())
    std::cout << std::left << std::setw(18) << p->name << std::setw(10) << plugin_kind_name(p->kind)
              << std::setw(9) << p->version << std::setw(5) << abi_version_string(p->abi_version)
              << std::setw(10)
              << (p->flags & TF_PLUGIN_FLAG_STABLE_ABI_ONLY ? "stable" : p->libtorch_version)
              << std::setw(22) << p->origin << p->path << "\n";
  for (const auto& prob : reg.problems()) std::cerr << "warning: " << prob << "\n";
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

void print_info(const PluginInfo& p) {
  std::cout << p.name << " " << p.version << " (" << plugin_kind_name(p.kind) << " plugin)\n"
            << "  " << p.description << "\n"
            << "  ABI " << abi_version_string(p.abi_version) << ", LibTorch " << p.libtorch_version
            << (p.flags & TF_PLUGIN_FLAG_STABLE_ABI_ONLY
                    ? " (stable C subset only: loads with any LibTorch)"
                    : "")
            << ", " << p.origin << ": " << p.path << "\n"
            << (p.hf_model_types.empty()
                    ? std::string()
                    : "  Hugging Face model types: " + join(p.hf_model_types, ", ") + "\n")
            << (p.kind != TF_PLUGIN_MODEL ? ""
                : p.model_features & TF_MODEL_FEATURE_POSITIONS
                    ? "  packed rows ([data] packing = true): yes, reads per-token positions\n"
                    : "  packed rows ([data] packing = true): no\n")
            << "  sha256 " << p.sha256
            << "  (pin it in a recipe: sha256 = \"...\" in the plugin's table)\n\nrecipe keys:\n";
  if (p.keys.empty()) std::cout << "  (none)\n";
  print_keys(p.keys);
}

// What `plugins check` verifies beyond loading: the hooks a plugin of its
// kind offers, so an author sees at a glance what the host will call.
void print_hooks(const PluginInfo& p) {
  std::cout << "hooks         " << join(p.hooks, ", ") << "\n";
  const bool planned = p.kind == TF_PLUGIN_MODEL || std::find(p.hooks.begin(), p.hooks.end(),
                                                              "estimate_memory") != p.hooks.end();
  if (!planned)
    std::cout << "warning       no estimate_memory hook: `tightfit plan` and `fit` will say its "
                 "effect is not in their plans\n";
}

constexpr const char* kUsageText =
    "usage: tightfit plugins list [--recipe RECIPE]\n"
    "       tightfit plugins info NAME [--recipe RECIPE]\n"
    "       tightfit plugins check FILE\n\n"
    "Plugins come from the built-in folder, then TIGHTFIT_PLUGIN_PATH (colon-separated "
    "folders or files), then a recipe's [run] plugin_paths. `check` loads one library the way "
    "`run` would (ABI and LibTorch versions, descriptor, vtable, recipe keys) without creating "
    "or running it; like every scan, it loads the library in a separate process "
    "(tightfit-plugin-scan), so a library that crashes or hangs when loaded cannot take "
    "tightfit down.\n";

}  // namespace

int plugins_command(const std::vector<std::string>& args_in) {
  std::vector<std::string> args;
  std::string recipe_path;
  for (size_t i = 0; i < args_in.size(); ++i) {
    if (args_in[i] == "--recipe" && i + 1 < args_in.size())
      recipe_path = args_in[++i];
    else
      args.push_back(args_in[i]);
  }
  const std::string sub = args.empty() ? "list" : args[0];
  if (sub == "--help" || sub == "-h") {
    std::cout << kUsageText;
    return kOk;
  }
  try {
    if (sub == "list") {
      print_list(registry_for(recipe_path));
      return kOk;
    }
    if (sub == "info") {
      if (args.size() < 2) {
        std::cerr << kUsageText;
        return kUsage;
      }
      const PluginRegistry reg = registry_for(recipe_path);
      const PluginInfo* p = reg.find_any(args[1]);
      if (!p) {
        std::string names;
        for (const PluginInfo* q : reg.all()) names += (names.empty() ? "" : ", ") + q->name;
        std::cerr << "tightfit: no plugin named \"" << args[1] << "\"; installed: " << names
                  << " (see `tightfit plugins list`)\n";
        return kUsage;
      }
      print_info(*p);
      return kOk;
    }
    if (sub == "check") {
      if (args.size() < 2) {
        std::cerr << kUsageText;
        return kUsage;
      }
      const std::string file = fs::absolute(args[1]).lexically_normal().string();
      if (const std::string why = plugin_path_trust_problem(file); !why.empty())
        throw PluginLoadError(why);
      const PluginScanResult scan = scan_plugin_files({file}, "file").front();
      if (!scan.info) throw PluginLoadError(scan.problem);
      std::cout << "ok            " << scan.info->path << "\n";
      print_info(*scan.info);
      print_hooks(*scan.info);
      return kOk;
    }
  } catch (...) {
    return report_current_error();
  }
  std::cerr << "tightfit plugins: unknown subcommand \"" << sub
            << "\" (list, info NAME, check FILE)\n";
  return kUsage;
}

}  // namespace tightfit::host
