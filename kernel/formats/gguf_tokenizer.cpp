#include "gguf_tokenizer.hpp"

#include <algorithm>
#include <optional>
#include <vector>

#include "sentencepiece_convert.hpp"
#include "tokenizer_json_parts.hpp"
#include "utf8.hpp"

namespace tightfit::gguf {
namespace {
using nlohmann::json;
namespace tj = tokenizer_json;

// llama.cpp's pre-tokenizer names (llama-vocab.cpp) and the tokenizer.json
// pre-tokenizer of the Hugging Face tokenizers they were converted from.
enum class PreKind { kGpt2, kDigitsThenGpt2, kLlama3, kQwen2 };
struct PreTokenizer {
  const char* name;
  PreKind kind;
};
constexpr PreTokenizer kPreTokenizers[] = {
    {"gpt-2", PreKind::kGpt2},
    {"phi-2", PreKind::kGpt2},
    {"mpt", PreKind::kGpt2},
    {"olmo", PreKind::kGpt2},
    {"jais", PreKind::kGpt2},
    {"smollm", PreKind::kDigitsThenGpt2},
    {"starcoder", PreKind::kDigitsThenGpt2},
    {"refact", PreKind::kDigitsThenGpt2},
    {"codeshell", PreKind::kDigitsThenGpt2},
    {"llama3", PreKind::kLlama3},
    {"llama-v3", PreKind::kLlama3},
    {"llama-bpe", PreKind::kLlama3},
    {"falcon3", PreKind::kLlama3},
    {"qwen2", PreKind::kQwen2},
    {"deepseek-r1-qwen", PreKind::kQwen2},
    {"megrez", PreKind::kQwen2},
};

// The token types of tokenizer.ggml.token_type (llama.cpp's, which are
// SentencePiece's): 3 control (special), 4 user-defined (added, not special).
constexpr int32_t kControl = 3, kUserDefined = 4;

struct Vocabulary {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;  // kNormal (1) where the file has none
  std::vector<float> scores;   // 0 where the file has none
  std::optional<int64_t> bos, eos, unk, pad, eot;
  bool add_bos = false, add_eos = false;
};

std::string where(const GgufReader& f, const std::string& key) {
  return f.path() + ": " + key;
}

// Text that goes into tokenizer.json must be UTF-8 (JSON is): a token,
// merge or template that is not is refused by its place.
const std::string& utf8(const GgufReader& f, const std::string& key, const std::string& s,
                        size_t index = SIZE_MAX) {
  const size_t bad = first_invalid_utf8(s);
  if (bad < s.size())
    throw GgufError(where(f, key) + (index == SIZE_MAX ? "" : " entry " + std::to_string(index)) +
                    " is not UTF-8 (byte " + std::to_string(bad) + "): a damaged file");
  return s;
}

const std::vector<Value>& array_of(const GgufReader& f, const std::string& key, ValueType item) {
  const Value& v = f.get(key);
  const std::vector<Value>& items = v.as_array(key);
  if (v.item_type != item)
    throw GgufError(where(f, key) + " is an array of " + value_type_name(v.item_type) +
                    ", not of " + value_type_name(item));
  return items;
}

std::optional<int64_t> token_id(const GgufReader& f, const std::string& key, size_t n) {
  const Value* v = f.find(key);
  if (!v) return std::nullopt;
  const int64_t id = v->as_int(key);
  // A file may say "none" with -1 (llama.cpp's LLAMA_TOKEN_NULL).
  if (id == -1) return std::nullopt;
  if (id < 0 || static_cast<uint64_t>(id) >= n)
    throw GgufError(where(f, key) + " is " + std::to_string(id) + ", not a token id (the " +
                    "vocabulary has " + std::to_string(n) + " tokens)");
  return id;
}

Vocabulary read_vocabulary(const GgufReader& f) {
  Vocabulary v;
  const auto& tokens = array_of(f, "tokenizer.ggml.tokens", ValueType::STRING);
  if (tokens.empty()) throw GgufError(where(f, "tokenizer.ggml.tokens") + " is empty");
  const size_t n = tokens.size();
  v.tokens.reserve(n);
  for (size_t i = 0; i < n; ++i)
    v.tokens.push_back(utf8(f, "tokenizer.ggml.tokens", tokens[i].s, i));
  v.types.assign(n, 1);
  v.scores.assign(n, 0.0f);
  if (f.has("tokenizer.ggml.token_type")) {
    const auto& types = array_of(f, "tokenizer.ggml.token_type", ValueType::INT32);
    if (types.size() != n)
      throw GgufError(where(f, "tokenizer.ggml.token_type") + " has " +
                      std::to_string(types.size()) + " entries for " + std::to_string(n) +
                      " tokens");
    for (size_t i = 0; i < n; ++i) v.types[i] = static_cast<int32_t>(types[i].i);
  }
  if (f.has("tokenizer.ggml.scores")) {
    const auto& scores = array_of(f, "tokenizer.ggml.scores", ValueType::FLOAT32);
    if (scores.size() != n)
      throw GgufError(where(f, "tokenizer.ggml.scores") + " has " + std::to_string(scores.size()) +
                      " entries for " + std::to_string(n) + " tokens");
    for (size_t i = 0; i < n; ++i) v.scores[i] = static_cast<float>(scores[i].f);
  }
  v.bos = token_id(f, "tokenizer.ggml.bos_token_id", n);
  v.eos = token_id(f, "tokenizer.ggml.eos_token_id", n);
  v.unk = token_id(f, "tokenizer.ggml.unknown_token_id", n);
  v.pad = token_id(f, "tokenizer.ggml.padding_token_id", n);
  v.eot = token_id(f, "tokenizer.ggml.eot_token_id", n);
  return v;
}

// add_bos_token / add_eos_token: the file's flag, else llama.cpp's default.
void read_add_flags(const GgufReader& f, Vocabulary& v, bool bos_by_default) {
  const Value* bos = f.find("tokenizer.ggml.add_bos_token");
  const Value* eos = f.find("tokenizer.ggml.add_eos_token");
  v.add_bos = bos ? bos->as_bool("tokenizer.ggml.add_bos_token") : bos_by_default;
  v.add_eos = eos ? eos->as_bool("tokenizer.ggml.add_eos_token") : false;
  if (v.add_bos && !v.bos)
    throw GgufError(f.path() +
                    ": the tokenizer adds a BOS token, and tokenizer.ggml.bos_token_id "
                    "is missing");
  if (v.add_eos && !v.eos)
    throw GgufError(f.path() +
                    ": the tokenizer adds an EOS token, and tokenizer.ggml.eos_token_id "
                    "is missing");
}

json post_processor(const Vocabulary& v) {
  return tj::template_processing(v.add_bos ? &v.tokens[*v.bos] : nullptr, v.add_bos ? *v.bos : 0,
                                 v.add_eos ? &v.tokens[*v.eos] : nullptr, v.add_eos ? *v.eos : 0);
}

json added_tokens(const Vocabulary& v) {
  json added = json::array();
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (v.types[i] != kControl && v.types[i] != kUserDefined) continue;
    added.push_back({{"id", static_cast<int64_t>(i)},
                     {"content", v.tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", v.types[i] == kControl}});
  }
  return added;
}

const PreTokenizer& pre_tokenizer(const GgufReader& f) {
  const Value* pre = f.find("tokenizer.ggml.pre");
  if (!pre)
    throw GgufError(f.path() +
                    " names no pre-tokenizer (tokenizer.ggml.pre), so how it splits text before "
                    "BPE is unknown (llama.cpp falls back to a default and warns that quality "
                    "degrades): convert the model again with a current llama.cpp "
                    "convert_hf_to_gguf.py, or set [data] tokenizer = \"PATH\" to the model's "
                    "Hugging Face tokenizer folder");
  const std::string& name = pre->as_string("tokenizer.ggml.pre");
  for (const PreTokenizer& p : kPreTokenizers)
    if (name == p.name) return p;
  throw GgufError(
      f.path() + ": tokenizer.ggml.pre is \"" + name +
      "\", a pre-tokenizer tightfit does not reproduce (it reads " + known_pre_tokenizers() +
      "): set [data] tokenizer = \"PATH\" to the model's Hugging Face tokenizer folder");
}

json byte_level_bpe(const GgufReader& f, Vocabulary& v) {
  const PreTokenizer& pre = pre_tokenizer(f);
  const auto& merge_lines = array_of(f, "tokenizer.ggml.merges", ValueType::STRING);
  json vocab = json::object();
  for (size_t i = 0; i < v.tokens.size(); ++i) vocab[v.tokens[i]] = static_cast<int64_t>(i);
  json merges = json::array();
  for (size_t i = 0; i < merge_lines.size(); ++i) {
    // llama.cpp splits at the first space after the first byte.
    const std::string& m = utf8(f, "tokenizer.ggml.merges", merge_lines[i].s, i);
    const size_t space = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (space == std::string::npos)
      throw GgufError(where(f, "tokenizer.ggml.merges") + " entry " + std::to_string(i) +
                      " is not two tokens separated by a space");
    merges.push_back({m.substr(0, space), m.substr(space + 1)});
  }
  const bool llama3 = pre.kind == PreKind::kLlama3;
  read_add_flags(f, v, llama3);
  json t = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", added_tokens(v)},
            {"normalizer", nullptr},
            {"decoder", tj::byte_level(false)},
            {"model", tj::byte_level_bpe_model(std::move(vocab), std::move(merges), llama3)}};
  auto sequence = [](json steps) { return json{{"type", "Sequence"}, {"pretokenizers", steps}}; };
  switch (pre.kind) {
    case PreKind::kGpt2:
      t["pre_tokenizer"] = tj::byte_level(false);
      break;
    case PreKind::kDigitsThenGpt2:
      t["pre_tokenizer"] =
          sequence({{{"type", "Digits"}, {"individual_digits", true}}, tj::byte_level(false)});
      break;
    case PreKind::kLlama3:
      t["pre_tokenizer"] =
          sequence({tj::split_isolated(tj::kLlama3Pattern), tj::byte_level(false, false)});
      break;
    case PreKind::kQwen2:
      t["normalizer"] = {{"type", "NFC"}};
      t["pre_tokenizer"] =
          sequence({tj::split_isolated(tj::kQwen2Pattern), tj::byte_level(false, false)});
      break;
  }
  t["post_processor"] = (v.add_bos || v.add_eos) ? post_processor(v) : tj::byte_level(false);
  return t;
}

json sentencepiece(const GgufReader& f, Vocabulary& v) {
  SentencePieceModel m;
  m.algorithm = SentencePieceModel::Algorithm::kBpe;
  m.byte_fallback = true;
  m.pieces.resize(v.tokens.size());
  std::optional<int64_t> unk = v.unk;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    m.pieces[i].piece = v.tokens[i];
    m.pieces[i].score = v.scores[i];
    if (v.types[i] < 1 || v.types[i] > 6)
      throw GgufError(where(f, "tokenizer.ggml.token_type") + " of token " + std::to_string(i) +
                      " is " + std::to_string(v.types[i]) + ", not a type (1 to 6)");
    m.pieces[i].type = static_cast<SentencePieceModel::Type>(v.types[i]);
    if (!unk && v.types[i] == 2) unk = static_cast<int64_t>(i);
  }
  if (unk) m.unk_piece = v.tokens[*unk];
  const Value* prefix = f.find("tokenizer.ggml.add_space_prefix");
  read_add_flags(f, v, true);
  json t = sentencepiece_bpe_tokenizer(
      m, f.path(), /*legacy=*/true,
      prefix ? prefix->as_bool("tokenizer.ggml.add_space_prefix") : true);
  t["version"] = "1.0";
  t["truncation"] = nullptr;
  t["padding"] = nullptr;
  if (v.add_bos || v.add_eos) t["post_processor"] = post_processor(v);
  return t;
}

}  // namespace

std::string known_pre_tokenizers() {
  std::string names;
  for (const PreTokenizer& p : kPreTokenizers)
    names += std::string(names.empty() ? "" : ", ") + p.name;
  return names;
}

TokenizerFiles tokenizer_files(const GgufReader& f) {
  const Value* model = f.find("tokenizer.ggml.model");
  if (!model)
    throw GgufError(f.path() +
                    " holds no tokenizer (tokenizer.ggml.model): set [data] tokenizer = \"PATH\" "
                    "to the model's Hugging Face tokenizer folder");
  const std::string& kind = model->as_string("tokenizer.ggml.model");
  if (kind != "gpt2" && kind != "llama")
    throw GgufError(f.path() + ": tokenizer.ggml.model is \"" + kind +
                    "\"; tightfit reads the \"gpt2\" (byte-level BPE) and \"llama\" "
                    "(SentencePiece BPE) tokenizers of GGUF files: set [data] tokenizer = "
                    "\"PATH\" to the model's Hugging Face tokenizer folder");
  Vocabulary v = read_vocabulary(f);
  TokenizerFiles out;
  out.tokenizer = kind == "gpt2" ? byte_level_bpe(f, v) : sentencepiece(f, v);

  // tokenizer_config.json: the class whose tokenization is tokenizer.json as
  // it is (the post-processor above decides BOS/EOS), and the special tokens.
  json& c = out.tokenizer_config;
  c["tokenizer_class"] = "PreTrainedTokenizerFast";
  c["clean_up_tokenization_spaces"] = false;
  c["add_bos_token"] = v.add_bos;
  c["add_eos_token"] = v.add_eos;
  const std::pair<const char*, const std::optional<int64_t>*> named[] = {
      {"bos_token", &v.bos}, {"eos_token", &v.eos}, {"unk_token", &v.unk}, {"pad_token", &v.pad}};
  for (const auto& [key, id] : named)
    if (*id) c[key] = v.tokens[**id];
  if (const Value* t = f.find("tokenizer.chat_template"))
    c["chat_template"] =
        utf8(f, "tokenizer.chat_template", t->as_string("tokenizer.chat_template"));
  const std::string arch = f.has("general.architecture")
                               ? f.get("general.architecture").as_string("general.architecture")
                               : "";
  if (const Value* n = f.find(arch + ".context_length"))
    c["model_max_length"] = n->as_int(arch + ".context_length");

  // generation_config.json: generation stops at EOS, and at the
  // end-of-turn token where the file names another.
  json& g = out.generation_config;
  g = json::object();  // written even when the file names no special token: never `null`
  if (v.bos) g["bos_token_id"] = *v.bos;
  if (v.eos && v.eot && *v.eot != *v.eos)
    g["eos_token_id"] = {*v.eos, *v.eot};
  else if (v.eos || v.eot)
    g["eos_token_id"] = v.eos ? *v.eos : *v.eot;
  if (v.pad) g["pad_token_id"] = *v.pad;
  return out;
}

}  // namespace tightfit::gguf
