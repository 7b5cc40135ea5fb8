#include "tokenizer_folder.hpp"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "file_util.hpp"
#include "json_input.hpp"
#include "sentencepiece_convert.hpp"
#include "tokenizer_config.hpp"
#include "tokenizer_json_parts.hpp"
#include "tokenizer_steps.hpp"

namespace tightfit {
namespace fs = std::filesystem;
using nlohmann::json;
using tokenizer_json::byte_level;
using tokenizer_json::template_processing;

namespace {

// Real tokenizer files are under 20 MB (tokenizer.json, vocab.json) and nest 6 levels.
constexpr size_t kMaxFileBytes = size_t{512} << 20;
constexpr int kMaxDepth = 64;

// The classes whose tokenizer.json transformers uses as it is, and the ones
// whose fast class rebuilds the post-processor from add_bos_token /
// add_eos_token (update_post_processor), with their defaults.
struct PostProcessorClass {
  const char* name;
  bool add_bos, add_eos;
};
constexpr PostProcessorClass kTemplateClasses[] = {{"LlamaTokenizer", true, false},
                                                   {"GemmaTokenizer", true, false},
                                                   {"GPTNeoXTokenizer", false, false},
                                                   {"CohereTokenizer", true, false}};
constexpr const char* kAsIsClasses[] = {"PreTrainedTokenizerFast", "GPT2Tokenizer",
                                        "Qwen2Tokenizer"};

std::string read_file(const fs::path& p) {
  try {
    return read_regular_file(p.string(), kMaxFileBytes);
  } catch (const std::exception& e) {
    throw std::invalid_argument("cannot read tokenizer " + p.string() + ": " + e.what());
  }
}

// --- vocab.json + merges.txt (GPT2Converter, Qwen2Converter) ---------------

json byte_level_bpe(const fs::path& folder, const TokenizerConfig& cfg) {
  const fs::path vocab_file = folder / "vocab.json", merges_file = folder / "merges.txt";
  const json vocab = parse_json(read_file(vocab_file), vocab_file.string(), kMaxDepth);
  if (!vocab.is_object())
    throw std::invalid_argument(vocab_file.string() + " is not a JSON object of token ids");
  const std::string text = read_file(merges_file);
  // The slow tokenizers' reading of merges.txt: GPT2Tokenizer drops the first
  // and the last line of text.split("\n"); Qwen2Tokenizer skips a first
  // "#version:" line and blank lines.
  std::vector<std::string> lines;
  for (size_t pos = 0;;) {
    const size_t nl = text.find('\n', pos);
    lines.push_back(text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos));
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  const bool qwen = cfg.tokenizer_class == "Qwen2Tokenizer";
  json merges = json::array();
  std::unordered_set<std::string>
      seen;  // bpe_ranks is a dict: a repeated merge keeps its first place
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string line = lines[i];
    auto strip = [](std::string s) {
      const auto b = s.find_first_not_of(" \t\r\n\f\v");
      if (b == std::string::npos) return std::string();
      return s.substr(b, s.find_last_not_of(" \t\r\n\f\v") - b + 1);
    };
    if (qwen) {
      line = strip(line);
      if ((i == 0 && line.rfind("#version:", 0) == 0) || line.empty()) continue;
    } else if (i == 0 || i + 1 == lines.size()) {
      continue;
    }
    std::vector<std::string> parts;
    for (size_t p = 0; p < line.size();) {
      const size_t b = line.find_first_not_of(" \t\r\n\f\v", p);
      if (b == std::string::npos) break;
      const size_t e = std::min(line.find_first_of(" \t\r\n\f\v", b), line.size());
      parts.push_back(line.substr(b, e - b));
      p = e;
    }
    if (parts.size() != 2)
      throw std::invalid_argument(merges_file.string() + ":" + std::to_string(i + 1) +
                                  ": a merge must be two tokens separated by a space");
    if (seen.insert(parts[0] + ' ' + parts[1]).second) merges.push_back(parts);
  }
  json model = {{"type", "BPE"},           {"vocab", vocab},    {"merges", merges},
                {"dropout", nullptr},      {"fuse_unk", false}, {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""}};
  json t = {{"model", model}, {"decoder", byte_level(false)}};
  if (qwen) {
    // Qwen2Converter: NFC, Qwen2's split regex, then bytes (add_prefix_space
    // "has no effect", as Qwen2Tokenizer warns).
    t["normalizer"] = {{"type", "NFC"}};
    t["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {tokenizer_json::split_isolated(tokenizer_json::kQwen2Pattern),
                            byte_level(false, false)}}};
    t["post_processor"] = byte_level(false);
    return t;
  }
  // GPT2Converter.
  t["pre_tokenizer"] = byte_level(cfg.add_prefix_space.value_or(false));
  t["post_processor"] = byte_level(false);
  if (cfg.add_bos_token.value_or(false)) {
    if (cfg.bos_token.empty())
      throw std::invalid_argument(cfg.source + ": add_bos_token is true but there is no bos_token");
    t["post_processor"] = json{{"type", "GPT2 BOS"}, {"bos", cfg.bos_token}};  // resolved later
  }
  return t;
}

