#include "trained_model.hpp"

#include <filesystem>

#include "gguf_folder.hpp"
#include "gguf_model.hpp"
#include "model_folder_recipe.hpp"
#include "plugin_loader.hpp"

namespace tightfit::host {
namespace po = boost::program_options;
namespace fs = std::filesystem;

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
