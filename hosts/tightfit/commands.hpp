// The host's subcommands. Each returns the process exit code.
#pragma once

#include <string>
#include <vector>

namespace tightfit::host {

// Exit codes shared by the subcommands.
enum ExitCode : int {
  kOk = 0,
  kFailure = 1,
  kUsage = 2,        // bad command line or recipe
  kOutOfBudget = 3,  // run.memory_budget exceeded
  kPluginError = 4,  // a plugin failed or could not be loaded
};

int run_command(const std::vector<std::string>& args);
int plugins_command(const std::vector<std::string>& args);
int generate_command(const std::vector<std::string>& args);
int export_command(const std::vector<std::string>& args);

}  // namespace tightfit::host
