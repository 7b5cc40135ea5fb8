#include "sentencepiece_convert.hpp"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "utf8.hpp"

namespace tightfit {
using nlohmann::json;

namespace {

// A SentencePiece piece is at most max_sentencepiece_length (16 by default)
// characters; converting one costs its length squared.
constexpr size_t kMaxPieceBytes = 1024;
const char* const kSpace = "\u2581";  // SentencePiece's space

}  // namespace

json sentencepiece_bpe_tokenizer(const SentencePieceModel& m, const std::string& source,
                                 bool legacy, bool prefix) {
  if (m.algorithm != SentencePieceModel::Algorithm::kBpe)
    throw std::invalid_argument(
        source + " is a SentencePiece " + SentencePieceModel::name(m.algorithm) +
        " model; tightfit reads SentencePiece BPE models only (Unigram tokenizers are not "
        "supported): use a model whose folder has a tokenizer.json with a BPE model");
  // LlamaConverter.vocab: the first three pieces with score 0.
  std::vector<std::pair<std::string, float>> scores;
  std::unordered_map<std::string, int64_t> index;  // the sentencepiece vocabulary (piece -> id)
  json vocab = json::object();
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const std::string& p = m.pieces[i].piece;
    if (p.size() > kMaxPieceBytes)
      throw std::invalid_argument(source + ": piece " + std::to_string(i) + " is " +
                                  std::to_string(p.size()) + " bytes long (real ones are under " +
                                  std::to_string(kMaxPieceBytes) + ")");
    scores.emplace_back(p, i < 3 ? 0.0f : m.pieces[i].score);
    index.emplace(p, static_cast<int64_t>(i));
    vocab[p] = static_cast<int64_t>(i);
  }
  // generate_merges: every split of every piece into two known pieces, each
  // piece's splits by (left id, right id), then all of them by score (high
  // first), left length and right length (longer first), stably.
  struct Merge {
    std::string left, right;
    float score;
    size_t left_chars, right_chars;
  };
  std::vector<Merge> merges;
  std::unordered_set<std::string> done;  // dict(vocab_scores): a repeated piece counts once
  for (const auto& [piece, score] : scores) {
    if (!done.insert(piece).second) continue;
    const std::vector<size_t> cp = utf8_code_point_starts(piece);
    std::vector<Merge> local;
    for (size_t k = 1; k + 1 < cp.size(); ++k) {
      std::string l = piece.substr(0, cp[k]), r = piece.substr(cp[k]);
      if (index.count(l) && index.count(r))
        local.push_back({std::move(l), std::move(r), score, k, cp.size() - 1 - k});
    }
    std::stable_sort(local.begin(), local.end(), [&](const Merge& a, const Merge& b) {
      const int64_t al = index.at(a.left), bl = index.at(b.left);
      return al != bl ? al < bl : index.at(a.right) < index.at(b.right);
    });
    for (Merge& x : local) merges.push_back(std::move(x));
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.left_chars != b.left_chars) return a.left_chars > b.left_chars;
    return a.right_chars > b.right_chars;
  });
  json merge_list = json::array();
  for (const Merge& x : merges) merge_list.push_back({x.left, x.right});
  json model = {{"type", "BPE"},        {"vocab", vocab},
                {"merges", merge_list}, {"unk_token", m.unk_piece},
                {"fuse_unk", true},     {"byte_fallback", true},
                {"dropout", nullptr}};
  json t = {{"model", model}, {"post_processor", nullptr}};
  // Control pieces are special added tokens, user-defined ones plain added tokens.
  json added = json::array();
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const auto type = m.pieces[i].type;
    if (type != SentencePieceModel::Type::kControl &&
        type != SentencePieceModel::Type::kUserDefined)
      continue;
    const bool special = type == SentencePieceModel::Type::kControl;
    added.push_back({{"id", static_cast<int64_t>(i)},
                     {"content", m.pieces[i].piece},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", special}});
  }
  t["added_tokens"] = added;
  if (legacy) {
    json steps = json::array();
    if (prefix) steps.push_back({{"type", "Prepend"}, {"prepend", kSpace}});
    steps.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}});
    t["normalizer"] = {{"type", "Sequence"}, {"normalizers", steps}};
  } else {
    t["pre_tokenizer"] = {{"type", "Metaspace"},
                          {"replacement", kSpace},
                          {"prepend_scheme", prefix ? "first" : "never"},
                          {"split", false}};
  }
  json decoders = {{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                   {{"type", "ByteFallback"}},
                   {{"type", "Fuse"}}};
  if (prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  t["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  return t;
}

}  // namespace tightfit
