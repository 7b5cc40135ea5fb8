#include "recipe.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "file_util.hpp"
#include "memory_accounting.hpp"
#include "recipe_paths.hpp"
#include "toml_nesting.hpp"

namespace tightfit {
namespace {

// Digits 0-9 only: std::isdigit on a char of a UTF-8 byte (negative) is undefined.
bool all_ascii_digits(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string join_keys(const std::vector<KeySpec>& keys, const std::vector<std::string>& extra) {
  std::vector<std::string> names(extra);
  for (const auto& k : keys) names.push_back(k.name);
  std::ostringstream os;
  for (size_t i = 0; i < names.size(); ++i) os << (i ? ", " : "") << names[i];
  return names.empty() ? std::string("(none)") : os.str();
}

std::string position(const std::string& file, const toml::source_region& r) {
  if (r.begin.line == 0) return "--set";
  std::ostringstream os;
  os << file << ":" << r.begin.line << ":" << r.begin.column;
  return os.str();
}

bool type_matches(const toml::node& n, tf_value_type t) {
  switch (t) {
    case TF_VALUE_BOOL:
      return n.is_boolean();
    case TF_VALUE_INT:
      return n.is_integer();
    case TF_VALUE_FLOAT:
      return n.is_floating_point() || n.is_integer();
    case TF_VALUE_STRING:
    case TF_VALUE_PATH:
      return n.is_string();
    case TF_VALUE_SIZE:
      return n.is_string() || n.is_integer();
    case TF_VALUE_STRING_LIST: {
      auto* a = n.as_array();
      return a &&
             std::all_of(a->begin(), a->end(), [](const toml::node& e) { return e.is_string(); });
    }
    case TF_VALUE_INT_LIST: {
      auto* a = n.as_array();
      return a &&
             std::all_of(a->begin(), a->end(), [](const toml::node& e) { return e.is_integer(); });
    }
    case TF_VALUE_TYPE_MAX_ENUM:
      break;
  }
  return false;
}

toml::table parse_literal(const std::string& literal) {
  check_toml_nesting("v = " + literal, "a key's default value");
  return toml::parse("v = " + literal);
}

}  // namespace

const char* value_type_name(tf_value_type t) {
  switch (t) {
    case TF_VALUE_BOOL:
      return "bool";
    case TF_VALUE_INT:
      return "integer";
    case TF_VALUE_FLOAT:
      return "float";
    case TF_VALUE_STRING:
      return "string";
    case TF_VALUE_STRING_LIST:
      return "list of strings";
    case TF_VALUE_INT_LIST:
      return "list of integers";
    case TF_VALUE_SIZE:
      return "byte size";
    case TF_VALUE_PATH:
      return "path";
    case TF_VALUE_TYPE_MAX_ENUM:
      break;
  }
  return "?";
}

std::vector<KeySpec> key_specs_from_abi(const tf_config_key* keys, uint32_t n) {
  std::vector<KeySpec> out;
  const char* p = reinterpret_cast<const char*>(keys);
  for (uint32_t i = 0; i < n && keys; ++i) {
    const auto* k = reinterpret_cast<const tf_config_key*>(p);
    // Fields past the plugin's struct_size are absent.
    tf_config_key copy{};
    std::memcpy(&copy, k, std::min<size_t>(k->struct_size, sizeof copy));
    if (k->struct_size < offsetof(tf_config_key, doc) || copy.name == nullptr)
      throw std::runtime_error("config key table entry " + std::to_string(i) + " is malformed");
    KeySpec s;
    s.name = copy.name;
    s.type = copy.type;
    if (copy.default_value) s.default_value = copy.default_value;
    if (copy.doc) s.doc = copy.doc;
    s.min_value = copy.min_value;
    s.max_value = copy.max_value;
    if (k->struct_size < offsetof(tf_config_key, max_value) + sizeof(double)) {
      s.min_value = 1;
      s.max_value = 0;
    }
    if (copy.choices) s.choices = copy.choices;
    try {
      s.search = key_search_from_abi(copy.search);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error("config key \"" + s.name + "\": " + e.what());
    }
    out.push_back(std::move(s));
    p += k->struct_size;
  }
  return out;
}

// ---------------------------------------------------------------- ConfigTable

ConfigTable::ConfigTable(const toml::table* table, std::vector<KeySpec> keys, std::string where,
                         std::string base_dir)
    : table_(table),
      keys_(std::move(keys)),
      where_(std::move(where)),
      base_dir_(std::move(base_dir)) {
  for (const auto& k : keys_)
    defaults_.push_back(k.default_value ? parse_literal(*k.default_value) : toml::table{});
}

const KeySpec& ConfigTable::spec(const std::string& key) const {
  for (const auto& k : keys_)
    if (k.name == key) return k;
  throw std::out_of_range("no key \"" + key + "\" declared for " + where_);
}

bool ConfigTable::has(const std::string& key) const {
  return table_ && table_->contains(key);
}

toml::node_view<const toml::node> ConfigTable::node(const std::string& key) const {
  if (table_ && table_->contains(key)) return toml::node_view<const toml::node>((*table_)[key]);
  const auto& s = spec(key);
  const size_t i = static_cast<size_t>(&s - keys_.data());
  if (!s.default_value)
    throw std::out_of_range("required key \"" + key + "\" missing in " + where_);
  return toml::node_view<const toml::node>(defaults_[i]["v"]);
}

bool ConfigTable::get_bool(const std::string& key) const {
  return node(key).value_or(false);
}
int64_t ConfigTable::get_int(const std::string& key) const {
  return node(key).value_or<int64_t>(0);
}
double ConfigTable::get_double(const std::string& key) const {
  auto n = node(key);
  if (n.is_integer()) return static_cast<double>(n.value_or<int64_t>(0));
  return n.value_or(0.0);
}
void ConfigTable::substitute_path(const std::string& key, std::string path) {
  substituted_[key] = std::move(path);
}
std::string ConfigTable::get_string(const std::string& key) const {
  if (const auto it = substituted_.find(key); it != substituted_.end()) return it->second;
  std::string v = node(key).value_or(std::string{});
  if (spec(key).type == TF_VALUE_PATH) return resolve_recipe_path(v, base_dir_).string();
  return v;
}
int64_t ConfigTable::get_size(const std::string& key) const {
  auto n = node(key);
  if (n.is_integer()) return n.value_or<int64_t>(0);
  return parse_byte_size(n.value_or(std::string{"0"}));
}
std::vector<std::string> ConfigTable::get_string_list(const std::string& key) const {
  std::vector<std::string> out;
  if (auto* a = node(key).as_array())
    for (const auto& e : *a) out.push_back(e.value_or(std::string{}));
  return out;
}
std::vector<int64_t> ConfigTable::get_int_list(const std::string& key) const {
  std::vector<int64_t> out;
  if (auto* a = node(key).as_array())
    for (const auto& e : *a) out.push_back(e.value_or<int64_t>(0));
  return out;
}

// --------------------------------------------------------------------- Recipe

Recipe Recipe::load(const std::string& path) {
  std::string text;
  try {
    text = read_file_text(path);
  } catch (const std::runtime_error&) {
    throw RecipeError(path +
                      ": cannot open recipe (check the path; `tightfit run` with no "
                      "argument uses configs/default.toml)");
  }
  return parse(text, path);
}

Recipe Recipe::parse(const std::string& text, const std::string& source_name) {
  Recipe r;
  r.source_ = source_name;
  check_toml_nesting(text, source_name);
  try {
    r.root_ = std::make_shared<toml::table>(toml::parse(text, source_name));
  } catch (const toml::parse_error& e) {
    throw RecipeError(position(source_name, e.source()) +
                      ": TOML syntax error: " + std::string(e.description()));
  }
  return r;
}

std::string Recipe::where(const toml::node& n) const {
  return position(source_, n.source());
}

const toml::table* Recipe::table(const std::string& name) const {
  return (*root_)[name].as_table();
}

std::vector<const toml::table*> Recipe::array_tables(const std::string& name) const {
  std::vector<const toml::table*> out;
  if (const auto* a = (*root_)[name].as_array()) {
    for (const auto& e : *a) {
      if (!e.is_table()) throw RecipeError(where(e) + ": [[" + name + "]] entries must be tables");
      out.push_back(e.as_table());
    }
  } else if (root_->contains(name)) {
    throw RecipeError(where(*root_->get(name)) + ": \"" + name +
                      "\" must be an array of tables; write [[" + name + "]]");
  }
  return out;
}

void Recipe::check_top_level(const std::vector<std::string>& allowed) const {
  for (const auto& [k, v] : *root_) {
    if (std::find(allowed.begin(), allowed.end(), std::string(k.str())) == allowed.end()) {
      std::ostringstream os;
      for (size_t i = 0; i < allowed.size(); ++i) os << (i ? ", " : "") << allowed[i];
      throw RecipeError(position(source_, k.source()) + ": unknown table \"" +
                        std::string(k.str()) + "\". Valid tables: " + os.str());
    }
  }
}

std::string Recipe::required_string(const toml::table* t, const std::string& table_name,
                                    const std::string& key) const {
  if (!t) throw RecipeError(source_ + ": missing table [" + table_name + "]");
  const toml::node* n = t->get(key);
  if (!n)
    throw RecipeError(position(source_, t->source()) + ": [" + table_name + "] needs the key \"" +
                      key + "\"");
  if (!n->is_string())
    throw RecipeError(where(*n) + ": [" + table_name + "]." + key + " must be a string");
  return n->value_or(std::string{});
}

ConfigTable Recipe::validate(const toml::table* t, const std::string& where_name,
                             const std::vector<KeySpec>& keys,
                             const std::vector<std::string>& extra_allowed) const {
  if (t) {
    for (const auto& [k, v] : *t) {
      const std::string key(k.str());
      if (std::find(extra_allowed.begin(), extra_allowed.end(), key) != extra_allowed.end())
        continue;
      auto it =
          std::find_if(keys.begin(), keys.end(), [&](const KeySpec& s) { return s.name == key; });
      if (it == keys.end())
        throw RecipeError(position(source_, k.source()) + ": unknown key \"" + key + "\" in " +
                          where_name + ". Valid keys: " + join_keys(keys, extra_allowed));
      if (!type_matches(v, it->type))
        throw RecipeError(where(v) + ": " + where_name + "." + key + " must be of type " +
                          value_type_name(it->type) + " (" + it->doc + ")");
      // NaN compares false with every bound, and no key means infinity.
      if (v.is_floating_point() && !std::isfinite(v.value_or(0.0)))
        throw RecipeError(where(v) + ": " + where_name + "." + key + " = " +
                          std::to_string(v.value_or(0.0)) + " is not a finite number");
      if (it->type == TF_VALUE_SIZE && v.is_integer() && v.value_or<int64_t>(0) < 0)
        throw RecipeError(where(v) + ": " + where_name + "." + key +
                          " is a negative byte size; 0 means none");
      if (it->min_value <= it->max_value && (v.is_integer() || v.is_floating_point())) {
        const double x =
            v.is_integer() ? static_cast<double>(v.value_or<int64_t>(0)) : v.value_or(0.0);
        if (x < it->min_value || x > it->max_value) {
          std::ostringstream os;
          os << where(v) << ": " << where_name << "." << key << " = " << x << " is out of range ["
             << it->min_value << ", " << it->max_value << "]";
          throw RecipeError(os.str());
        }
      }
      if (!it->choices.empty() && v.is_string()) {
        const std::string s = v.value_or(std::string{});
        std::string bar = "|" + it->choices + "|";
        if (bar.find("|" + s + "|") == std::string::npos)
          throw RecipeError(where(v) + ": " + where_name + "." + key + " = \"" + s +
                            "\" is not one of: " + it->choices);
      }
      if (it->type == TF_VALUE_SIZE && v.is_string()) {
        try {
          parse_byte_size(v.value_or(std::string{}));
        } catch (const std::invalid_argument& e) {
          throw RecipeError(where(v) + ": " + where_name + "." + key + ": " + e.what());
        }
      }
    }
  }
  for (const auto& k : keys) {
    if (!k.default_value && !(t && t->contains(k.name))) {
      const std::string at = t ? position(source_, t->source()) : source_;
      throw RecipeError(at + ": " + where_name + " needs the key \"" + k.name + "\" (" +
                        value_type_name(k.type) + ": " + k.doc + ")");
    }
  }
  return ConfigTable(t, keys, where_name, std::filesystem::path(source_).parent_path().string());
}

void Recipe::add_strategy(const std::string& plugin) {
  if (plugin.empty()) throw RecipeError("--add-strategy needs a plugin name, e.g. checkpoint");
  if (root_.use_count() > 1) root_ = std::make_shared<toml::table>(*root_);
  toml::node* n = root_->get("strategy");
  if (n && !n->is_array())
    throw RecipeError(source_ + ": `strategy` is not an array of [[strategy]] tables");
  if (!n) n = root_->insert("strategy", toml::array{}).first->second.as_array();
  n->as_array()->push_back(toml::table{{"plugin", plugin}});
}

void Recipe::add_strategy(const std::string& plugin, const toml::table& keys) {
  add_strategy(plugin);
  toml::table* t = root_->get_as<toml::array>("strategy")->back().as_table();
  for (const auto& [k, v] : keys)
    if (k.str() != "plugin") t->insert_or_assign(k, v);
}

const toml::table* Recipe::strategy_table(const std::string& plugin) const {
  for (const toml::table* t : array_tables("strategy"))
    if ((*t)["plugin"].value_or(std::string()) == plugin) return t;
  return nullptr;
}

void Recipe::remove_strategies(const std::vector<std::string>& plugins) {
  if (root_.use_count() > 1) root_ = std::make_shared<toml::table>(*root_);
  toml::array* a = root_->get_as<toml::array>("strategy");
  if (!a) return;
  for (size_t i = a->size(); i-- > 0;) {
    const toml::table* t = (*a)[i].as_table();
    const std::string name = t ? (*t)["plugin"].value_or(std::string()) : std::string();
    if (std::find(plugins.begin(), plugins.end(), name) != plugins.end())
      a->erase(a->begin() + static_cast<std::ptrdiff_t>(i));
  }
  if (a->empty()) root_->erase("strategy");
}

std::string Recipe::to_toml() const {
  std::ostringstream os;
  os << *root_;
  return os.str();
}

void Recipe::apply_override(const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw RecipeError("--set " + assignment + ": expected KEY=VALUE, e.g. --set run.steps=100");
  const std::string path = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);

  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  if (parts.size() < 2)
    throw RecipeError("--set " + assignment +
                      ": KEY must name a table and a key, e.g. model.n_layer");
  if (parts.size() > 16)
    throw RecipeError("--set: KEY has " + std::to_string(parts.size()) +
                      " dotted parts; a recipe key has a few, e.g. strategy.0.every");

