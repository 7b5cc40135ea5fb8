// `tightfit generate` and `tightfit export`: load a trained model — a recipe's
// latest checkpoint, or a Hugging Face model folder — and sample text from it
// or write it as a Hugging Face folder.
#include <toml++/toml.h>

#include <boost/program_options.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat_data.hpp"
#include "chat_prompter.hpp"
#include "chat_template.hpp"
#include "commands.hpp"
#include "file_util.hpp"
#include "generation.hpp"
#include "gguf_folder.hpp"
#include "gguf_model.hpp"
#include "json_input.hpp"
#include "logging.hpp"
#include "memory_accounting.hpp"
#include "session.hpp"

namespace tightfit::host {
namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

// A recipe that builds the model a Hugging Face folder describes, with the
// model plugin that declares its model_type; its weights from `weights`
// (the folder itself, or the GGUF file the folder was converted from).
Recipe recipe_for_model_folder(const fs::path& folder, const PluginRegistry& plugins,
                               const std::string& weights) {
  nlohmann::json cfg;
  try {
    cfg = read_json_file((folder / "config.json").string(), size_t{16} << 20);
  } catch (const std::invalid_argument& e) {
    throw RecipeError(std::string(e.what()) + ": not a Hugging Face config.json");
  }
  if (!cfg.is_object())
    throw RecipeError((folder / "config.json").string() + ": not a Hugging Face config.json");
  const auto type_key = cfg.find("model_type");
  const std::string type =
      type_key != cfg.end() && type_key->is_string() ? type_key->get<std::string>() : "";
  const PluginInfo* plugin = plugins.find_hf_model_type(type);
  if (!plugin) {
    std::string known;
    for (const PluginInfo* p : plugins.all())
      for (const auto& t : p->hf_model_types) known += (known.empty() ? "" : ", ") + t;
    throw RecipeError((folder / "config.json").string() + ": model_type \"" + type +
                      "\" has no tightfit model plugin (installed: " + known + ")");
  }
  auto positive = [&](const char* key) -> int64_t {
    const auto it = cfg.find(key);
    return it != cfg.end() && it->is_number_integer() && it->get<int64_t>() > 0 ? it->get<int64_t>()
                                                                                : 0;
  };
  int64_t positions = 1024;
  for (const char* key : {"n_positions", "max_position_embeddings", "context_length"})
    if (positive(key)) {
      positions = positive(key);
      break;
    }
  // The folder's path goes into the recipe as a TOML string value, never pasted as text.
  const std::string f = fs::absolute(folder).string();
  toml::table model{{"plugin", plugin->name}, {"config", f}, {"weights", weights}};
  toml::table doc{{"run", toml::table{{"name", "generate"}, {"sample_tokens", 0}}},
                  {"model", model},
                  {"data", toml::table{{"seq_len", std::min<int64_t>(positions, 1024)}}}};
  std::ostringstream text;
  text << doc;
  return Recipe::parse(text.str(), f + "/config.json");
}

// A session over TARGET (a recipe: its latest checkpoint; or a model folder).
std::unique_ptr<Session> load_target(const std::string& target,
                                     const std::vector<std::string>& sets) {
  const bool gguf_file = !fs::is_directory(target) && gguf::looks_like_gguf(target);
  const bool folder = fs::is_directory(target) || gguf_file;
  PluginRegistry plugins = PluginRegistry::discover();
  // A GGUF file reads as the Hugging Face folder converted from its metadata.
  const std::string weights = gguf_file ? fs::absolute(target).string() : "";
  Recipe recipe = !folder ? Recipe::load(target)
                  : gguf_file
                      ? recipe_for_model_folder(gguf::model_folder(target).path, plugins, weights)
                      : recipe_for_model_folder(target, plugins, fs::absolute(target).string());
  for (const auto& s : sets) recipe.apply_override(s);
  SessionOptions so;
  so.skip_data = true;
  so.resume = !folder;
  auto session = std::make_unique<Session>(recipe, std::move(plugins), so);
  // Never a freshly initialized model in place of a trained one.
  if (!folder && session->step() == 0)
    throw RecipeError("no checkpoint of " + target + " in " + session->env().checkpoint_dir() +
                      ": train it first (tightfit run " + target +
                      "), or give a Hugging Face model folder instead of the recipe");
  return session;
}

// The session `target` and its `--set`s name.
std::unique_ptr<Session> load_target(const po::variables_map& vm) {
  return load_target(vm["target"].as<std::string>(), vm.count("set")
                                                         ? vm["set"].as<std::vector<std::string>>()
                                                         : std::vector<std::string>{});
}

int report(const std::exception& e) {
  if (dynamic_cast<const RecipeError*>(&e)) {
    std::cerr << "tightfit: recipe error: " << e.what() << "\n";
    return kUsage;
  }
  if (dynamic_cast<const PluginLoadError*>(&e) || dynamic_cast<const PluginCallError*>(&e)) {
    std::cerr << "tightfit: " << e.what() << "\n";
    return kPluginError;
  }
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) {
    std::cerr << "tightfit: " << c->what_without_backtrace() << "\n";
    return kFailure;
  }
  std::cerr << "tightfit: " << e.what() << "\n";
  return kFailure;
}

}  // namespace

