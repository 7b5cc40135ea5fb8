// Instruction and chat rows to token ids and a loss mask (chat_data): the
// input's first line is one JSONL row, the rest the chat template. Every row
// form goes through the same formatter training uses, with the byte
// tokenizer (its offsets are exact), training on completions (the turn
// finding and the mask) or on all tokens by the row's length. A bad row or
// template must be refused with std::invalid_argument (naming the row) or
// std::runtime_error; an example must have one mask entry per id; nothing
// else may escape, nothing may crash, and every row ends within the
// interpreter's budget (fuzz/run gives each input a time limit).
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "chat_data.hpp"
#include "data.hpp"
#include "expand_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string all = expand_input(data, size);
  const size_t nl = all.find('\n');
  const std::string row_text = nl == std::string::npos ? all : all.substr(0, nl);
  const std::string source = nl == std::string::npos ? std::string() : all.substr(nl + 1);
  using ojson = nlohmann::ordered_json;
  const ojson row = ojson::parse(row_text, nullptr, /*allow_exceptions=*/false);
  if (row.is_discarded()) return 0;
  static const tightfit::ByteTokenizer tokenizer;
  tightfit::TokenizerConfig config;
  config.bos_token = "<s>";
  config.eos_token = "</s>";
  config.chat_template = source;
  config.source = "fuzz/tokenizer_config.json";
  try {
    const tightfit::ChatFormatter formatter(
        tokenizer, config, size % 2 ? tightfit::TrainOn::kAll : tightfit::TrainOn::kCompletion);
    const tightfit::Example e = formatter.format(row, "fuzz/rows.jsonl:1");
    if (e.ids.size() != e.trained.size()) std::abort();
  } catch (const std::invalid_argument&) {
  } catch (const std::runtime_error&) {
  }
  return 0;
}
