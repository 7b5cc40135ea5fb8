#include "recipe_paths.hpp"

namespace tightfit {
namespace fs = std::filesystem;

fs::path resolve_recipe_path(const std::string& spec, const std::string& recipe_dir) {
  const fs::path p = spec;
  std::error_code ec;
  if (spec.empty() || p.is_absolute() || recipe_dir.empty() || fs::exists(p, ec)) return p;
  const fs::path beside = fs::path(recipe_dir) / p;
  return fs::exists(beside, ec) ? beside : p;
}

bool recipe_path_exists(const std::string& spec, const std::string& recipe_dir) {
  std::error_code ec;
  return !spec.empty() && fs::exists(resolve_recipe_path(spec, recipe_dir), ec);
}

}  // namespace tightfit
