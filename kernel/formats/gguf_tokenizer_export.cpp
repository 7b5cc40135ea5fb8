#include "gguf_tokenizer_export.hpp"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <optional>

#include "bpe_tokenizer.hpp"
#include "file_util.hpp"
#include "gguf_tokenizer.hpp"
#include "json_input.hpp"
#include "tokenizer_config.hpp"

namespace tightfit::gguf {
namespace fs = std::filesystem;
namespace {
using nlohmann::json;

constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;

// What convert_hf_to_gguf takes for a control token although the tokenizer
// does not mark it special (does_token_look_special).
bool looks_special(const std::string& t) {
  auto wraps = [&](const std::string& a, const std::string& b) {
    return t.size() >= a.size() + b.size() && t.rfind(a, 0) == 0 &&
           t.compare(t.size() - b.size(), b.size(), b) == 0;
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || wraps("<|", "|>") ||
         wraps("<\xef\xbd\x9c", "\xef\xbd\x9c>") || wraps("<unused", ">");
}

// The keys, but for the pre-tokenizer's name.
struct Keys {
  std::vector<Value> tokens, types, merges;
  std::optional<int64_t> bos, eos, unk, pad;
  bool add_bos = false, add_eos = false;
  std::string chat_template;
};

void put(GgufWriter& w, const Keys& k, const std::string& pre) {
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre);
  w.set("tokenizer.ggml.tokens", array_value(ValueType::STRING, k.tokens));
  w.set("tokenizer.ggml.token_type", array_value(ValueType::INT32, k.types));
  w.set("tokenizer.ggml.merges", array_value(ValueType::STRING, k.merges));
  const std::pair<const char*, const std::optional<int64_t>*> ids[] = {
      {"bos_token_id", &k.bos},
      {"eos_token_id", &k.eos},
      {"unknown_token_id", &k.unk},
      {"padding_token_id", &k.pad}};
  for (const auto& [key, id] : ids)
    if (*id) w.set_u32(std::string("tokenizer.ggml.") + key, static_cast<uint32_t>(**id));
  w.set_bool("tokenizer.ggml.add_bos_token", k.add_bos);
  w.set_bool("tokenizer.ggml.add_eos_token", k.add_eos);
  if (!k.chat_template.empty()) w.set_string("tokenizer.chat_template", k.chat_template);
}

std::vector<std::string> check_lines(const Keys& k) {
  std::vector<std::string> lines = {
      "Hello world! HELLO World, hello   world.",
      "I'm sure we'll see they've done it; you'd've known. DON'T SHOUT",
      "12 123 1234 12345 3.14159 1,000,000 2026-11-27 0x1F 007",
      "  leading spaces\ttab\t\ttabs\n\nnew lines \n  \n end   ",
      "na\xc3\xafve caf\xc3\xa9 \xc3\x85ngstr\xc3\xb6m Stra\xc3\x9f"
      "e "
      "\xd0\x97\xd0\xb4\xd1\x80\xd0\xb0\xd0\xb2\xd1\x81\xd1\x82\xd0\xb2\xd1\x83\xd0\xb9\xd1\x82\xd0"
      "\xb5",
      "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87 "
      "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 "
      "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xf0\x9f\x9a\x80\xf0\x9f\x9a\x80 e\xcc\x81",
      "def f(x):\n    return x**2  # square\n\nprint(f(3))",
      "!!! ??? ... --- ((()))  [a]{b}<c> $100 50% @home #tag",
      // Whitespace, letters and other scripts right before and after
      // numbers: where digit-splitting pre-tokenizers differ from GPT-2's.
      "\r\n1234567\r\n2026   12  3\t45\n\n678 x86_64 v2.0-rc1 e=mc\xc2\xb2 \xc2\xbd",
      "3 33 333 3333 33333 333333 3333333 3.3 3..3 3...3 a1b22c333 1a 22b",
      "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n",
      "\xe6\x97\xa5\xe6\x9c\xac"
      "2026\xe5\xb9\xb4 \xd9\xa3\xd9\xa4 \xe0\xa5\xa9 \xe2\x91\xa0 "
      "caf\xc3\xa9"
      "123 \xf0\x9f\x9a\x80"
      "12",
  };
  for (size_t i = 0; i < k.tokens.size(); ++i)
    if (k.types[i].i == kControl || k.types[i].i == kUserDefined)
      lines.push_back("a" + k.tokens[i].s + " b" + k.tokens[i].s + "12");
  return lines;
}

// A fresh folder of tightfit's own for the check, removed after.
class ScratchDir {
 public:
  ScratchDir() {
    static std::atomic<uint64_t> counter{0};
    path_ = (fs::temp_directory_path() / ("tightfit-gguf-tokenizer-" + std::to_string(::getpid()) +
                                          "-" + std::to_string(counter.fetch_add(1))))
                .string();
    std::error_code ec;
    if (!fs::create_directory(path_, ec))
      throw std::runtime_error("cannot create " + path_ + (ec ? ": " + ec.message() : ""));
  }
  ~ScratchDir() {
    try {
      remove_tree(path_);
    } catch (...) {
    }
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Whether the keys with `pre`, read as llama.cpp reads them, tokenize as
// `original` does.
bool reproduces(const Keys& k, const std::string& pre, const BpeTokenizer& original,
                const std::vector<std::string>& lines) {
  ScratchDir dir;
  const std::string file = dir.path() + "/check.gguf";
  {
    GgufWriter w(file);
    put(w, k, pre);
    w.finish();
  }
  const TokenizerFiles files = tokenizer_files(GgufReader(file));
  write_file_synced(dir.path() + "/tokenizer.json", files.tokenizer.dump());
  write_file_synced(dir.path() + "/tokenizer_config.json", files.tokenizer_config.dump());
  const auto back = BpeTokenizer::load(dir.path());
  for (const std::string& line : lines)
    if (back->encode(line, true) != original.encode(line, true)) return false;
  return true;
}

}  // namespace

void write_hf_tokenizer_keys(const std::string& tokenizer_json, GgufWriter& out) {
  const fs::path folder = fs::path(tokenizer_json).parent_path();
  auto refuse = [&](const std::string& why) -> void {
    throw GgufError(tokenizer_json + ": " + why +
                    "; export a Hugging Face folder (--format hf) and convert it with "
                    "llama.cpp's convert_hf_to_gguf.py");
  };
  if (fs::path(tokenizer_json).filename() != "tokenizer.json")
    refuse("tightfit writes GGUF tokenizer keys from a tokenizer.json (byte-level BPE)");
  const json j = read_json_file(tokenizer_json, size_t{512} << 20);
  const json& model = j.contains("model") ? j["model"] : json();
  if (!model.is_object() || model.value("type", "") != "BPE" || !j.contains("decoder") ||
      !j["decoder"].is_object() || j["decoder"].value("type", "") != "ByteLevel")
    refuse(
        "not a byte-level BPE tokenizer (GPT-2, Llama 3, Qwen2, SmolLM style), the kind "
        "tightfit writes as GGUF keys");
  if (!model.contains("vocab") || !model["vocab"].is_object()) refuse("the BPE model has no vocab");

  // tokens by id: the vocabulary, then the added tokens.
  std::vector<std::optional<std::pair<std::string, int32_t>>> by_id;
  auto place = [&](const std::string& token, const json& id, int32_t type) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t{1} << 24))
      refuse("token \"" + token + "\" has the id " + json_excerpt(id));
    const auto i = static_cast<size_t>(id.get<int64_t>());
    if (i >= by_id.size()) by_id.resize(i + 1);
    by_id[i] = std::pair{token, type};
  };
  for (const auto& [token, id] : model["vocab"].items()) place(token, id, kNormal);
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const json& a : j["added_tokens"]) {
      const std::string content = a.value("content", "");
      const bool special = a.value("special", false) || looks_special(content);
      place(content, a.contains("id") ? a["id"] : json(), special ? kControl : kUserDefined);
    }
  Keys k;
  for (size_t i = 0; i < by_id.size(); ++i) {
    // An id no token holds: convert_hf_to_gguf's "[PAD<id>]", unused.
    k.tokens.push_back(string_value(by_id[i] ? by_id[i]->first : "[PAD" + std::to_string(i) + "]"));
    k.types.push_back(i32_value(by_id[i] ? by_id[i]->second : kUnused));
  }
  if (model.contains("merges") && model["merges"].is_array())
    for (const json& m : model["merges"]) {
      if (m.is_string())
        k.merges.push_back(string_value(m.get<std::string>()));
      else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
        k.merges.push_back(string_value(m[0].get<std::string>() + " " + m[1].get<std::string>()));
      else
        refuse("a merge is " + json_excerpt(m) + ", not two tokens");
    }

  // The tokenizer as tightfit reads it (tokenizer_config.json's rules too):
  // its ids are what the keys must reproduce.
  const auto original = BpeTokenizer::load(folder.string());
  const TokenizerConfig config = TokenizerConfig::load(folder.string());
  auto id_of = [&](const std::string& t) -> std::optional<int64_t> {
    if (t.empty()) return std::nullopt;
    if (auto id = original->token_to_id(t)) return id;
    return std::nullopt;
  };
  k.bos = id_of(config.bos_token);
  k.eos = id_of(config.eos_token);
  k.unk = id_of(config.unk_token);
  k.pad = id_of(config.pad_token);
  const std::vector<int64_t> plain = original->encode("a", false),
                             with = original->encode("a", true);
  k.add_bos = with.size() > plain.size() && with.front() != plain.front();
  k.add_eos = with.size() > plain.size() && with.back() != plain.back();
  if (k.add_bos) k.bos = with.front();
  if (k.add_eos) k.eos = with.back();
  if (with.size() > plain.size() + (k.add_bos ? 1 : 0) + (k.add_eos ? 1 : 0))
    refuse("its post-processor adds more than a BOS and an EOS token, which GGUF cannot say");
  k.chat_template = config.chat_template;

  const std::vector<std::string> lines = check_lines(k);
  for (const char* pre : {"gpt-2", "smollm", "llama-bpe", "qwen2"}) {
    bool same = false;
    try {
      same = reproduces(k, pre, *original, lines);
    } catch (const std::exception&) {
      same = false;  // keys this pre-tokenizer cannot take (llama-bpe without a BOS id)
    }
    if (same) {
      put(out, k, pre);
      return;
    }
  }
  refuse(
      "no pre-tokenizer llama.cpp names (gpt-2, smollm, llama-bpe, qwen2) splits text as this "
      "tokenizer does");
}

}  // namespace tightfit::gguf
