// Instruction and chat rows to token ids and a loss mask (chat_data): the
// input's first line is one JSONL row, the rest the chat template. Every row
// form goes through the same formatter training uses, with the byte
// tokenizer (its offsets are exact), training on completions (the turn
// finding and the mask) or on all tokens by the row's length. A bad row or
// template must be refused with std::invalid_argument (naming the row) or
// std::runtime_error; an example must have one mask entry per id; nothing
// else may escape, nothing may crash, and every row ends within the
// interpreter's budget (fuzz/run gives each input a time limit). A row with
// "chosen" and "rejected" goes through the preference formatter too (the
// prompt extraction, continued assistant messages, the length cuts), and
// one with "completion" and "label" through KTO's (its cuts, and a KL row
// of its prompt with its own answer: never past max_length, + 1 for the BOS
// of an empty prompt as in TRL).
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "chat_data.hpp"
#include "data.hpp"
#include "expand_input.hpp"
#include "kto_data.hpp"
#include "preference_data.hpp"

namespace {

// The byte tokenizer with an EOS id, which preference completions end with.
class ByteTokenizerWithEos final : public tightfit::Tokenizer {
 public:
  int64_t vocab_size() const override { return 256; }
  std::vector<int64_t> encode(const std::string& text) const override {
    return bytes_.encode(text);
  }
  std::string decode(const std::vector<int64_t>& ids) const override { return bytes_.decode(ids); }
  std::vector<int64_t> encode_with_offsets(
      const std::string& text, std::vector<std::pair<size_t, size_t>>& offsets) const override {
    return bytes_.encode_with_offsets(text, offsets);
  }
  int64_t token_id(const std::string& token) const override { return token == "</s>" ? 0 : -1; }

 private:
  tightfit::ByteTokenizer bytes_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string all = expand_input(data, size);
  const size_t nl = all.find('\n');
  const std::string row_text = nl == std::string::npos ? all : all.substr(0, nl);
  const std::string source = nl == std::string::npos ? std::string() : all.substr(nl + 1);
  using ojson = nlohmann::ordered_json;
  const ojson row = ojson::parse(row_text, nullptr, /*allow_exceptions=*/false);
  if (row.is_discarded()) return 0;
  static const ByteTokenizerWithEos tokenizer;
  tightfit::TokenizerConfig config;
  config.bos_token = "<s>";
  config.eos_token = "</s>";
  config.chat_template = source;
  config.source = "fuzz/tokenizer_config.json";
  try {
    const tightfit::ChatFormatter formatter(
        tokenizer, config, size % 2 ? tightfit::TrainOn::kAll : tightfit::TrainOn::kCompletion);
    if (tightfit::is_preference_row(row)) {
      tightfit::PreferenceOptions options;
      options.max_prompt_length = static_cast<int64_t>(size % 7) * 4;
      options.max_completion_length = static_cast<int64_t>(size % 5) * 3;
      options.max_length = static_cast<int64_t>(size % 11) * 5;
      options.keep_end = size % 3 != 0;
      const tightfit::PreferenceFormatter preferences(formatter, options);
      const tightfit::PreferencePair p = preferences.format(row, "fuzz/rows.jsonl:1");
      for (const auto* completion : {&p.chosen, &p.rejected}) {
        const tightfit::Example e = tightfit::preference_sequence(p.prompt, *completion, options);
        if (e.ids.size() != e.trained.size()) std::abort();
        if (options.max_length > 0 && static_cast<int64_t>(e.ids.size()) > options.max_length)
          std::abort();
      }
      return 0;
    }
    if (tightfit::is_unpaired_preference_row(row)) {
      tightfit::PreferenceOptions options;
      options.unpaired = true;
      options.max_length = 2 + static_cast<int64_t>(size % 11) * 5;
      options.max_prompt_length = static_cast<int64_t>(size % 7) % options.max_length;
      options.keep_end = size % 3 != 0;
      const tightfit::KtoFormatter kto(formatter, options);
      const tightfit::KtoRow r = kto.format(row, "fuzz/rows.jsonl:1");
      const std::vector<tightfit::Example> units = tightfit::kto_units({&r}, 1, kto);
      for (const tightfit::Example& e : units) {
        if (e.ids.size() != e.trained.size()) std::abort();
        // (An empty prompt spends none of max_length on its BOS, as in TRL.)
        if (static_cast<int64_t>(e.ids.size()) > options.max_length + 1) std::abort();
      }
      return 0;
    }
    const tightfit::Example e = formatter.format(row, "fuzz/rows.jsonl:1");
    if (e.ids.size() != e.trained.size()) std::abort();
  } catch (const std::invalid_argument&) {
  } catch (const std::runtime_error&) {
  }
  return 0;
}
