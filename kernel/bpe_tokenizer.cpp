#include "bpe_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace tightfit {
namespace {

// The pre-tokenizer regex GPT-2's ByteLevel uses when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Length of the UTF-8 sequence starting with byte c (1 for invalid bytes).
size_t utf8_len(unsigned char c) {
  if (c >= 0xF0) return 4;
  if (c >= 0xE0) return 3;
  if (c >= 0xC0) return 2;
  return 1;
}

}  // namespace

struct BpeTokenizer::Regex {
  pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;
  Regex(const std::string& pattern, const std::string& source) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw std::invalid_argument(source + ": pre-tokenizer regex does not compile at offset " +
                                  std::to_string(offset) + ": " + reinterpret_cast<char*>(msg));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    match = pcre2_match_data_create_from_pattern(code, nullptr);
  }
  ~Regex() {
    pcre2_match_data_free(match);
    pcre2_code_free(code);
  }
  // Splits `text` into matches and the gaps between them ("isolated").
  void split(const std::string& text, std::vector<std::string>& out) const {
    size_t pos = 0, gap = 0;
    while (pos <= text.size()) {
      const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos,
                                 0, match, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
      const size_t begin = ov[0], end = ov[1];
      if (end == begin) {  // empty match: step one character
        pos = begin + (begin < text.size() ? utf8_len(static_cast<unsigned char>(text[begin])) : 1);
        continue;
      }
      if (begin > gap) out.push_back(text.substr(gap, begin - gap));
      out.push_back(text.substr(begin, end - begin));
      gap = pos = end;
    }
    if (gap < text.size()) out.push_back(text.substr(gap));
  }
};

BpeTokenizer::~BpeTokenizer() = default;

