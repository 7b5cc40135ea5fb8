// The decoder of a tokenizer.json: token strings back into text.
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "tokenizer_spec.hpp"
#include "tokenizer_steps.hpp"
#include "utf8.hpp"

namespace tightfit {

using nlohmann::json;
using tokenizer_spec::flatten;
using tokenizer_spec::pattern_of;
using tokenizer_spec::Prepend;
using tokenizer_spec::prepend_scheme_of;
using tokenizer_spec::replace_all;

struct Decoder::Step {
  std::string type;
  std::unique_ptr<Pcre2Regex> pattern;  // Replace
  std::string content;                  // Replace, Strip, Metaspace's replacement
  int64_t start = 0, stop = 0;          // Strip
  Prepend prepend = Prepend::kAlways;   // Metaspace
  std::shared_ptr<ByteLevelAlphabet> alphabet;
};

Decoder::~Decoder() = default;

Decoder::Decoder(const json& spec, const std::string& source) {
  if (spec.is_null()) return;
  present_ = true;
  flatten(spec, source, "decoder", "decoders", [&](const std::string& type, const json& j) {
    auto step = std::make_unique<Step>();
    step->type = type;
    if (type == "Replace") {
      step->pattern = pattern_of(j, source);
      step->content = j.at("content").get<std::string>();
    } else if (type == "Strip") {
      step->content = j.at("content").get<std::string>();
      step->start = j.value("start", int64_t{0});
      step->stop = j.value("stop", int64_t{0});
    } else if (type == "Metaspace") {
      step->content = j.value("replacement", std::string("\xE2\x96\x81"));
      step->prepend = prepend_scheme_of(j, source);
    } else if (type == "ByteLevel") {
      step->alphabet = std::make_shared<ByteLevelAlphabet>();
    } else if (type != "ByteFallback" && type != "Fuse") {
      throw std::invalid_argument(source + ": decoder \"" + type +
                                  "\" is not supported (ByteLevel, Metaspace, Replace, "
                                  "ByteFallback, Fuse, Strip, Sequence)");
    }
    steps_.push_back(std::move(step));
  });
}

namespace {
int byte_token(const std::string& t) {  // <0xAB> -> 0xAB, else -1
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = t[static_cast<size_t>(i)];
    v = v * 16 + (c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -100);
  }
  return v >= 0 ? v : -1;
}
}  // namespace

std::string Decoder::apply(std::vector<std::string> tokens) const {
  if (!present_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const auto& step : steps_) {
    const std::string& t = step->type;
    if (t == "ByteLevel") {
      std::string bytes;
      for (const auto& tok : tokens) step->alphabet->decode(tok, bytes);
      tokens = {utf8_lossy(bytes)};  // as tokenizers' from_utf8_lossy
    } else if (t == "Fuse") {
      std::string all;
      for (const auto& tok : tokens) all += tok;
      tokens = {all};
    } else if (t == "Replace") {
      for (auto& tok : tokens) tok = replace_all(tok, *step->pattern, step->content);
    } else if (t == "Strip") {
      for (auto& tok : tokens) {
        int64_t n = 0;
        while (n < step->start && tok.compare(0, step->content.size(), step->content) == 0 &&
               !step->content.empty())
          tok.erase(0, step->content.size()), ++n;
        n = 0;
        while (n < step->stop && tok.size() >= step->content.size() && !step->content.empty() &&
               tok.compare(tok.size() - step->content.size(), step->content.size(),
                           step->content) == 0)
          tok.erase(tok.size() - step->content.size()), ++n;
      }
    } else if (t == "Metaspace") {
      for (size_t i = 0; i < tokens.size(); ++i) {
        std::string& tok = tokens[i];
        std::string out;
        for (size_t at = 0; at < tok.size();) {
          if (tok.compare(at, step->content.size(), step->content) == 0 && !step->content.empty()) {
            out += ' ';
            at += step->content.size();
          } else {
            out += tok[at++];
          }
        }
        if (i == 0 && step->prepend != Prepend::kNever && !out.empty() && out[0] == ' ')
          out.erase(0, 1);
        tok = std::move(out);
      }
    } else if (t == "ByteFallback") {
      // A run of byte tokens is its text when it is well-formed UTF-8, else
      // one U+FFFD per byte (as tokenizers' ByteFallback decoder).
      std::vector<std::string> out;
      std::string pending;
      auto flush = [&] {
        if (pending.empty()) return;
        if (first_invalid_utf8(pending) == std::string::npos) {
          out.push_back(std::move(pending));
        } else {
          for (size_t k = 0; k < pending.size(); ++k) out.push_back("\xEF\xBF\xBD");
        }
        pending.clear();
      };
      for (const auto& tok : tokens) {
        const int b = byte_token(tok);
        if (b >= 0) {
          pending += static_cast<char>(b);
          continue;
        }
        flush();
        out.push_back(tok);
      }
      flush();
      tokens = std::move(out);
    }
  }
  std::string out;
  for (const auto& tok : tokens) out += tok;
  return out;
}

}  // namespace tightfit
