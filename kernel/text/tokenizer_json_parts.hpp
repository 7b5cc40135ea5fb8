// Pieces of a tokenizer.json that the converters (a folder's vocab.json +
// merges.txt or tokenizer.model, a GGUF file's tokenizer) build alike.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace tightfit::tokenizer_json {
using nlohmann::json;

inline json special_token_entry(const std::string& content, int64_t id) {
  return {{"id", content}, {"ids", {id}}, {"tokens", {content}}};
}

// TemplateProcessing of a single sequence: [bos] $A [eos].
inline json template_processing(const std::string* bos, int64_t bos_id, const std::string* eos,
                                int64_t eos_id) {
  json single = json::array(), specials = json::object();
  if (bos) {
    single.push_back({{"SpecialToken", {{"id", *bos}, {"type_id", 0}}}});
    specials[*bos] = special_token_entry(*bos, bos_id);
  }
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (eos) {
    single.push_back({{"SpecialToken", {{"id", *eos}, {"type_id", 0}}}});
    specials[*eos] = special_token_entry(*eos, eos_id);
  }
  return {{"type", "TemplateProcessing"},
          {"single", single},
          {"pair", json::array()},
          {"special_tokens", specials}};
}

inline json byte_level(bool add_prefix_space, bool use_regex = true) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", add_prefix_space},
          {"trim_offsets", true},
          {"use_regex", use_regex}};
}

// A byte-level BPE model over `vocab` and `merges` (no unknown token, no
// byte fallback: every byte is a token of the ByteLevel alphabet).
inline json byte_level_bpe_model(json vocab, json merges, bool ignore_merges = false) {
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"ignore_merges", ignore_merges},
          {"vocab", std::move(vocab)},
          {"merges", std::move(merges)}};
}

// A Split pre-tokenizer that keeps each match of `regex` as its own piece.
inline json split_isolated(const std::string& regex) {
  return {{"type", "Split"},
          {"pattern", {{"Regex", regex}}},
          {"behavior", "Isolated"},
          {"invert", false}};
}

// The split regexes of the model families' tokenizer.json files.
inline constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace tightfit::tokenizer_json