// --- what the fast tokenizer's class adds ---------------------------------

// The id tokenizers gives `content`: an added token's, else the model's.
std::optional<int64_t> id_in(const json& t, const std::string& content) {
  if (t.contains("added_tokens") && t["added_tokens"].is_array())
    for (const auto& a : t["added_tokens"])
      if (a.is_object() && a.value("content", std::string()) == content && a.contains("id") &&
          a["id"].is_number_integer())
        return a["id"].get<int64_t>();
  const json& model = t["model"];
  if (model.contains("vocab") && model["vocab"].is_object()) {
    const auto it = model["vocab"].find(content);
    if (it != model["vocab"].end() && it->is_number_integer()) return it->get<int64_t>();
  }
  return std::nullopt;
}

// PreTrainedTokenizerFast.__init__: the added_tokens_decoder entries, then
// the special tokens, that the tokenizer does not have yet, added as
// tokenizers' add_tokens does (an id of the vocabulary when the text is in
// it, else the next free one).
void add_config_tokens(json& t, const TokenizerConfig& cfg) {
  if (!t.contains("added_tokens") || !t["added_tokens"].is_array())
    t["added_tokens"] = json::array();
  std::unordered_set<std::string> present;
  int64_t next = 0;
  if (t["model"].contains("vocab") && t["model"]["vocab"].is_object())
    next = static_cast<int64_t>(t["model"]["vocab"].size());
  for (const auto& a : t["added_tokens"])
    if (a.is_object() && a.contains("content") && a["content"].is_string()) {
      present.insert(a["content"].get<std::string>());
      if (a.contains("id") && a["id"].is_number_integer())
        next = std::max(next, a["id"].get<int64_t>() + 1);
    }
  std::vector<AddedTokenSpec> to_add;
  for (const AddedTokenSpec& a : cfg.added_tokens_decoder)
    if (!present.count(a.content)) to_add.push_back(a), present.insert(a.content);
  for (const AddedTokenSpec& a : cfg.special_tokens)
    if (!present.count(a.content)) to_add.push_back(a), present.insert(a.content);
  for (const AddedTokenSpec& a : to_add) {
    int64_t id;
    if (const auto known = id_in(t, a.content)) {
      id = *known;
    } else {
      id = next++;
    }
    t["added_tokens"].push_back({{"id", id},
                                 {"content", a.content},
                                 {"single_word", a.single_word},
                                 {"lstrip", a.lstrip},
                                 {"rstrip", a.rstrip},
                                 {"normalized", a.normalized},
                                 {"special", a.special}});
  }
}

int64_t token_id_or_fail(const json& t, const std::string& token, const std::string& what,
                         const TokenizerConfig& cfg) {
  const auto id = id_in(t, token);
  if (!id)
    throw std::invalid_argument(cfg.source + ": " + what + " \"" + token +
                                "\" is not a token of the tokenizer");
  return *id;
}

