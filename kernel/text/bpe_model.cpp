#include "bpe_model.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>
#include <stdexcept>

#include "json_input.hpp"
#include "pcre_regex.hpp"

namespace tightfit {
namespace {

// Ids index the token table: a vocabulary of 16M tokens is far past any real
// one, and a larger or negative id is a damaged file.
constexpr int64_t kMaxId = int64_t{1} << 24;

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

BpeModel::BpeModel(const nlohmann::json& model, const std::string& source) {
  auto fail = [&](const std::string& what) { throw std::invalid_argument(source + ": " + what); };
  if (!model.contains("vocab") || !model["vocab"].is_object() || !model.contains("merges") ||
      !model["merges"].is_array())
    fail("the BPE model needs a vocab object and a merges list");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && !model[key].is_null() && model[key] != "")
      fail(std::string(key) + " is not supported (BPE as GPT-2, LLaMA, Mistral and Qwen use it)");
  if (model.contains("dropout") && model["dropout"].is_number() &&
      model["dropout"].get<double>() > 0)
    fail("BPE dropout is not supported (it randomizes ids); set \"dropout\" to null");
  fuse_unk_ = model.value("fuse_unk", false);
  byte_fallback_ = model.value("byte_fallback", false);
  ignore_merges_ = model.value("ignore_merges", false);

  int64_t largest = -1;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    const auto& v = it.value();
    // Not get<int64_t> on any number: a float past int64's range converts
    // with undefined behaviour (fuzz_tokenizer found it).
    if (!v.is_number_integer()) fail("token id " + json_excerpt(v) + " is not an integer");
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= kMaxId) fail("token id " + std::to_string(id) + " is out of range");
    vocab_[it.key()] = static_cast<int32_t>(id);
    largest = std::max(largest, id);
  }
  // Real vocabularies are dense; a sparse one would size a huge embedding.
  if (largest + 1 > 2 * static_cast<int64_t>(vocab_.size()) + 1024)
    fail("token ids reach " + std::to_string(largest) + " for " + std::to_string(vocab_.size()) +
         " tokens: the ids are not dense, the file is damaged");
  id_to_token_.resize(static_cast<size_t>(largest + 1));
  for (const auto& [tok, id] : vocab_) id_to_token_[static_cast<size_t>(id)] = tok;

  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = vocab_.find(model["unk_token"].get<std::string>());
    if (it == vocab_.end())
      fail("unk_token \"" + model["unk_token"].get<std::string>() + "\" is not in the vocabulary");
    unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto it = vocab_.find(name);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }

  int32_t rank = 0;
  for (const auto& m : model["merges"]) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos) fail("malformed merge \"" + s + "\"");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      fail("malformed merge entry (a \"left right\" string or a pair of strings)");
    }
    const auto ia = vocab_.find(a), ib = vocab_.find(b), ic = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || ic == vocab_.end())
      fail("merge \"" + a + " " + b + "\" names a token that is not in the vocabulary");
    merges_.emplace(pair_key(ia->second, ib->second), Merge{rank++, ic->second});
  }
}

