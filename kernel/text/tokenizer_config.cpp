#include "tokenizer_config.hpp"

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <tuple>

#include "file_util.hpp"
#include "json_input.hpp"
#include "model_families.hpp"

namespace tightfit {
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

constexpr size_t kMaxConfigBytes = size_t{64} << 20;
// Real configs list a few hundred added tokens; Qwen's list ~300.
constexpr size_t kMaxAddedTokens = size_t{1} << 20;

std::optional<bool> flag(const ojson& j, const char* key, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_boolean())
    throw std::invalid_argument(src + ": \"" + key + "\" must be true or false");
  return j[key].get<bool>();
}

// A token written as "..." or {"content": "...", "lstrip": ..., ...}.
AddedTokenSpec token_spec(const ojson& v, const std::string& what, const std::string& src) {
  AddedTokenSpec t;
  if (v.is_string()) {
    t.content = v.get<std::string>();
    return t;
  }
  if (!v.is_object() || !v.contains("content") || !v["content"].is_string())
    throw std::invalid_argument(src + ": " + what + " must be a string or {\"content\": ...}");
  t.content = v["content"].get<std::string>();
  auto opt = [&](const char* key, bool& out) {
    if (const auto b = flag(v, key, src)) out = *b;
  };
  opt("special", t.special);
  t.normalized = !t.special;  // AddedToken's default
  opt("normalized", t.normalized);
  opt("lstrip", t.lstrip);
  opt("rstrip", t.rstrip);
  opt("single_word", t.single_word);
  return t;
}

std::string token_text(const ojson& j, const char* key, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return {};
  return token_spec(j[key], std::string("\"") + key + "\"", src).content;
}

// AutoTokenizer's class for a config.json model_type (util/model_families.hpp,
// as transformers' TOKENIZER_MAPPING_NAMES has it).
const char* class_for_model_type(const std::string& type) {
  const ModelFamily* f = family_of_model_type(type);
  return f != nullptr && f->tokenizer_class != nullptr ? f->tokenizer_class : "";
}

