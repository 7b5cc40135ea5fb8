// `tightfit export`: write a trained model — a recipe's latest checkpoint, a
// Hugging Face model folder or a GGUF file — as a Hugging Face folder, a PEFT
// adapter, or a GGUF file for llama.cpp and ollama.
#include <boost/program_options.hpp>
#include <iostream>

#include "commands.hpp"
#include "logging.hpp"
#include "memory_accounting.hpp"
#include "recipe.hpp"
#include "trained_model.hpp"

namespace tightfit::host {
namespace po = boost::program_options;

int export_command(const std::vector<std::string>& args) {
  po::options_description opts("tightfit export RECIPE.toml --out DIR|FILE.gguf [options]");
  opts.add_options()("help,h", "show this help")("out,o", po::value<std::string>(),
                                                 "folder (or .gguf file) to write")(
      "format", po::value<std::string>(),
      "hf (a Hugging Face folder; the default) or gguf (one file for llama.cpp, ollama, LM "
      "Studio; the default when --out ends in .gguf)")(
      "outtype", po::value<std::string>(),
      "GGUF tensor type: f32, f16, bf16 or q8_0 (default f16 for a model, f32 for an adapter, "
      "as llama.cpp's converters)")(
      "adapter",
      "write only the adapters (LoRA: a PEFT adapter folder for PeftModel.from_pretrained)")(
      "unmerged",
      "write the base model without merging adapters into it (the model a PEFT adapter applies "
      "to)")("max-shard-size", po::value<std::string>()->default_value("5GB"),
             "weights go in safetensors shards of at most this size, with "
             "model.safetensors.index.json (as save_pretrained)")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a recipe key");
  po::variables_map vm;
  if (!parse_command_line(args, opts, "target", "export", vm)) return kUsage;
  if (vm.count("help") || !vm.count("target") || !vm.count("out")) {
    return print_usage(
        vm, opts,
        "\nWrites the run's latest checkpoint as a Hugging Face model folder that "
        "transformers' from_pretrained loads (adapters merged into their weights), or with "
        "--adapter only the adapters. With --format gguf (or --out NAME.gguf): one GGUF file "
        "that llama.cpp and ollama load, the model merged or (--adapter) a llama.cpp LoRA "
        "adapter for the base GGUF.\n");
  }
  if (vm.count("adapter") && vm.count("unmerged")) {
    std::cerr << "tightfit export: --adapter and --unmerged write different folders; run export "
                 "once for each\n";
    return kUsage;
  }
  const std::string out = vm["out"].as<std::string>();
  const bool ends_gguf = out.size() > 5 && out.substr(out.size() - 5) == ".gguf";
  const std::string format =
      vm.count("format") ? vm["format"].as<std::string>() : (ends_gguf ? "gguf" : "hf");
  if (format != "hf" && format != "gguf") {
    std::cerr << "tightfit export: --format " << format << ": hf or gguf\n";
    return kUsage;
  }
  const bool gguf = format == "gguf";
  if (gguf && vm.count("unmerged")) {
    std::cerr << "tightfit export: --unmerged writes a Hugging Face folder for a PEFT adapter; a "
                 "GGUF adapter (--adapter --format gguf) applies to the base GGUF file\n";
    return kUsage;
  }
  if (!gguf && vm.count("outtype")) {
    std::cerr << "tightfit export: --outtype is the GGUF tensor type; add --format gguf\n";
    return kUsage;
  }
  set_log_level("warn");
  try {
    auto session = load_target(vm);
    int64_t shard = 0;
    try {
      shard = parse_byte_size(vm["max-shard-size"].as<std::string>());
    } catch (const std::invalid_argument& e) {
      throw RecipeError(std::string("--max-shard-size: ") + e.what());
    }
    if (shard <= 0) throw RecipeError("--max-shard-size must be positive");
    if (gguf) {
      const bool adapter = vm.count("adapter") > 0;
      const std::string type =
          vm.count("outtype") ? vm["outtype"].as<std::string>() : (adapter ? "f32" : "f16");
      std::cout << "wrote "
                << (adapter ? session->export_adapter_gguf(out, type)
                            : session->export_gguf(out, type))
                << "\n";
      return kOk;
    }
    std::cout << "wrote "
              << (vm.count("adapter") ? session->export_adapter(out)
                                      : session->export_hf(out, !vm.count("unmerged"), shard))
              << "\n";
    return kOk;
  } catch (...) {
    return report_current_error();
  }
}

}  // namespace tightfit::host
