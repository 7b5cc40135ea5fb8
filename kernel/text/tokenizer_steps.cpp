#include "tokenizer_steps.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <iterator>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "tokenizer_spec.hpp"

namespace tightfit {
namespace tokenizer_spec {

std::unique_ptr<Pcre2Regex> pattern_of(const json& step, const std::string& source) {
  const json& p = step.at("pattern");
  if (p.contains("String"))
    return std::make_unique<Pcre2Regex>(p.at("String").get<std::string>(), source, true);
  if (p.contains("Regex"))
    return std::make_unique<Pcre2Regex>(p.at("Regex").get<std::string>(), source);
  throw std::invalid_argument(source + ": a pattern needs \"String\" or \"Regex\"");
}

std::string replace_all(const std::string& text, const Pcre2Regex& re, const std::string& with) {
  std::string out;
  size_t last = 0;
  for (const auto& [b, e] : re.find_all(text)) {
    out.append(text, last, b - last);
    out += with;
    last = e;
  }
  out.append(text, last, std::string::npos);
  return out;
}

Prepend prepend_scheme_of(const json& step, const std::string& source) {
  if (step.contains("prepend_scheme") && !step["prepend_scheme"].is_null()) {
    const std::string s = step["prepend_scheme"].get<std::string>();
    if (s == "always") return Prepend::kAlways;
    if (s == "first") return Prepend::kFirst;
    if (s == "never") return Prepend::kNever;
    throw std::invalid_argument(source + ": Metaspace prepend_scheme \"" + s + "\" is unknown");
  }
  return step.value("add_prefix_space", true) ? Prepend::kAlways : Prepend::kNever;
}

}  // namespace tokenizer_spec

using tokenizer_spec::flatten;
using tokenizer_spec::pattern_of;
using tokenizer_spec::Prepend;
using tokenizer_spec::prepend_scheme_of;
using tokenizer_spec::replace_all;

namespace {

using nlohmann::json;

std::string utf8(uint32_t cp) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  return std::string(reinterpret_cast<char*>(buf), static_cast<size_t>(n));
}

// Calls `each` on every step of `spec`, flattening "Sequence" (under `list_key`).
// The pattern of a Split/Replace: {"String": "..."} or {"Regex": "..."}.

// Builds a piece out of parts of another, carrying the offsets along.
class PieceBuilder {
 public:
  explicit PieceBuilder(const Piece& from) : from_(from) { out_.at_start = from.at_start; }
  // Bytes [b, e) of the source, as they are.
  void copy(size_t b, size_t e) {
    out_.text.append(from_.text, b, e - b);
    if (!from_.begin.empty()) {
      out_.begin.insert(out_.begin.end(), from_.begin.begin() + static_cast<long>(b),
                        from_.begin.begin() + static_cast<long>(e));
      out_.end.insert(out_.end.end(), from_.end.begin() + static_cast<long>(b),
                      from_.end.begin() + static_cast<long>(e));
    }
  }
  // New bytes standing for source bytes [b, e) (e > b).
  void put(const std::string& bytes, size_t b, size_t e) {
    out_.text += bytes;
    if (!from_.begin.empty()) {
      out_.begin.insert(out_.begin.end(), bytes.size(), from_.begin[b]);
      out_.end.insert(out_.end.end(), bytes.size(), from_.end[e - 1]);
    }
  }
  Piece take() { return std::move(out_); }

