// Logging through spdlog, kept behind this small interface: LibTorch ships its
// own {fmt} headers, so spdlog (built against Debian's {fmt}) is compiled in a
// translation unit that never sees LibTorch's include path.
#pragma once

#include <string>

#include "tightfit/plugin_api.h"

namespace tightfit {

void log_message(tf_log_level level, const std::string& message);
// "debug", "info", "warn", "error", "off".
void set_log_level(const std::string& level);
// Plain "[level] message" lines on stderr, for the command-line host.
void configure_console_logging();

}  // namespace tightfit
