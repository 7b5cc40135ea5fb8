// tightfit: train language models that do not fit. Subcommands in the style
// of torchtune's `tune`, from one table that gives the usage text and the
// dispatch.
#include <torch/version.h>

#include <csignal>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "logging.hpp"
#include "terminal_progress.hpp"
#include "tightfit/plugin_api.h"

namespace {

using tightfit::host::CommandFn;

struct Command {
  const char* name;
  CommandFn run;
  // The usage lines: each a form of the command line and what it does (a
  // '\n' in it continues under the description column).
  std::vector<std::pair<const char*, const char*>> forms;
};

const std::vector<Command>& commands() {
  using namespace tightfit::host;
  static const std::vector<Command> table = {
      {"run",
       run_command,
       {{"run [recipe.toml] [--set k=v]...",
         "train as the recipe says (default: configs/default.toml)"}}},
      {"generate",
       generate_command,
       {{"generate RECIPE|MODEL_DIR -p TEXT",
         "sample from a run's latest checkpoint or a Hugging Face model"}}},
      {"export",
       export_command,
       {{"export RECIPE --out DIR",
         "write a run's latest checkpoint as a Hugging Face model folder\n"
         "(--adapter: only the adapters, as PEFT writes them; --out F.gguf: GGUF)"}}},
      {"ab",
       ab_command,
       {{"ab A.toml B.toml [--seeds N]", "compare recipes on the same seeds, data and steps"},
        {"ab BASE.toml --vary KEY=V1,V2", "... or one recipe with a key varied"}}},
      {"plan",
       plan_command,
       {{"plan RECIPE [--budget 8GiB]",
         "predicted peak memory by category and tier, before running"}}},
      {"fit",
       fit_command,
       {{"fit RECIPE --budget 8GiB",
         "the fastest stack of strategies that fits, written as a "
         "recipe"}}},
      {"plugins",
       plugins_command,
       {{"plugins list", "installed plugins: kind, versions, origin, path"},
        {"plugins info NAME", "a plugin's recipe keys with types, defaults, docs"}}},
  };
  return table;
}

void usage(std::ostream& os) {
  constexpr size_t kColumn = 35;  // where the descriptions start, after "  "
  os << "usage: tightfit <command> [options]\n\ncommands:\n";
  for (const Command& c : commands())
    for (const auto& [form, what] : c.forms) {
      std::string line = std::string("  ") + form;
      line.append(line.size() < kColumn + 2 ? kColumn + 2 - line.size() : 1, ' ');
      for (const char* p = what; *p; ++p)
        line += *p == '\n' ? "\n" + std::string(kColumn + 2, ' ') : std::string(1, *p);
      os << line << "\n";
    }
  os << "\n`tightfit <command> --help` shows a command's options; `tightfit --version` the "
        "build.\n";
}

}  // namespace

int main(int argc, char** argv) {
  // A file size limit (ulimit -f) then fails the write with EFBIG, which
  // every writer reports and cleans up after, instead of killing the process
  // mid-file with its temporary files left behind.
  std::signal(SIGXFSZ, SIG_IGN);
  tightfit::configure_console_logging();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    usage(args.empty() ? std::cerr : std::cout);
    return args.empty() ? tightfit::host::kUsage : tightfit::host::kOk;
  }
  if (args[0] == "--version" || args[0] == "-V" || args[0] == "version") {
    // What a bug report needs: this build, the plugin ABI it hosts, and the
    // LibTorch it runs on.
    std::cout << "tightfit " << TIGHTFIT_VERSION << " (plugin ABI " << TF_ABI_VERSION_MAJOR << "."
              << TF_ABI_VERSION_MINOR << ", LibTorch " << TORCH_VERSION << ")\n";
    return tightfit::host::kOk;
  }
  // Long phases show a line that updates on a terminal (`run -q` turns it off).
  tightfit::host::show_progress_on_terminal(false);
  const std::string cmd = args[0];
  args.erase(args.begin());
  for (const Command& c : commands())
    if (cmd == c.name) return c.run(args);
  std::cerr << "tightfit: unknown command \"" << cmd << "\"\n\n";
  usage(std::cerr);
  return tightfit::host::kUsage;
}