  if (root_.use_count() > 1) root_ = std::make_shared<toml::table>(*root_);
  toml::table* cur = root_.get();
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    toml::node* n = cur->get(parts[i]);
    if (n && n->is_array()) {
      // strategy.0.every or strategy.checkpoint.every
      auto* arr = n->as_array();
      if (i + 2 >= parts.size())
        throw RecipeError("--set " + assignment + ": name an entry of [[" + parts[i] + "]]");
      const std::string& sel = parts[++i];
      toml::table* found = nullptr;
      // (an entry's index has a few digits; a longer run of them names none)
      const bool numeric = !sel.empty() && sel.size() <= 9 && all_ascii_digits(sel);
      if (numeric) {
        const size_t idx = std::stoul(sel);
        if (idx < arr->size()) found = (*arr)[idx].as_table();
      } else {
        for (auto& e : *arr)
          if (auto* tt = e.as_table(); tt && (*tt)["plugin"].value_or(std::string{}) == sel)
            found = tt;
      }
      if (!found)
        throw RecipeError("--set " + assignment + ": no [[" + parts[i - 1] + "]] entry \"" + sel +
                          "\"");
      cur = found;
      continue;
    }
    if (!n && !parts[i + 1].empty() && i + 2 < parts.size() && all_ascii_digits(parts[i + 1]))
      throw RecipeError("--set " + assignment + ": the recipe has no [[" + parts[i] + "]] entries");
    if (!n) n = cur->insert_or_assign(parts[i], toml::table{}).first->second.as_table();
    if (!n->is_table())
      throw RecipeError("--set " + assignment + ": \"" + parts[i] + "\" is not a table");
    cur = n->as_table();
  }
  toml::table parsed;
  check_toml_nesting("v = " + text, "--set " + path);
  try {
    parsed = toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    parsed.insert_or_assign("v", text);  // a bare word is a string
  }
  // Copy value by value so the nodes carry no source position ("--set" in errors).
  auto fresh = [](const toml::node& n, auto&& self) -> toml::array {
    toml::array out;
    for (const auto& e : *n.as_array()) {
      if (e.is_array())
        out.push_back(self(e, self));
      else
        e.visit([&](const auto& x) {
          if constexpr (toml::is_value<decltype(x)>) out.push_back(x.get());
        });
    }
    return out;
  };
  const toml::node* v = parsed.get("v");
  if (v->is_array()) {
    cur->insert_or_assign(parts.back(), fresh(*v, fresh));
  } else if (v->is_table()) {
    throw RecipeError("--set " + assignment + ": set the keys of a table one by one");
  } else {
    v->visit([&](const auto& x) {
      if constexpr (toml::is_value<decltype(x)>) cur->insert_or_assign(parts.back(), x.get());
    });
  }
}

}  // namespace tightfit