// The post-processor of the classes that rebuild it (LlamaTokenizerFast's
// update_post_processor), and of a converted GPT-2 with add_bos_token.
void apply_class_post_processor(json& t, const TokenizerConfig& cfg) {
  if (t.contains("post_processor") && t["post_processor"].is_object() &&
      t["post_processor"].value("type", std::string()) == "GPT2 BOS") {
    t["post_processor"] = template_processing(
        &cfg.bos_token, token_id_or_fail(t, cfg.bos_token, "bos_token", cfg), nullptr, 0);
    return;
  }
  for (const PostProcessorClass& c : kTemplateClasses) {
    if (cfg.tokenizer_class != c.name) continue;
    const bool bos = cfg.add_bos_token.value_or(c.add_bos),
               eos = cfg.add_eos_token.value_or(c.add_eos);
    if (bos && cfg.bos_token.empty())
      throw std::invalid_argument(cfg.source + ": add_bos_token = true but bos_token = None");
    if (eos && cfg.eos_token.empty())
      throw std::invalid_argument(cfg.source + ": add_eos_token = true but eos_token = None");
    t["post_processor"] =
        template_processing(bos ? &cfg.bos_token : nullptr,
                            bos ? token_id_or_fail(t, cfg.bos_token, "bos_token", cfg) : 0,
                            eos ? &cfg.eos_token : nullptr,
                            eos ? token_id_or_fail(t, cfg.eos_token, "eos_token", cfg) : 0);
  }
}

bool is_template_class(const std::string& c) {
  return std::any_of(std::begin(kTemplateClasses), std::end(kTemplateClasses),
                     [&](const PostProcessorClass& k) { return c == k.name; });
}

void check_class_known(const TokenizerConfig& cfg) {
  if (cfg.tokenizer_class.empty() || is_template_class(cfg.tokenizer_class) ||
      std::any_of(std::begin(kAsIsClasses), std::end(kAsIsClasses),
                  [&](const char* k) { return cfg.tokenizer_class == k; }))
    return;
  std::string known;
  for (const PostProcessorClass& k : kTemplateClasses)
    known += std::string(known.empty() ? "" : ", ") + k.name;
  for (const char* k : kAsIsClasses) known += std::string(", ") + k;
  throw std::invalid_argument(cfg.class_source + ": tokenizer class \"" + cfg.tokenizer_class +
                              "\" is not one whose tokenization tightfit reproduces (" + known +
                              "); its fast tokenizer may add or change tokens: refused rather "
                              "than tokenized differently from transformers");
}

// Files without a tokenizer.json whose class is not one tightfit converts.
[[noreturn]] void refuse_unconverted(const fs::path& folder, const TokenizerConfig& cfg,
                                     const std::string& files, const std::string& classes) {
  throw std::invalid_argument(
      folder.string() + " has " + files + " but no tokenizer.json, and its " +
      (cfg.tokenizer_class.empty() ? std::string("tokenizer class is not named")
                                   : "tokenizer class is \"" + cfg.tokenizer_class + "\"") +
      ": tightfit converts them as " + classes +
      " does; name the class in tokenizer_config.json's \"tokenizer_class\", or save the "
      "tokenizer with transformers (AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)) to "
      "get a tokenizer.json");
}

}  // namespace

std::string byte_tokenizer_json() {
  const ByteLevelAlphabet alphabet;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[alphabet.byte_to_char[b]] = b;
  const json bytes = {{"type", "ByteLevel"},
                      {"add_prefix_space", false},
                      {"trim_offsets", false},
                      {"use_regex", false}};
  const json t = {{"version", "1.0"},
                  {"truncation", nullptr},
                  {"padding", nullptr},
                  {"added_tokens", json::array()},
                  {"normalizer", nullptr},
                  {"pre_tokenizer", bytes},
                  {"post_processor", nullptr},
                  {"decoder", bytes},
                  {"model", tokenizer_json::byte_level_bpe_model(vocab, json::array())}};
  return t.dump(2) + "\n";
}

