// Scanning plugin libraries in a child process, as GStreamer's registry
// scanner does: a library's constructors and entry function run first in
// `tightfit-plugin-scan`, never in the host, so a library that crashes or
// hangs when loaded fails its scan instead of taking the host down. What a
// scan learns is cached by path, device, inode, size and modification time
// (plugin_scan_cache.hpp), so a library is scanned again only when it changes.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "plugin_loader.hpp"

namespace tightfit {

struct PluginScanResult {
  std::optional<PluginInfo> info;  // what the library declares, if it loaded
  std::string problem;             // else why not, naming the file
  bool cacheable = true;           // false for a scan cut off by the time limit
};

// Scans each of `paths` (absolute) in a child process, consulting and
// updating the cache; one result per path, in order. Never throws for a
// library's sake; an absent scanner makes every result a problem that says so.
std::vector<PluginScanResult> scan_plugin_files(const std::vector<std::string>& paths,
                                                const std::string& origin);

// A file's identity as the scanner's answers and the cache record it.
nlohmann::json file_identity_json(const FileIdentity& id);

// The scanner's answer for one library, one line of JSON.
nlohmann::json plugin_info_to_json(const PluginInfo& info);
// Reads an answer back, checking every field (the scanner ran untrusted
// code, so its output is untrusted too). Throws std::invalid_argument.
PluginInfo plugin_info_from_json(const nlohmann::json& j);

// The scanner program: TIGHTFIT_PLUGIN_SCANNER, else `tightfit-plugin-scan`
// in the bin/ folder beside the kernel library's lib/ folder.
std::string plugin_scanner_path();

// The scanner's main: answers one line per path on `out_fd`.
int plugin_scanner_main(int argc, char** argv);

}  // namespace tightfit