// The special tokens a class's __init__ defaults to (used when the config
// leaves the key out; an explicit null stays null): unk, bos, eos, pad.
struct ClassDefaults {
  const char* name;
  const char *unk, *bos, *eos, *pad;
};
constexpr ClassDefaults kClassDefaults[] = {
    {"LlamaTokenizer", "<unk>", "<s>", "</s>", nullptr},
    {"GemmaTokenizer", "<unk>", "<bos>", "<eos>", "<pad>"},
    {"GPTNeoXTokenizer", "<|endoftext|>", "<|endoftext|>", "<|endoftext|>", nullptr},
    {"CohereTokenizer", "<UNK>", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", nullptr},
    {"GPT2Tokenizer", "<|endoftext|>", "<|endoftext|>", "<|endoftext|>", nullptr},
    {"Qwen2Tokenizer", "<|endoftext|>", nullptr, "<|endoftext|>", "<|endoftext|>"},
};

void resolve_class(TokenizerConfig& c, const ojson& j, const fs::path& folder) {
  if (!c.tokenizer_class.empty()) {
    c.class_source = c.source;
  } else {
    std::error_code ec;
    const fs::path config = folder / "config.json";
    if (!fs::exists(config, ec)) return;
    const nlohmann::json cfg = read_json_file(config.string(), size_t{16} << 20);
    if (!cfg.is_object() || !cfg.contains("model_type") || !cfg["model_type"].is_string()) return;
    c.tokenizer_class = class_for_model_type(cfg["model_type"].get<std::string>());
    c.class_source =
        config.string() + " (model_type \"" + cfg["model_type"].get<std::string>() + "\")";
  }
  const std::string fast = "Fast";
  if (c.tokenizer_class.size() > fast.size() &&
      c.tokenizer_class.compare(c.tokenizer_class.size() - fast.size(), fast.size(), fast) == 0 &&
      c.tokenizer_class != "PreTrainedTokenizerFast")
    c.tokenizer_class.resize(c.tokenizer_class.size() - fast.size());
  for (const ClassDefaults& d : kClassDefaults) {
    if (c.tokenizer_class != d.name) continue;
    for (const auto& [key, value, field] :
         {std::tuple<const char*, const char*, std::string*>{"unk_token", d.unk, &c.unk_token},
          {"bos_token", d.bos, &c.bos_token},
          {"eos_token", d.eos, &c.eos_token},
          {"pad_token", d.pad, &c.pad_token}})
      if (!j.contains(key) && value) *field = value;
  }
}

// The special tokens in transformers' order (bos, eos, unk, pad, then the
// additional ones), each as the config wrote it or as a plain special token.
void collect_special_tokens(TokenizerConfig& c, const ojson& j) {
  for (const auto& [key, text] :
       {std::pair<const char*, const std::string*>{"bos_token", &c.bos_token},
        {"eos_token", &c.eos_token},
        {"unk_token", &c.unk_token},
        {"pad_token", &c.pad_token}}) {
    if (text->empty()) continue;
    AddedTokenSpec t;
    if (j.contains(key) && j[key].is_object()) t = token_spec(j[key], key, c.source);
    t.content = *text;
    t.special = true;
    if (!(j.contains(key) && j[key].is_object())) t.normalized = false;
    c.special_tokens.push_back(std::move(t));
  }
  if (j.contains("additional_special_tokens") && !j["additional_special_tokens"].is_null()) {
    const ojson& list = j["additional_special_tokens"];
    if (!list.is_array() || list.size() > kMaxAddedTokens)
      throw std::invalid_argument(c.source + ": \"additional_special_tokens\" must be a list");
    for (const auto& v : list) {
      AddedTokenSpec t = token_spec(v, "an additional special token", c.source);
      t.special = true;
      if (v.is_string()) t.normalized = false;
      c.special_tokens.push_back(std::move(t));
    }
  }
}

void read_config(TokenizerConfig& c, const ojson& j) {
  const std::string& src = c.source;
  c.bos_token = token_text(j, "bos_token", src);
  c.eos_token = token_text(j, "eos_token", src);
  c.pad_token = token_text(j, "pad_token", src);
  c.unk_token = token_text(j, "unk_token", src);
  if (j.contains("tokenizer_class") && !j["tokenizer_class"].is_null()) {
    if (!j["tokenizer_class"].is_string())
      throw std::invalid_argument(src + ": \"tokenizer_class\" must be a string");
    c.tokenizer_class = j["tokenizer_class"].get<std::string>();
  }
  c.add_bos_token = flag(j, "add_bos_token", src);
  c.add_eos_token = flag(j, "add_eos_token", src);
  c.legacy = flag(j, "legacy", src);
  c.add_prefix_space = flag(j, "add_prefix_space", src);
  if (j.contains("truncation_side") && !j["truncation_side"].is_null()) {
    const ojson& side = j["truncation_side"];
    if (!side.is_string() || (side != "left" && side != "right"))
      throw std::invalid_argument(src + ": \"truncation_side\" must be \"left\" or \"right\"");
    c.truncate_left = side == "left";
  }
  if (j.contains("added_tokens_decoder") && !j["added_tokens_decoder"].is_null()) {
    const ojson& d = j["added_tokens_decoder"];
    if (!d.is_object() || d.size() > kMaxAddedTokens)
      throw std::invalid_argument(src + ": \"added_tokens_decoder\" must be an object of ids");
    for (auto it = d.begin(); it != d.end(); ++it) {
      const std::string& key = it.key();
      int64_t id = -1;
      if (!key.empty() && key.size() <= 9 &&
          std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
        id = std::stoll(key);
      if (id < 0)
        throw std::invalid_argument(src + ": added_tokens_decoder key \"" + key.substr(0, 40) +
                                    "\" is not a token id");
      AddedTokenSpec t = token_spec(it.value(), "added_tokens_decoder[" + key + "]", src);
      t.id = id;
      c.added_tokens_decoder.push_back(std::move(t));
    }
    std::stable_sort(c.added_tokens_decoder.begin(), c.added_tokens_decoder.end(),
                     [](const AddedTokenSpec& a, const AddedTokenSpec& b) { return a.id < b.id; });
  }
  if (j.contains("chat_template") && !j["chat_template"].is_null()) {
    const ojson& t = j["chat_template"];
    if (t.is_string()) {
      c.chat_template = t.get<std::string>();
    } else if (t.is_array()) {  // [{"name": "default", "template": ...}, ...]
      for (const auto& e : t)
        if (e.is_object() && e.value("name", std::string()) == "default" &&
            e.contains("template") && e["template"].is_string())
          c.chat_template = e["template"].get<std::string>();
      if (c.chat_template.empty())
        throw std::invalid_argument(src + ": \"chat_template\" lists no \"default\" template");
    } else {
      throw std::invalid_argument(src + ": \"chat_template\" must be a string or a list");
    }
  }
}

}  // namespace

TokenizerConfig TokenizerConfig::load(const std::string& path) {
  TokenizerConfig c;
  fs::path file = path, folder = fs::path(path).parent_path();
  if (fs::is_directory(path)) folder = path, file = fs::path(path) / "tokenizer_config.json";
  c.source = file.string();
  ojson j = ojson::object();
  if (fs::exists(file)) {
    std::string text;
    try {
      text = read_regular_file(file.string(), kMaxConfigBytes);
    } catch (const std::exception& e) {
      throw std::invalid_argument(e.what());
    }
    j = parse_ordered_json(text, c.source);
    if (!j.is_object()) throw std::invalid_argument(c.source + " is not a JSON object");
    read_config(c, j);
  }
  resolve_class(c, j, folder);
  collect_special_tokens(c, j);
  const fs::path jinja = folder / "chat_template.jinja";
  if (fs::exists(jinja)) {
    try {
      c.chat_template = read_regular_file(jinja.string(), kMaxConfigBytes);
    } catch (const std::exception& e) {
      throw std::invalid_argument(e.what());
    }
    c.source = jinja.string();
  }
  return c;
}

ojson TokenizerConfig::template_variables() const {
  ojson v = ojson::object();
  for (const auto& [key, value] :
       {std::pair<const char*, const std::string*>{"bos_token", &bos_token},
        {"eos_token", &eos_token},
        {"pad_token", &pad_token},
        {"unk_token", &unk_token}})
    if (!value->empty()) v[key] = *value;
  return v;
}

}  // namespace tightfit
