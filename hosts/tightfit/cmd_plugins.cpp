// `tightfit plugins list|info NAME`: what is installed and its recipe keys.
#include <algorithm>
#include <iomanip>
#include <iostream>

#include "commands.hpp"
#include "plugin_loader.hpp"

namespace tightfit::host {

namespace {

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

}  // namespace

int plugins_command(const std::vector<std::string>& args) {
  const std::string sub = args.empty() ? "list" : args[0];
  if (sub == "--help" || sub == "-h") {
    std::cout
        << "usage: tightfit plugins list\n       tightfit plugins info NAME\n\n"
           "Plugins come from the built-in folder, then TIGHTFIT_PLUGIN_PATH (colon-separated "
           "folders or files), then a recipe's [run] plugin_paths.\n";
    return kOk;
  }
  PluginRegistry reg = PluginRegistry::discover();
  if (sub == "list") {
    std::cout << std::left << std::setw(14) << "NAME" << std::setw(10) << "KIND" << std::setw(9)
              << "VERSION" << std::setw(5) << "ABI" << std::setw(10) << "LIBTORCH" << std::setw(22)
              << "ORIGIN"
              << "PATH\n";
    for (const LoadedPlugin* p : reg.all())
      std::cout << std::left << std::setw(14) << p->name << std::setw(10)
                << plugin_kind_name(p->descriptor.kind) << std::setw(9) << p->version
                << std::setw(5) << abi_version_string(p->descriptor.abi_version) << std::setw(10)
                << (p->descriptor.flags & TF_PLUGIN_FLAG_STABLE_ABI_ONLY ? "stable"
                                                                         : p->libtorch_version)
                << std::setw(22) << p->origin << p->path << "\n";
    for (const auto& prob : reg.problems()) std::cerr << "warning: " << prob << "\n";
    return kOk;
  }
  if (sub == "info") {
    if (args.size() < 2) {
      std::cerr << "usage: tightfit plugins info NAME\n";
      return kUsage;
    }
    const LoadedPlugin* p = reg.find_any(args[1]);
    if (!p) {
      std::cerr << "tightfit: no plugin named \"" << args[1]
                << "\" (see `tightfit plugins list`)\n";
      return kPluginError;
    }
    std::cout << p->name << " " << p->version << " (" << plugin_kind_name(p->descriptor.kind)
              << " plugin)\n"
              << "  " << p->description << "\n"
              << "  ABI " << abi_version_string(p->descriptor.abi_version) << ", LibTorch "
              << p->libtorch_version << ", " << p->origin << ": " << p->path
              << "\n\nrecipe keys:\n";
    print_keys(p->keys);
    return kOk;
  }
  std::cerr << "tightfit plugins: unknown subcommand \"" << sub << "\" (list, info NAME)\n";
  return kUsage;
}

}  // namespace tightfit::host