 private:
  const Piece& from_;
  Piece out_;
};

// `max_bytes`: the most the result may hold, checked before it is built
// (a one-byte pattern replaced by a megabyte would otherwise ask for
// terabytes); past it, std::runtime_error saying how much it would be.
Piece replace_all(const Piece& p, const Pcre2Regex& re, const std::string& with, size_t max_bytes) {
  const auto matches = re.find_all(p.text);
  size_t removed = 0;
  for (const auto& [mb, me] : matches) removed += me - mb;
  const double would_be = static_cast<double>(p.text.size() - removed) +
                          static_cast<double>(matches.size()) * static_cast<double>(with.size());
  if (would_be > static_cast<double>(max_bytes))
    throw std::runtime_error("would make " + std::to_string(static_cast<uint64_t>(would_be)) +
                             " bytes");
  PieceBuilder b(p);
  size_t last = 0;
  for (const auto& [mb, me] : matches) {
    b.copy(last, mb);
    b.put(with, mb, me);
    last = me;
  }
  b.copy(last, p.text.size());
  return b.take();
}

bool is_whitespace(utf8proc_int32_t cp) {
  if (cp == '\t' || cp == '\n' || cp == 0x0B || cp == '\f' || cp == '\r' || cp == 0x85) return true;
  const auto cat = utf8proc_category(cp);
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

// Calls f(code point, byte offset, byte length) for each character of `s`.
template <typename F>
void for_each_char(const std::string& s, F&& f) {
  for (size_t i = 0; i < s.size();) {
    utf8proc_int32_t cp = -1;
    auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                              static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) n = 1, cp = -1;  // a stray byte
    f(cp, i, static_cast<size_t>(n));
    i += static_cast<size_t>(n);
  }
}

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

SplitBehavior behavior_of(const json& step, const std::string& source) {
  const std::string b = step.value("behavior", std::string("Isolated"));
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  throw std::invalid_argument(source + ": Split behavior \"" + b + "\" is unknown");
}

// Splits `p` at the matches of `re` as `how` says, appending to `out`.
void split_piece(const Piece& p, const Pcre2Regex& re, SplitBehavior how, std::vector<Piece>& out) {
  auto matches = re.find_all(p.text);
  if (how == SplitBehavior::kContiguous) {  // runs of adjacent matches are one
    std::vector<std::pair<size_t, size_t>> merged;
    for (const auto& m : matches)
      if (!merged.empty() && merged.back().second == m.first)
        merged.back().second = m.second;
      else
        merged.push_back(m);
    matches = std::move(merged);
    how = SplitBehavior::kIsolated;
  }
  auto push = [&](size_t b, size_t e) {
    if (e > b) out.push_back(p.slice(b, e));
  };
  size_t last = 0;
  for (const auto& [b, e] : matches) {
    switch (how) {
      case SplitBehavior::kIsolated:
        push(last, b);
        push(b, e);
        last = e;
        break;
      case SplitBehavior::kRemoved:
        push(last, b);
        last = e;
        break;
      case SplitBehavior::kMergedWithPrevious:
        push(last, e);
        last = e;
        break;
      case SplitBehavior::kMergedWithNext:
        push(last, b);
        last = b;
        break;
      case SplitBehavior::kContiguous:
        break;
    }
  }
  push(last, p.text.size());
}

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

// ---------------------------------------------------------------------------
Piece Piece::tracked_from(std::string text, uint32_t offset, bool at_start) {
  Piece p;
  p.at_start = at_start;
  p.begin.resize(text.size());
  p.end.resize(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    p.begin[i] = offset + static_cast<uint32_t>(i);
    p.end[i] = offset + static_cast<uint32_t>(i) + 1;
  }
  p.text = std::move(text);
  return p;
}

Piece Piece::slice(size_t b, size_t e) const {
  Piece p;
  p.text = text.substr(b, e - b);
  p.at_start = at_start && b == 0;
  if (!begin.empty()) {
    p.begin.assign(begin.begin() + static_cast<long>(b), begin.begin() + static_cast<long>(e));
    p.end.assign(end.begin() + static_cast<long>(b), end.begin() + static_cast<long>(e));
  }
  return p;
}

// ---------------------------------------------------------------------------
ByteLevelAlphabet::ByteLevelAlphabet() {
  std::fill(std::begin(byte_of_code_point), std::end(byte_of_code_point), int16_t{-1});
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable =
        (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const int cp = printable ? b : 256 + n++;
    byte_to_char[b] = utf8(static_cast<uint32_t>(cp));
    byte_of_code_point[cp] = static_cast<int16_t>(b);
  }
}

std::string ByteLevelAlphabet::encode(const std::string& bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += byte_to_char[b];
  return out;
}

void ByteLevelAlphabet::decode(const std::string& symbols, std::string& out) const {
  for_each_char(symbols, [&](utf8proc_int32_t cp, size_t at, size_t n) {
    if (cp >= 0 && cp < 324 && byte_of_code_point[cp] >= 0)
      out += static_cast<char>(byte_of_code_point[cp]);
    else
      out.append(symbols, at, n);
  });
}

// ---------------------------------------------------------------------------
struct Normalizer::Step {
  std::string type;
  std::string text;  // Prepend: the prefix; Replace: the content
  std::unique_ptr<Pcre2Regex> pattern;
  bool left = false, right = false;  // Strip
};

Normalizer::~Normalizer() = default;

Normalizer::Normalizer(const json& spec, const std::string& source) : source_(source) {
  if (spec.is_null()) return;
  flatten(spec, source, "normalizer", "normalizers", [&](const std::string& type, const json& j) {
    auto step = std::make_unique<Step>();
    step->type = type;
    if (type == "Prepend") {
      step->text = j.at("prepend").get<std::string>();
    } else if (type == "Replace") {
      step->pattern = pattern_of(j, source);
      step->text = j.at("content").get<std::string>();
    } else if (type == "Strip") {
      step->left = j.value("strip_left", false);
      step->right = j.value("strip_right", false);
    } else if (type != "NFC" && type != "NFD" && type != "NFKC" && type != "NFKD" &&
               type != "Lowercase") {
      throw std::invalid_argument(source + ": normalizer \"" + type +
                                  "\" is not supported (NFC, NFD, NFKC, NFKD, Lowercase, "
                                  "Prepend, Replace, Strip, Sequence)");
    }
    steps_.push_back(std::move(step));
  });
}

std::string Normalizer::apply(const std::string& in) const {
  Piece p;
  p.text = in;
  apply(p);
  return std::move(p.text);
}

namespace {
// Applies `map` (text of a run -> new text) to each character, or each run of
// a character and its combining marks when `clusters` (normal forms compose
// within such runs), keeping offsets.
template <typename Map>
Piece map_chars(const Piece& p, bool clusters, Map&& map) {
  PieceBuilder b(p);
  size_t run = 0;
  for_each_char(p.text, [&](utf8proc_int32_t cp, size_t at, size_t n) {
    const bool combining = clusters && cp >= 0 && utf8proc_get_property(cp)->combining_class != 0;
    if (at > run && !combining) {
      b.put(map(p.text.substr(run, at - run)), run, at);
      run = at;
    }
    (void)n;
  });
  if (run < p.text.size()) b.put(map(p.text.substr(run)), run, p.text.size());
  return b.take();
}
}  // namespace

void Normalizer::apply(Piece& p) const {
  const size_t limit = kMaxGrowth * p.text.size() + kSlackBytes;
  auto too_big = [&](const std::string& step, const std::string& what) {
    return std::runtime_error(source_ + ": normalizer step " + step + " " + what + " from " +
                              std::to_string(p.text.size()) + " bytes of text, past the bound of " +
                              std::to_string(kMaxGrowth) + " x the text + " +
                              std::to_string(kSlackBytes) +
                              " bytes: this normalizer does not normalize, it inflates");
  };
  for (const auto& step : steps_) {
    const std::string& t = step->type;
    if (p.text.size() > limit)
      throw too_big(t, "grew the text to " + std::to_string(p.text.size()));
    if (t == "Prepend") {
      if (p.text.empty()) continue;
      PieceBuilder b(p);
      b.put(step->text, 0, 1);  // the marker stands for the first byte
      b.copy(0, p.text.size());
      p = b.take();
    } else if (t == "Replace") {
      try {
        p = replace_all(p, *step->pattern, step->text, limit);
      } catch (const std::runtime_error& e) {
        if (std::string(e.what()).rfind("would make", 0) != 0) throw;  // the regex's own error
        throw too_big("Replace", e.what());
      }
    } else if (t == "Strip") {
      size_t begin = 0, end = p.text.size();
      bool leading = true;
      for_each_char(p.text, [&](utf8proc_int32_t cp, size_t at, size_t n) {
        const bool ws = cp >= 0 && is_whitespace(cp);
        if (leading && ws && step->left) begin = at + n;
        if (!ws) leading = false, end = at + n;
        if (ws && !step->right) end = at + n;
      });
      p = begin >= end ? p.slice(0, 0) : p.slice(begin, end);
    } else if (t == "Lowercase") {
      p = map_chars(p, false, [](const std::string& ch) {
        utf8proc_int32_t cp = -1;
        utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(ch.data()),
                         static_cast<utf8proc_ssize_t>(ch.size()), &cp);
        return cp < 0 ? ch : utf8(static_cast<uint32_t>(utf8proc_tolower(cp)));
      });
    } else {  // a Unicode normal form, a character and its combining marks at a time
      int options = UTF8PROC_STABLE;
      options |= (t == "NFC" || t == "NFKC") ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
      if (t == "NFKC" || t == "NFKD") options |= UTF8PROC_COMPAT;
      p = map_chars(p, true, [&](const std::string& run) {
        utf8proc_uint8_t* out = nullptr;
        const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                                    static_cast<utf8proc_ssize_t>(run.size()), &out,
                                    static_cast<utf8proc_option_t>(options));
        if (n < 0) return run;  // a stray byte stays as it is
        std::string s(reinterpret_cast<char*>(out), static_cast<size_t>(n));
        free(out);
        return s;
      });
    }
  }
  if (p.text.size() > limit)
    throw too_big(steps_.back()->type, "grew the text to " + std::to_string(p.text.size()));
}

