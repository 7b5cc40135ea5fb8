#include "bpe_tokenizer.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "tokenizer_folder.hpp"

namespace tightfit {
namespace {

using nlohmann::json;

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_word_byte(unsigned char c) {
  return std::isalnum(c) || c == '_' || c >= 0x80;
}

}  // namespace

BpeTokenizer::~BpeTokenizer() = default;

std::unique_ptr<BpeTokenizer> BpeTokenizer::load(const std::string& path) {
  const TokenizerDefinition d = read_hf_tokenizer(path);
  // A value of the wrong JSON type anywhere below is the file's defect.
  try {
    return std::unique_ptr<BpeTokenizer>(new BpeTokenizer(d.spec, d.source));
  } catch (const json::exception& e) {
    throw std::invalid_argument(d.source + " is not a tokenizer.json this can read: " + e.what());
  }
}

namespace {
const json& or_null(const json& j, const char* key) {
  static const json null;
  return j.contains(key) ? j[key] : null;
}
}  // namespace

BpeTokenizer::BpeTokenizer(const json& j, const std::string& source)
    : source_(source),
      normalizer_(or_null(j, "normalizer"), source),
      pre_tokenizer_(or_null(j, "pre_tokenizer"), source),
      model_(
          [&]() -> const json& {
            const std::string type = j["model"].value("type", std::string("BPE"));
            if (type != "BPE")
              throw std::invalid_argument(
                  source + ": model type \"" + type +
                  "\" is not supported (BPE, byte-level or SentencePiece-style)");
            return j["model"];
          }(),
          source),
      decoder_(or_null(j, "decoder"), source) {
  auto fail = [&](const std::string& what) { throw std::invalid_argument(source + ": " + what); };
  vocab_size_ = model_.size();
  const json& added = or_null(j, "added_tokens");
  if (!added.is_null() && !added.is_array()) fail("\"added_tokens\" must be a list");
  for (const auto& a : added.is_array() ? added : json::array()) {
    AddedToken t;
    const json& id = a.at("id");
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t{1} << 24))
      fail("added token id " + (id.is_number() ? id.dump() : std::string("?")) +
           " is out of range");
    t.id = id.get<int64_t>();
    t.content = a.at("content").get<std::string>();
    t.special = a.value("special", false);
    t.normalized = a.value("normalized", !t.special);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.single_word = a.value("single_word", false);
    if (t.content.empty()) fail("an added token with empty content");
    vocab_size_ = std::max(vocab_size_, t.id + 1);
    added_.push_back(std::move(t));
  }
  const int64_t entries = static_cast<int64_t>(model_.entries() + added_.size());
  if (vocab_size_ > 2 * entries + 1024)
    fail("token ids reach " + std::to_string(vocab_size_ - 1) + " for " + std::to_string(entries) +
         " tokens: the ids are not dense, the file is damaged");
  std::stable_sort(added_.begin(), added_.end(), [](const AddedToken& x, const AddedToken& y) {
    return x.content.size() > y.content.size();
  });
  added_by_id_.assign(static_cast<size_t>(vocab_size_), nullptr);
  for (const AddedToken& t : added_) added_by_id_[static_cast<size_t>(t.id)] = &t;
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<std::string> texts;
    for (size_t k = 0; k < added_.size(); ++k)
      if (added_[k].normalized == (kind == 1)) {
        texts.push_back(added_[k].content);
        added_of_kind_[kind].push_back(k);
      }
    added_matcher_[kind] = std::make_unique<AddedTokenMatcher>(texts);
  }

  // The post-processor: BOS/EOS around a single sequence.
  auto post = [&](const json& p, auto&& self, int depth) -> void {
    if (p.is_null()) return;
    if (depth > 16) fail("post-processor Sequence nested too deep");
    const std::string type = p.value("type", std::string());
    if (type == "Sequence") {
      for (const auto& q : p.at("processors")) self(q, self, depth + 1);
    } else if (type == "TemplateProcessing") {
      bool seen_sequence = false;
      for (const auto& item : p.at("single")) {
        if (item.contains("Sequence")) {
          seen_sequence = true;
          continue;
        }
        const std::string name = item.at("SpecialToken").at("id").get<std::string>();
        const json& spec = p.at("special_tokens").at(name);
        for (const auto& v : spec.at("ids")) {
          const int64_t id = v.get<int64_t>();
          if (id < 0 || id >= vocab_size_) fail("post-processor token id out of range");
          (seen_sequence ? suffix_ids_ : prefix_ids_).push_back(id);
        }
      }
    } else if (type != "ByteLevel") {  // ByteLevel only trims offsets
      fail("post-processor \"" + type +
           "\" is not supported (TemplateProcessing, ByteLevel, Sequence)");
    }
  };
  post(or_null(j, "post_processor"), post, 0);
}

