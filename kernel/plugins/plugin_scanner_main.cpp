#include "plugin_scanner_main.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>

#include "file_util.hpp"
#include "plugin_loader.hpp"
#include "plugin_scan.hpp"

namespace tightfit {

int plugin_scanner_main(int argc, char** argv) {
  // Answers go to the pipe the host gave as stdout; what the libraries
  // themselves print goes nowhere, so it cannot be taken for an answer.
  const int answers = ::dup(1);
  const int null_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (answers < 0 || null_fd < 0 || ::dup2(null_fd, 1) < 0) return 2;
  ::fcntl(answers, F_SETFD, FD_CLOEXEC);
  for (int i = 1; i < argc; ++i) {
    nlohmann::json answer = {{"path", argv[i]}};
    try {
      answer["info"] = plugin_info_to_json(load_plugin_file(argv[i], "scan"));
    } catch (const std::exception& e) {
      answer["error"] = e.what();
    }
    const std::string line =
        answer.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    try {
      write_all(answers, line.data(), line.size(), "the plugin scanner's output");
    } catch (const std::exception&) {
      return 2;
    }
  }
  return 0;
}

}  // namespace tightfit