// ---------------------------------------------------------------------------
struct PreTokenizer::Step {
  std::string type;
  std::unique_ptr<Pcre2Regex> pattern;  // Split, Digits; ByteLevel's regex when used
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool add_prefix_space = false;  // ByteLevel
  std::string replacement;        // Metaspace
  Prepend prepend = Prepend::kAlways;
  bool split = true;
  std::unique_ptr<Pcre2Regex> replacement_re;
  std::unique_ptr<Pcre2Regex> space_re;
  std::shared_ptr<ByteLevelAlphabet> alphabet;
};

PreTokenizer::~PreTokenizer() = default;

PreTokenizer::PreTokenizer(const json& spec, const std::string& source) : source_(source) {
  if (spec.is_null()) return;
  flatten(
      spec, source, "pre-tokenizer", "pretokenizers", [&](const std::string& type, const json& j) {
        auto step = std::make_unique<Step>();
        step->type = type;
        if (type == "Split") {
          if (j.value("invert", false))
            throw std::invalid_argument(source + ": Split with \"invert\": true is not supported");
          step->pattern = pattern_of(j, source);
          step->behavior = behavior_of(j, source);
        } else if (type == "ByteLevel") {
          step->add_prefix_space = j.value("add_prefix_space", false);
          if (j.value("use_regex", true))
            step->pattern = std::make_unique<Pcre2Regex>(kGpt2Pattern, source);
          step->alphabet = std::make_shared<ByteLevelAlphabet>();
          byte_level_ = true;
        } else if (type == "Metaspace") {
          step->replacement = j.value("replacement", std::string("\xE2\x96\x81"));
          step->prepend = prepend_scheme_of(j, source);
          step->split = j.value("split", true);
          step->replacement_re = std::make_unique<Pcre2Regex>(step->replacement, source, true);
          step->space_re = std::make_unique<Pcre2Regex>(" ", source, true);
        } else if (type == "Digits") {
          step->pattern = std::make_unique<Pcre2Regex>(R"(\p{N})", source);
          step->behavior = j.value("individual_digits", false) ? SplitBehavior::kIsolated
                                                               : SplitBehavior::kContiguous;
        } else {
          throw std::invalid_argument(source + ": pre-tokenizer \"" + type +
                                      "\" is not supported (Split, ByteLevel, Metaspace, Digits, "
                                      "Sequence)");
        }
        steps_.push_back(std::move(step));
      });
}

