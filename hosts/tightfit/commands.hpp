// The host's subcommands. Each returns the process exit code.
#pragma once

#include <boost/program_options.hpp>
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

// Parses a subcommand's options plus one positional argument named
// `positional`; on a syntax error prints the message and the options to
// stderr and returns false.
bool parse_command_line(const std::vector<std::string>& args,
                        const boost::program_options::options_description& opts,
                        const char* positional, const char* command,
                        boost::program_options::variables_map& vm);

// The answer to --help (the options and `about` on stdout, exit 0) or to a
// command line that lacks what the command needs (the same on stderr, exit
// kUsage).
int print_usage(const boost::program_options::variables_map& vm,
                const boost::program_options::options_description& opts,
                const std::string& about = "");

// Writes `line` and a newline to stderr in one write: the ranks of a run
// and their launcher share the terminal, and a message written piece by
// piece interleaves with another process's.
void write_stderr_line(const std::string& line);

// Inside a catch block: prints the exception being handled as the plan and
// fit commands report it and returns its exit code (recipe errors kUsage,
// plugin errors kPluginError, anything else kFailure).
int report_current_error();

// A subcommand: its arguments after the command's name, its exit code.
using CommandFn = int (*)(const std::vector<std::string>& args);

int run_command(const std::vector<std::string>& args);
int plugins_command(const std::vector<std::string>& args);
int generate_command(const std::vector<std::string>& args);
int export_command(const std::vector<std::string>& args);
int ab_command(const std::vector<std::string>& args);
int plan_command(const std::vector<std::string>& args);
int fit_command(const std::vector<std::string>& args);

}  // namespace tightfit::host
