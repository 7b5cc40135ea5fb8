#include "logging.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace tightfit {

void log_message(tf_log_level level, const std::string& message) {
  switch (level) {
    case TF_LOG_DEBUG:
      spdlog::debug(message);
      break;
    case TF_LOG_INFO:
      spdlog::info(message);
      break;
    case TF_LOG_WARN:
      spdlog::warn(message);
      break;
    default:
      spdlog::error(message);
      break;
  }
}

void set_log_level(const std::string& level) {
  spdlog::set_level(spdlog::level::from_str(level));
}

void configure_console_logging() {
  auto logger = spdlog::stderr_color_mt("tightfit");
  logger->set_pattern("%^[%l]%$ %v");
  spdlog::set_default_logger(logger);
}

}  // namespace tightfit