std::string byte_tokenizer_config_json() {
  // Named, so that AutoTokenizer adds no class defaults (GPT2's <|endoftext|>).
  return json{{"tokenizer_class", "PreTrainedTokenizerFast"}}.dump(2) + "\n";
}

bool has_tokenizer_files(const std::string& folder) {
  std::error_code ec;
  const fs::path f = folder;
  return fs::exists(f / "tokenizer.json", ec) ||
         (fs::exists(f / "vocab.json", ec) && fs::exists(f / "merges.txt", ec)) ||
         fs::exists(f / "tokenizer.model", ec);
}

TokenizerDefinition read_hf_tokenizer(const std::string& path) {
  std::error_code ec;
  const bool is_folder = fs::is_directory(path, ec);
  const fs::path folder = is_folder ? fs::path(path) : fs::path(path).parent_path();
  const TokenizerConfig cfg = TokenizerConfig::load(folder.empty() ? "." : folder.string());
  check_class_known(cfg);
  const fs::path tokenizer_json = is_folder ? folder / "tokenizer.json" : fs::path(path);
  TokenizerDefinition d;
  // LlamaTokenizerFast with add_prefix_space set rebuilds itself from
  // tokenizer.model (from_slow), whatever tokenizer.json says.
  const bool from_slow = is_template_class(cfg.tokenizer_class) && cfg.add_prefix_space;
  if (fs::exists(tokenizer_json, ec) && !from_slow) {
    d.source = fs::absolute(tokenizer_json).string();
    d.spec = parse_json(read_file(tokenizer_json), tokenizer_json.string(), kMaxDepth);
    if (!d.spec.is_object() || !d.spec.contains("model") || !d.spec["model"].is_object())
      throw std::invalid_argument(tokenizer_json.string() +
                                  " is not a Hugging Face tokenizer.json");
  } else if (!is_folder && !from_slow) {
    throw std::invalid_argument("cannot read tokenizer " + path + ": no such file");
  } else if (!from_slow && fs::exists(folder / "vocab.json", ec) &&
             fs::exists(folder / "merges.txt", ec)) {
    if (cfg.tokenizer_class != "GPT2Tokenizer" && cfg.tokenizer_class != "Qwen2Tokenizer")
      refuse_unconverted(folder, cfg, "vocab.json and merges.txt",
                         "GPT2Tokenizer or Qwen2Tokenizer");
    d.source = fs::absolute(folder / "vocab.json").string();
    d.spec = byte_level_bpe(folder, cfg);
  } else if (fs::exists(folder / "tokenizer.model", ec)) {
    if (cfg.tokenizer_class != "LlamaTokenizer")
      refuse_unconverted(folder, cfg, "a SentencePiece tokenizer.model", "LlamaTokenizer");
    d.source = fs::absolute(folder / "tokenizer.model").string();
    const fs::path file = folder / "tokenizer.model";
    d.spec = sentencepiece_bpe_tokenizer(SentencePieceModel::parse(read_file(file), file.string()),
                                         file.string(), cfg.legacy.value_or(true),
                                         cfg.add_prefix_space.value_or(true));
  } else if (from_slow) {
    throw std::invalid_argument(
        cfg.source + " sets add_prefix_space, with which " + cfg.tokenizer_class +
        "Fast rebuilds the tokenizer from tokenizer.model, and " + folder.string() +
        " has none: remove add_prefix_space from it, or add the model's tokenizer.model");
  } else {
    throw std::invalid_argument(
        "model folder " + folder.string() +
        " has no tokenizer (tokenizer.json, vocab.json + merges.txt, or tokenizer.model): copy "
        "the model's tokenizer files into it, name one with [data] tokenizer = \"PATH\", or "
        "set [data] tokenizer = \"byte\" to train on the 256-id byte tokenizer");
  }
  try {
    add_config_tokens(d.spec, cfg);
    apply_class_post_processor(d.spec, cfg);
  } catch (const json::exception& e) {
    throw std::invalid_argument(d.source + " is not a tokenizer this can read: " + e.what());
  }
  return d;
}

}  // namespace tightfit