int generate_command(const std::vector<std::string>& args) {
  po::options_description opts("tightfit generate RECIPE.toml|MODEL_FOLDER|MODEL.gguf [options]");
  opts.add_options()("help,h", "show this help")(
      "prompt,p", po::value<std::string>()->default_value("\n"), "text to continue")(
      "tokens,n", po::value<int64_t>()->default_value(200), "tokens to generate")(
      "temperature,t", po::value<double>()->default_value(0.8), "sampling temperature; 0 = greedy")(
      "top-k", po::value<int64_t>()->default_value(40),
      "sample among the k likeliest; 1 = greedy, 0 = all")(
      "top-p", po::value<double>()->default_value(1.0),
      "nucleus: the smallest set with this much mass")("greedy", "always the likeliest token")(
      "seed", po::value<uint64_t>()->default_value(1234), "sampling seed")(
      "chat", po::value<std::string>(),
      "a user message, rendered with the model's chat template; stops at its EOS")(
      "prompts", po::value<std::string>(),
      "a file of prompts, one a line (or JSONL rows with \"prompt\" or \"messages\"); "
      "each is answered in turn")("no-cache",
                                  "recompute the context for every token (no key/value cache)")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a recipe key");
  po::variables_map vm;
  if (!parse_command_line(args, opts, "target", "generate", vm)) return kUsage;
  if (vm.count("help") || !vm.count("target")) {
    return print_usage(
        vm, opts,
        "\nA recipe generates from its run's latest checkpoint; a folder is a Hugging Face "
        "model (config.json + model.safetensors [+ tokenizer.json]); a .gguf file is a "
        "llama.cpp / ollama model (its tokenizer and chat template from its metadata).\n");
  }
  // Checked before the model loads (Session::generate checks them too).
  const char* bad = sampling_problem(vm["tokens"].as<int64_t>(), vm["top-k"].as<int64_t>(),
                                     vm["temperature"].as<double>(), vm["top-p"].as<double>());
  if (bad) {
    std::cerr << "tightfit generate: --" << bad << "\n";
    return kUsage;
  }
  set_log_level("warn");
  try {
    auto session = load_target(vm);
    const bool greedy = vm.count("greedy") > 0;
    const ChatPrompter chat(*session);
    // `rendered`: the prompt is a chat template's text, which writes its own
    // special tokens; plain text gets the tokenizer's, as tokenizer(text).
    auto answer = [&](const Prompt& p) {
      SamplingOptions o;
      o.n_tokens = vm["tokens"].as<int64_t>();
      o.top_k = greedy ? 1 : vm["top-k"].as<int64_t>();
      o.temperature = greedy ? 0.0 : vm["temperature"].as<double>();
      o.top_p = vm["top-p"].as<double>();
      o.seed = vm["seed"].as<uint64_t>();
      o.use_cache = !vm.count("no-cache");
      o.stop_ids = p.stop_ids;
      o.add_special_tokens = !p.rendered;
      return session->generate(p.text, o);
    };
    if (vm.count("chat")) {
      std::cout << answer({chat.render_user(vm["chat"].as<std::string>()),
                           vm["chat"].as<std::string>(), chat.eos_ids(), true})
                << "\n";
    } else if (vm.count("prompts")) {
      for (const Prompt& p : chat.prompts_in(vm["prompts"].as<std::string>()))
        std::cout << "### " << p.text << "\n" << answer(p) << "\n\n";
    } else {
      const std::string prompt = vm["prompt"].as<std::string>();
      std::cout << prompt << answer({prompt, prompt, {}, false}) << "\n";
    }
    return kOk;
  } catch (const std::exception& e) {
    return report(e);
  }
}

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
  } catch (const std::exception& e) {
    return report(e);
  }
}

}  // namespace tightfit::host