void PreTokenizer::apply(std::vector<Piece>& pieces) const {
  for (const auto& step : steps_) {
    std::vector<Piece> next;
    next.reserve(pieces.size());
    for (Piece& p : pieces) {
      if (step->type == "ByteLevel") {
        if (step->add_prefix_space && !p.text.empty() && p.text[0] != ' ') {
          PieceBuilder b(p);
          b.put(" ", 0, 1);
          b.copy(0, p.text.size());
          p = b.take();
        }
        std::vector<Piece> parts;
        if (step->pattern)
          split_piece(p, *step->pattern, SplitBehavior::kIsolated, parts);
        else
          parts.push_back(std::move(p));
        for (Piece& q : parts) {  // every byte becomes a printable character
          PieceBuilder b(q);
          for (size_t i = 0; i < q.text.size(); ++i)
            b.put(step->alphabet->byte_to_char[static_cast<unsigned char>(q.text[i])], i, i + 1);
          next.push_back(b.take());
        }
      } else if (step->type == "Metaspace") {
        // The replacement comes from the file: bounded as a normalizer's is.
        try {
          p = replace_all(p, *step->space_re, step->replacement,
                          Normalizer::kMaxGrowth * p.text.size() + Normalizer::kSlackBytes);
        } catch (const std::runtime_error& e) {
          throw std::runtime_error(
              source_ + ": pre-tokenizer Metaspace's replacement " + e.what() + " from " +
              std::to_string(p.text.size()) + " bytes of text, past " +
              std::to_string(Normalizer::kMaxGrowth) + " x the text: it inflates the text");
        }
        const bool starts = p.text.compare(0, step->replacement.size(), step->replacement) == 0;
        if (!p.text.empty() && !starts &&
            (step->prepend == Prepend::kAlways ||
             (step->prepend == Prepend::kFirst && p.at_start))) {
          PieceBuilder b(p);
          b.put(step->replacement, 0, 1);
          b.copy(0, p.text.size());
          p = b.take();
        }
        if (step->split)
          split_piece(p, *step->replacement_re, SplitBehavior::kMergedWithNext, next);
        else if (!p.text.empty())
          next.push_back(std::move(p));
      } else {  // Split, Digits
        split_piece(p, *step->pattern, step->behavior, next);
      }
    }
    pieces = std::move(next);
  }
}

}  // namespace tightfit
