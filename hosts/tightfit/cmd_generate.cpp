// `tightfit generate`: load a trained model — a recipe's latest checkpoint, a
// Hugging Face model folder or a GGUF file — and sample text from it.
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
#include "trained_model.hpp"

namespace tightfit::host {
namespace po = boost::program_options;

int generate_command(const std::vector<std::string>& args) {
  po::options_description opts("tightfit generate RECIPE.toml|MODEL_FOLDER|MODEL.gguf [options]");
  opts.add_options()("help,h", "show this help")(
      "prompt,p", po::value<std::string>()->default_value("\n", "'\\n'"),
      "text to continue (a newline: a sample from nothing)")(
      "tokens,n", po::value<int64_t>()->default_value(200), "tokens to generate")(
      "temperature,t", po::value<double>()->default_value(0.8, "0.8"),
      "sampling temperature; 0 = greedy")("top-k", po::value<int64_t>()->default_value(40),
                                          "sample among the k likeliest; 1 = greedy, 0 = all")(
      "top-p", po::value<double>()->default_value(1.0, "1.0"),
      "nucleus: the smallest set with this much mass")(
      "min-p", po::value<double>()->default_value(0.0, "0"),
      "drop tokens below this share of the likeliest's probability; 0 = off")(
      "repetition-penalty", po::value<double>()->default_value(1.0, "1.0"),
      "divide the logits of tokens already in the prompt or output by this (multiply where "
      "negative), as transformers; 1 = off")("greedy", "always the likeliest token")(
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
  const bool greedy = vm.count("greedy") > 0;
  SamplingOptions sampling;
  sampling.n_tokens = vm["tokens"].as<int64_t>();
  sampling.top_k = greedy ? 1 : vm["top-k"].as<int64_t>();
  sampling.temperature = greedy ? 0.0 : vm["temperature"].as<double>();
  sampling.top_p = vm["top-p"].as<double>();
  sampling.min_p = vm["min-p"].as<double>();
  sampling.repetition_penalty = vm["repetition-penalty"].as<double>();
  sampling.seed = vm["seed"].as<uint64_t>();
  sampling.use_cache = !vm.count("no-cache");
  // Checked before the model loads (Session::generate checks them too).
  if (const char* bad = sampling_problem(sampling)) {
    std::cerr << "tightfit generate: --" << bad << "\n";
    return kUsage;
  }
  set_log_level("warn");
  try {
    auto session = load_target(vm);
    const ChatPrompter chat(*session);
    // `rendered`: the prompt is a chat template's text, which writes its own
    // special tokens; plain text gets the tokenizer's, as tokenizer(text).
    auto answer = [&](const Prompt& p) {
      SamplingOptions o = sampling;
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
  } catch (...) {
    return report_current_error();
  }
}

}  // namespace tightfit::host
