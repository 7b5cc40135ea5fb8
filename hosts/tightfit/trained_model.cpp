#include "trained_model.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "gguf_folder.hpp"
#include "gguf_model.hpp"
#include "json_input.hpp"
#include "plugin_loader.hpp"

namespace tightfit::host {
namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

// A recipe that builds the model a Hugging Face folder describes, with the
// model plugin that declares its model_type (plugin = "auto"); its weights
// from `weights` (the folder itself, or the GGUF file the folder was
// converted from).
Recipe recipe_for_model_folder(const fs::path& folder, const std::string& weights) {
  nlohmann::json cfg;
  try {
    cfg = read_json_file((folder / "config.json").string(), size_t{16} << 20);
  } catch (const std::invalid_argument& e) {
    throw RecipeError(std::string(e.what()) + ": not a Hugging Face config.json");
  }
  if (!cfg.is_object())
    throw RecipeError((folder / "config.json").string() + ": not a Hugging Face config.json");
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
  toml::table model{{"plugin", "auto"}, {"config", f}, {"weights", weights}};
  toml::table doc{{"run", toml::table{{"name", "generate"}, {"sample_tokens", 0}}},
                  {"model", model},
                  {"data", toml::table{{"seq_len", std::min<int64_t>(positions, 1024)}}}};
  std::ostringstream text;
  text << doc;
  return Recipe::parse(text.str(), f + "/config.json");
}

}  // namespace

// A session over TARGET (a recipe: its latest checkpoint; or a model folder).
std::unique_ptr<Session> load_target(const std::string& target,
                                     const std::vector<std::string>& sets) {
  const bool gguf_file = !fs::is_directory(target) && gguf::looks_like_gguf(target);
  const bool folder = fs::is_directory(target) || gguf_file;
  PluginRegistry plugins = PluginRegistry::discover();
  // A GGUF file reads as the Hugging Face folder converted from its metadata.
  const std::string weights = gguf_file ? fs::absolute(target).string() : "";
  Recipe recipe = !folder     ? Recipe::load(target)
                  : gguf_file ? recipe_for_model_folder(gguf::model_folder(target).path, weights)
                              : recipe_for_model_folder(target, fs::absolute(target).string());
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

std::unique_ptr<Session> load_target(const po::variables_map& vm) {
  return load_target(vm["target"].as<std::string>(), vm.count("set")
                                                         ? vm["set"].as<std::vector<std::string>>()
                                                         : std::vector<std::string>{});
}

}  // namespace tightfit::host