// As the tokenizers library's AddedVocabulary::find_matches: matches
// leftmost-longest and non-overlapping; a single_word token with a word byte
// beside it is not a match (the search goes on after it); lstrip and rstrip
// take the spaces around it into the token.
template <typename OnText, typename OnToken>
void BpeTokenizer::split_added(const std::string& text, bool normalized, OnText&& on_text,
                               OnToken&& on_token) const {
  const int kind = normalized ? 1 : 0;
  const std::vector<int32_t> longest = added_matcher_[kind]->longest_from(text);
  size_t pos = 0, start = 0;
  while (pos < text.size()) {
    if (longest[pos] < 0) {
      ++pos;
      continue;
    }
    const AddedToken& t = added_[added_of_kind_[kind][static_cast<size_t>(longest[pos])]];
    size_t b = pos, e = pos + t.content.size();
    pos = e;
    if (t.single_word && ((b > 0 && is_word_byte(static_cast<unsigned char>(text[b - 1]))) ||
                          (e < text.size() && is_word_byte(static_cast<unsigned char>(text[e])))))
      continue;
    if (t.lstrip)
      while (b > start && is_space(text[b - 1])) --b;
    if (t.rstrip)
      while (e < text.size() && is_space(text[e])) ++e;
    if (b > start) on_text(start, b);
    on_token(t.id, b, e);
    pos = start = e;
  }
  if (start < text.size()) on_text(start, text.size());
}

void BpeTokenizer::encode_impl(const std::string& text, std::vector<int64_t>& out,
                               std::vector<std::pair<size_t, size_t>>* offsets) const {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  auto raw_token = [&](int64_t id, size_t b, size_t e) {
    out.push_back(id);
    if (offsets) offsets->emplace_back(b, e);
  };
  split_added(
      text, false,
      [&](size_t raw_b, size_t raw_e) {
        std::string segment = text.substr(raw_b, raw_e - raw_b);
        Piece norm = offsets ? Piece::tracked_from(std::move(segment), static_cast<uint32_t>(raw_b),
                                                   raw_b == 0)
                             : Piece{std::move(segment), raw_b == 0, {}, {}};
        normalizer_.apply(norm);
        auto norm_token = [&](int64_t id, size_t b, size_t e) {
          out.push_back(id);
          if (offsets) offsets->emplace_back(norm.begin[b], norm.end[e - 1]);
        };
        split_added(
            norm.text, true,
            [&](size_t b, size_t e) {
              std::vector<Piece> pieces{norm.slice(b, e)};
              pieces[0].at_start = raw_b == 0 && b == 0;
              pre_tokenizer_.apply(pieces);
              for (const Piece& p : pieces) {
                ranges.clear();
                model_.encode(p.text, out, offsets ? &ranges : nullptr);
                if (offsets)
                  for (const auto& [rb, re] : ranges)
                    offsets->emplace_back(p.begin[rb], p.end[re - 1]);
              }
            },
            norm_token);
      },
      raw_token);
}

std::vector<int64_t> BpeTokenizer::encode(const std::string& text, bool add_special_tokens) const {
  std::vector<int64_t> out;
  if (add_special_tokens) out = prefix_ids_;
  encode_impl(text, out, nullptr);
  if (add_special_tokens) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

std::vector<int64_t> BpeTokenizer::encode_with_offsets(
    const std::string& text, std::vector<std::pair<size_t, size_t>>& offsets) const {
  std::vector<int64_t> out;
  offsets.clear();
  encode_impl(text, out, &offsets);
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size_) continue;
    if (const AddedToken* t = added_by_id_[static_cast<size_t>(id)]) {
      if (!(skip_special_tokens && t->special)) tokens.push_back(t->content);
    } else if (const std::string* s = model_.token_of(id)) {
      tokens.push_back(*s);
    }
  }
  return decoder_.apply(std::move(tokens));
}

std::optional<int64_t> BpeTokenizer::token_to_id(const std::string& token) const {
  for (const AddedToken& t : added_)
    if (t.content == token) return t.id;
  return model_.id_of(token);
}

}  // namespace tightfit
