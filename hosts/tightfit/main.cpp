// tightfit: train language models that do not fit. Subcommands in the style
// of torchtune's `tune`: run, plugins.
#include <csignal>
#include <iostream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "logging.hpp"

namespace {

void usage(std::ostream& os) {
  os << "usage: tightfit <command> [options]\n\n"
        "commands:\n"
        "  run [recipe.toml] [--set k=v]...   train as the recipe says (default: "
        "configs/default.toml)\n"
        "  generate RECIPE|MODEL_DIR -p TEXT  sample from a run's latest checkpoint or a Hugging "
        "Face model\n"
        "  export RECIPE --out DIR            write a run's latest checkpoint as a Hugging Face "
        "model folder\n"
        "                                     (--adapter: only the adapters, as PEFT writes them)\n"
        "  ab A.toml B.toml [--seeds N]       compare recipes on the same seeds, data and steps\n"
        "  ab BASE.toml --vary KEY=V1,V2      ... or one recipe with a key varied\n"
        "  plan RECIPE [--budget 8GiB]        predicted peak memory by category and tier, before "
        "running\n"
        "  fit RECIPE --budget 8GiB           the fastest stack of strategies that fits, written "
        "as a recipe\n"
        "  plugins list                       installed plugins: kind, versions, origin, path\n"
        "  plugins info NAME                  a plugin's recipe keys with types, defaults, docs\n\n"
        "`tightfit <command> --help` shows a command's options.\n";
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
  const std::string cmd = args[0];
  args.erase(args.begin());
  if (cmd == "run") return tightfit::host::run_command(args);
  if (cmd == "plugins") return tightfit::host::plugins_command(args);
  if (cmd == "generate") return tightfit::host::generate_command(args);
  if (cmd == "export") return tightfit::host::export_command(args);
  if (cmd == "ab") return tightfit::host::ab_command(args);
  if (cmd == "plan") return tightfit::host::plan_command(args);
  if (cmd == "fit") return tightfit::host::fit_command(args);
  std::cerr << "tightfit: unknown command \"" << cmd << "\"\n\n";
  usage(std::cerr);
  return tightfit::host::kUsage;
}