std::unique_ptr<BpeTokenizer> BpeTokenizer::load(const std::string& path_in) {
  std::filesystem::path path = path_in;
  if (std::filesystem::is_directory(path)) path /= "tokenizer.json";
  const std::string src = path.string();
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read tokenizer " + src);
  // A value of the wrong JSON type anywhere below is the file's defect.
  try {
    return from_json(nlohmann::json::parse(in, nullptr, false), path, src);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(src + " is not a tokenizer.json this can read: " + e.what());
  }
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_json(const nlohmann::json& j,
                                                      const std::filesystem::path& path,
                                                      const std::string& src) {
  if (j.is_discarded() || !j.is_object() || !j.contains("model") || !j["model"].is_object())
    throw std::invalid_argument(src + " is not a Hugging Face tokenizer.json");
  const auto& model = j["model"];
  if (model.value("type", std::string()) != "BPE")
    throw std::invalid_argument(src + ": model type \"" + model.value("type", std::string("?")) +
                                "\" is not supported (byte-level BPE only)");
  if (model.value("byte_fallback", false) ||
      !model.value("continuing_subword_prefix", nlohmann::json()).is_null() ||
      !model.value("end_of_word_suffix", nlohmann::json()).is_null())
    throw std::invalid_argument(
        src +
        ": byte_fallback, continuing_subword_prefix and end_of_word_suffix are not "
        "supported (byte-level BPE as GPT-2 and LLaMA-3 use it)");
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    throw std::invalid_argument(
        src + ": normalizers are not supported (GPT-2/LLaMA-3 tokenizers have none)");

  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  t->source_ = std::filesystem::absolute(path).string();
  // GPT-2's reversible map from bytes to printable code points.
  {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      t->byte_to_unicode_[b] = utf8(cp);
      t->unicode_to_byte_[t->byte_to_unicode_[b]] = static_cast<unsigned char>(b);
    }
  }
  // Pre-tokenizer.
  auto add_pre = [&](const nlohmann::json& p, auto&& self) -> void {
    const std::string type = p.value("type", std::string());
    if (type == "Sequence") {
      for (const auto& q : p.value("pretokenizers", nlohmann::json::array())) self(q, self);
    } else if (type == "ByteLevel") {
      t->add_prefix_space_ = p.value("add_prefix_space", false);
      if (p.value("use_regex", true))
        t->splits_.push_back(std::make_unique<Regex>(kGpt2Pattern, src));
    } else if (type == "Split") {
      if (p.value("behavior", std::string()) != "Isolated" || p.value("invert", false) ||
          !p.contains("pattern") || !p["pattern"].contains("Regex"))
        throw std::invalid_argument(
            src + ": only Split pre-tokenizers with a Regex and behavior Isolated are supported");
      t->splits_.push_back(std::make_unique<Regex>(p["pattern"]["Regex"].get<std::string>(), src));
    } else {
      throw std::invalid_argument(src + ": pre-tokenizer \"" + type +
                                  "\" is not supported (ByteLevel, Split, Sequence)");
    }
  };
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null())
    add_pre(j["pre_tokenizer"], add_pre);
  t->ignore_merges_ = model.value("ignore_merges", false);

  if (!model.contains("vocab") || !model["vocab"].is_object() || !model.contains("merges") ||
      !model["merges"].is_array())
    throw std::invalid_argument(src + ": the BPE model needs a vocab object and a merges list");
  // Ids index the token table: a vocabulary of 16M tokens is far past any
  // real one, and a larger or negative id is a damaged file.
  constexpr int64_t kMaxId = int64_t{1} << 24;
  auto checked_id = [&](const nlohmann::json& v) {
    // Not get<int64_t> on any number: a float past int64's range converts
    // with undefined behaviour (fuzz_tokenizer found it).
    if (!v.is_number_integer())
      throw std::invalid_argument(src + ": token id " + v.dump() + " is not an integer");
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= kMaxId)
      throw std::invalid_argument(src + ": token id " + std::to_string(id) + " is out of range");
    return id;
  };
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    const int64_t id = checked_id(it.value());
    t->vocab_[it.key()] = id;
    t->vocab_size_ = std::max(t->vocab_size_, id + 1);
  }
  int rank = 0;
  for (const auto& m : model["merges"]) {
    std::pair<std::string, std::string> pair;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos)
        throw std::invalid_argument(src + ": malformed merge \"" + s + "\"");
      pair = {s.substr(0, sp), s.substr(sp + 1)};
    } else if (m.is_array() && m.size() == 2) {
      pair = {m[0].get<std::string>(), m[1].get<std::string>()};
    } else {
      throw std::invalid_argument(src + ": malformed merge entry");
    }
    t->merge_rank_.emplace(std::move(pair), rank++);
  }
  for (const auto& a : j.value("added_tokens", nlohmann::json::array())) {
    const int64_t id = checked_id(a.at("id"));
    t->added_.emplace_back(a.at("content").get<std::string>(), id);
    t->vocab_size_ = std::max(t->vocab_size_, id + 1);
  }
  for (const auto& [content, id] : t->added_)
    if (!content.empty()) t->added_first_byte_[static_cast<unsigned char>(content[0])] = true;
  std::sort(t->added_.begin(), t->added_.end(),
            [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  t->id_to_token_.resize(static_cast<size_t>(t->vocab_size_));
  t->is_added_.assign(static_cast<size_t>(t->vocab_size_), false);
  for (const auto& [tok, id] : t->vocab_) t->id_to_token_[static_cast<size_t>(id)] = tok;
  for (const auto& [tok, id] : t->added_) {
    t->id_to_token_[static_cast<size_t>(id)] = tok;
    t->is_added_[static_cast<size_t>(id)] = true;
  }
  return t;
}

std::vector<std::string> BpeTokenizer::pre_tokenize(const std::string& text) const {
  std::vector<std::string> pieces{add_prefix_space_ && !text.empty() && text[0] != ' ' ? " " + text
                                                                                       : text};
  for (const auto& re : splits_) {
    std::vector<std::string> next;
    for (const auto& p : pieces) re->split(p, next);
    pieces = std::move(next);
  }
  return pieces;
}

void BpeTokenizer::encode_piece(const std::string& piece, std::vector<int64_t>& out) const {
  if (auto c = cache_.find(piece); c != cache_.end()) {
    out.insert(out.end(), c->second.begin(), c->second.end());
    return;
  }
  std::vector<std::string> symbols;
  std::string whole;
  for (unsigned char b : piece) {
    symbols.push_back(byte_to_unicode_[b]);
    whole += symbols.back();
  }
  std::vector<int64_t> ids;
  if (ignore_merges_ && vocab_.count(whole)) {
    ids.push_back(vocab_.at(whole));
  } else {
    // Merge the lowest-ranked adjacent pair everywhere, until none is known.
    while (symbols.size() > 1) {
      int best = std::numeric_limits<int>::max();
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        auto it = merge_rank_.find({symbols[i], symbols[i + 1]});
        if (it != merge_rank_.end() && it->second < best) best = it->second;
      }
      if (best == std::numeric_limits<int>::max()) break;
      std::vector<std::string> merged;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size()) {
          auto it = merge_rank_.find({symbols[i], symbols[i + 1]});
          if (it != merge_rank_.end() && it->second == best) {
            merged.push_back(symbols[i] + symbols[i + 1]);
            ++i;
            continue;
          }
        }
        merged.push_back(symbols[i]);
      }
      symbols = std::move(merged);
    }
    for (const auto& s : symbols) {
      auto it = vocab_.find(s);
      if (it == vocab_.end())
        throw std::runtime_error("tokenizer vocabulary lacks the symbol \"" + s + "\"");
      ids.push_back(it->second);
    }
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (cache_.size() < 200000) cache_.emplace(piece, std::move(ids));
}

std::vector<int64_t> BpeTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> out;
  size_t pos = 0, start = 0;
  auto flush = [&](size_t end) {
    if (end > start)
      for (const auto& piece : pre_tokenize(text.substr(start, end - start)))
        encode_piece(piece, out);
  };
  // Added (special) tokens are matched verbatim before anything else.
  while (pos < text.size() && !added_.empty()) {
    bool hit = false;
    if (!added_first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    for (const auto& [content, id] : added_) {
      if (!content.empty() && text.compare(pos, content.size(), content) == 0) {
        flush(pos);
        out.push_back(id);
        pos += content.size();
        start = pos;
        hit = true;
        break;
      }
    }
    if (!hit) ++pos;
  }
  flush(text.size());
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size_) continue;
    const std::string& tok = id_to_token_[static_cast<size_t>(id)];
    if (is_added_[static_cast<size_t>(id)]) {
      out += tok;
      continue;
    }
    for (size_t i = 0; i < tok.size();) {
      const size_t n = std::min(utf8_len(static_cast<unsigned char>(tok[i])), tok.size() - i);
      auto it = unicode_to_byte_.find(tok.substr(i, n));
      if (it != unicode_to_byte_.end()) out += static_cast<char>(it->second);
      i += n;
    }
  }
  return out;
}

}  // namespace tightfit
