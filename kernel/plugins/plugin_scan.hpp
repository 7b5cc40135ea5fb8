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

#include "plugin_info.hpp"

namespace tightfit {

// Scans each of `paths` (absolute) in a child process, consulting and
// updating the cache; one result per path, in order. Never throws for a
// library's sake; an absent scanner makes every result a problem that says so.
std::vector<PluginScanResult> scan_plugin_files(const std::vector<std::string>& paths,
                                                const std::string& origin);

// The scanner program: TIGHTFIT_PLUGIN_SCANNER, else `tightfit-plugin-scan`
// in the bin/ folder beside the kernel library's lib/ folder.
std::string plugin_scanner_path();

}  // namespace tightfit
