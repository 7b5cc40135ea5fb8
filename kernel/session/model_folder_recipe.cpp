#include "model_folder_recipe.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "json_input.hpp"
#include "recipe_error.hpp"

namespace tightfit {
namespace fs = std::filesystem;

Recipe recipe_for_model_folder(const fs::path& folder, const std::string& weights,
                               const std::string& device) {
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
  toml::table run{{"name", "generate"}, {"sample_tokens", 0}};
  if (!device.empty()) run.insert("device", device);
  toml::table doc{{"run", run},
                  {"model", model},
                  {"data", toml::table{{"seq_len", std::min<int64_t>(positions, 1024)}}}};
  std::ostringstream text;
  text << doc;
  return Recipe::parse(text.str(), f + "/config.json");
}

}  // namespace tightfit
