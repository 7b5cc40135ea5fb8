// Recipes: TOML files parsed with TOML++, validated table by table against the
// keys the kernel and each plugin declare, with --set overrides.
#pragma once

#include <toml++/toml.h>

#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "key_search.hpp"
#include "recipe_error.hpp"
#include "tightfit/plugin_api.h"

namespace tightfit {

// One declared key (the kernel's own tables use the same form as plugins).
struct KeySpec {
  std::string name;
  tf_value_type type = TF_VALUE_STRING;
  std::optional<std::string> default_value;  // TOML literal; nullopt = required
  std::string doc;
  double min_value = 1, max_value = 0;  // range when min <= max
  std::string choices;                  // "a|b|c"
  std::optional<KeySearch> search;      // what `tightfit fit` tries for it
};

std::vector<KeySpec> key_specs_from_abi(const tf_config_key* keys, uint32_t n);
const char* value_type_name(tf_value_type t);

// A validated table: typed access with defaults applied.
class ConfigTable {
 public:
  ConfigTable() = default;
  // `base_dir`: the recipe's folder, where relative TF_VALUE_PATH values are also looked for.
  ConfigTable(const toml::table* table, std::vector<KeySpec> keys, std::string where,
              std::string base_dir = {});

  bool has(const std::string& key) const;  // set explicitly in the recipe
  bool get_bool(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_double(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  int64_t get_size(const std::string& key) const;  // SIZE keys: bytes
  std::vector<std::string> get_string_list(const std::string& key) const;
  std::vector<int64_t> get_int_list(const std::string& key) const;
  const std::vector<KeySpec>& keys() const { return keys_; }
  const std::string& where() const { return where_; }
  // A PATH key read as `path` from now on (a GGUF file named as a model's
  // config reads as the folder converted from it).
  void substitute_path(const std::string& key, std::string path);

 private:
  const KeySpec& spec(const std::string& key) const;
  toml::node_view<const toml::node> node(const std::string& key) const;
  const toml::table* table_ = nullptr;
  std::vector<KeySpec> keys_;
  std::string where_, base_dir_;
  std::vector<toml::table> defaults_;               // parsed default literals, one per key
  std::map<std::string, std::string> substituted_;  // PATH key -> path read in its place
};

class Recipe {
 public:
  // Parses a file; throws RecipeError with file:line:column on syntax errors.
  static Recipe load(const std::string& path);
  static Recipe parse(const std::string& text, const std::string& source_name);

  // Applies "a.b=v" (v a TOML literal, else a string). Array tables are
  // addressed by index or by their plugin name: strategy.0.every, strategy.checkpoint.every.
  void apply_override(const std::string& assignment);
  // Appends a [[strategy]] table with plugin = `plugin` (`tightfit run
  // --add-strategy`); its keys can then be --set by the plugin's name.
  void add_strategy(const std::string& plugin);
  // ... with `keys` (a table without `plugin`) as its recipe keys.
  void add_strategy(const std::string& plugin, const toml::table& keys);
  // The first [[strategy]] table of `plugin`, or nullptr.
  const toml::table* strategy_table(const std::string& plugin) const;
  // Drops the [[strategy]] tables whose plugin is one of `plugins` (`fit`
  // replaces the strategies it searches over).
  void remove_strategies(const std::vector<std::string>& plugins);
  // The recipe as TOML text (comments are not kept).
  std::string to_toml() const;

  const std::string& source() const { return source_; }
  const toml::table& root() const { return *root_; }

  // The table at `name` (e.g. "model"), or nullptr.
  const toml::table* table(const std::string& name) const;
  // The [[strategy]] tables in order.
  std::vector<const toml::table*> array_tables(const std::string& name) const;

  // Validates `t` against `keys` (plus `extra_allowed` keys such as "plugin").
  // Throws RecipeError naming file:line:column and listing the valid keys.
  ConfigTable validate(const toml::table* t, const std::string& where,
                       const std::vector<KeySpec>& keys,
                       const std::vector<std::string>& extra_allowed = {}) const;

  // Checks that every top-level key is one of `allowed`.
  void check_top_level(const std::vector<std::string>& allowed) const;

  // "file:line:col" of a node, or "--set a.b" for overridden values.
  std::string where(const toml::node& n) const;

  // Reads a required string key such as [model].plugin.
  std::string required_string(const toml::table* t, const std::string& table_name,
                              const std::string& key) const;

 private:
  // Shared between copies so that source positions survive (toml++ drops them
  // when a table is copied); apply_override copies first when shared.
  std::shared_ptr<toml::table> root_ = std::make_shared<toml::table>();
  std::string source_;
};

}  // namespace tightfit