std::optional<int64_t> BpeModel::id_of(const std::string& token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::token_of(int64_t id) const {
  if (id < 0 || id >= size() || id_to_token_[static_cast<size_t>(id)].empty()) return nullptr;
  return &id_to_token_[static_cast<size_t>(id)];
}

void BpeModel::symbols_of(const std::string& piece, Symbols& sym) const {
  auto push = [&](int32_t id, size_t b, size_t e) {
    sym.ids.push_back(id);
    sym.begin.push_back(static_cast<uint32_t>(b));
    sym.end.push_back(static_cast<uint32_t>(e));
  };
  bool last_unk = false;
  for (size_t i = 0; i < piece.size();) {
    const size_t n =
        std::min(utf8_sequence_length(static_cast<unsigned char>(piece[i])), piece.size() - i);
    if (auto it = vocab_.find(piece.substr(i, n)); it != vocab_.end()) {
      push(it->second, i, i + n);
      last_unk = false;
      i += n;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (size_t k = 0; k < n; ++k)
        all = all && byte_ids_[static_cast<unsigned char>(piece[i + k])] >= 0;
      if (all) {
        for (size_t k = 0; k < n; ++k)
          push(byte_ids_[static_cast<unsigned char>(piece[i + k])], i + k, i + k + 1);
        last_unk = false;
        i += n;
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (fuse_unk_ && last_unk)
        sym.end.back() = static_cast<uint32_t>(i + n);  // the unknown run grows
      else
        push(unk_id_, i, i + n);
    }
    last_unk = unk_id_ >= 0;  // without an unknown token the character is dropped
    i += n;
  }
}

void BpeModel::merge(Symbols& sym) const {
  std::vector<int32_t>& ids = sym.ids;
  const int n = static_cast<int>(ids.size());
  if (n < 2 || merges_.empty()) return;
  std::vector<int> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    prev[static_cast<size_t>(i)] = i - 1;
    next[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;  // lowest rank, then leftmost
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int left) {
    if (left < 0) return;
    const int right = next[static_cast<size_t>(left)];
    if (right < 0) return;
    auto it =
        merges_.find(pair_key(ids[static_cast<size_t>(left)], ids[static_cast<size_t>(right)]));
    if (it != merges_.end()) heap.push({it->second.rank, left, it->second.id});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  std::vector<char> alive(static_cast<size_t>(n), 1);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const auto pos = static_cast<size_t>(c.pos);
    const int right = next[pos];
    if (!alive[pos] || right < 0) continue;
    // Stale: the pair at `pos` changed since this candidate was pushed.
    auto it = merges_.find(pair_key(ids[pos], ids[static_cast<size_t>(right)]));
    if (it == merges_.end() || it->second.id != c.id || it->second.rank != c.rank) continue;
    ids[pos] = c.id;
    sym.end[pos] = sym.end[static_cast<size_t>(right)];
    alive[static_cast<size_t>(right)] = 0;
    next[pos] = next[static_cast<size_t>(right)];
    if (next[pos] >= 0) prev[static_cast<size_t>(next[pos])] = c.pos;
    consider(prev[pos]);
    consider(c.pos);
  }
  size_t w = 0;
  for (int i = 0; i >= 0; i = next[static_cast<size_t>(i)], ++w) {
    ids[w] = ids[static_cast<size_t>(i)];
    sym.begin[w] = sym.begin[static_cast<size_t>(i)];
    sym.end[w] = sym.end[static_cast<size_t>(i)];
  }
  ids.resize(w);
  sym.begin.resize(w);
  sym.end.resize(w);
}

void BpeModel::encode(const std::string& piece, std::vector<int64_t>& out,
                      std::vector<std::pair<uint32_t, uint32_t>>* ranges) const {
  if (ignore_merges_)
    if (auto it = vocab_.find(piece); it != vocab_.end()) {
      out.push_back(it->second);
      if (ranges) ranges->emplace_back(0, static_cast<uint32_t>(piece.size()));
      return;
    }
  auto emit = [&](const Symbols& sym) {
    out.insert(out.end(), sym.ids.begin(), sym.ids.end());
    if (ranges)
      for (size_t k = 0; k < sym.ids.size(); ++k) ranges->emplace_back(sym.begin[k], sym.end[k]);
  };
  const bool cacheable = piece.size() <= 256;
  if (cacheable)
    if (auto c = cache_.find(piece); c != cache_.end()) return emit(c->second);
  Symbols sym;
  sym.ids.reserve(piece.size());
  symbols_of(piece, sym);
  merge(sym);
  emit(sym);
  if (cacheable && cache_.size() < 200000) cache_.emplace(piece, std::move(sym));
}

}  // namespace tightfit
