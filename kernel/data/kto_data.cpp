#include "kto_data.hpp"

#include <algorithm>
#include <stdexcept>

#include "jsonl_rows.hpp"

namespace tightfit {
using ojson = nlohmann::ordered_json;

namespace {

// datasets.map's default batch size: unpair_preference_dataset's blocks.
constexpr size_t kUnpairBlock = 1000;

}  // namespace

bool is_unpaired_preference_row(const ojson& row) {
  return row.is_object() && row.contains("completion") && row.contains("label");
}

KtoFormatter::KtoFormatter(const ChatFormatter& chat, PreferenceOptions options)
    : chat_(chat), options_(options) {
  const PreferenceSpecialTokens special(chat_);
  eos_id_ = special.eos;
  bos_id_ = special.bos;
}

Example KtoFormatter::process(std::vector<int64_t> prompt, std::vector<int64_t> answer,
                              const std::string& where, std::vector<int64_t>* prompt_out) const {
  // The BOS and EOS still to add are budgeted out of max_length first (a
  // tokenizer without BOS still spends one, as TRL compares None with the
  // first id).
  int64_t max_length = options_.max_length;
  const int64_t max_prompt = options_.max_prompt_length;
  if (!prompt.empty() && (bos_id_ < 0 || prompt.front() != bos_id_)) --max_length;
  if (!answer.empty() && answer.back() != eos_id_) --max_length;
  auto too_long = [&] { return static_cast<int64_t>(prompt.size() + answer.size()) > max_length; };
  if (too_long() && max_prompt > 0 && static_cast<int64_t>(prompt.size()) > max_prompt) {
    const auto keep = static_cast<long>(max_prompt);
    if (options_.keep_end)
      prompt.erase(prompt.begin(), prompt.end() - keep);
    else
      prompt.resize(static_cast<size_t>(keep));
  }
  if (too_long()) {
    // TRL cuts the answer to max_length - max_prompt_length; below 0 its
    // slice would drop the answer's end instead (or fail on None).
    if (max_prompt <= 0 || max_length - max_prompt < 0)
      throw std::invalid_argument(
          where + ": prompt + completion make " + std::to_string(prompt.size() + answer.size()) +
          " tokens, over max_length = " + std::to_string(options_.max_length) +
          " with BOS and EOS, and max_prompt_length = " + std::to_string(max_prompt) +
          " leaves the completion no room: set [data] max_prompt_length below max_length - 1");
    answer.resize(std::min(answer.size(), static_cast<size_t>(max_length - max_prompt)));
  }
  const bool add_eos = answer.empty() || answer.back() != eos_id_;
  if (bos_id_ >= 0 && (prompt.empty() || prompt.front() != bos_id_))
    prompt.insert(prompt.begin(), bos_id_);
  Example e;
  e.ids = prompt;
  e.ids.insert(e.ids.end(), answer.begin(), answer.end());
  if (add_eos) e.ids.push_back(eos_id_);
  e.trained.assign(prompt.size(), 0);
  e.trained.resize(e.ids.size(), 1);
  if (prompt_out) *prompt_out = std::move(prompt);
  return e;
}

KtoRow KtoFormatter::format(const ojson& row, const std::string& where) const {
  if (!row.is_object()) throw std::invalid_argument(where + ": a row must be a JSON object");
  if (!row.contains("prompt") || !is_unpaired_preference_row(row))
    throw std::invalid_argument(where +
                                ": an unpaired preference row needs \"prompt\", \"completion\" "
                                "and \"label\" (true: a desirable completion, false: not)");
  check_preference_row_keys(row, where);
  if (!row["label"].is_boolean())
    throw std::invalid_argument(where + ": \"label\" must be true (desirable) or false, not " +
                                row["label"].dump());
  if (conversational(row["prompt"]) != conversational(row["completion"]))
    throw std::invalid_argument(where +
                                ": \"prompt\" and \"completion\" must both be text or both be "
                                "lists of messages");
  if (eos_id_ < 0)
    throw std::invalid_argument(
        where + ": each completion ends with the tokenizer's EOS, and " +
        (chat_.config().source.empty() ? std::string("the tokenizer") : chat_.config().source) +
        " names none (eos_token): give a tokenizer that has one");
  const ojson& completion = row["completion"];
  const PromptTexts texts =
      render_preference_texts(chat_, row["prompt"], {{&completion, "completion"}}, where);
  // _tokenize: the prompt alone, and prompt + completion split where it ends.
  const Tokenizer& tok = chat_.tokenizer();
  JointSide side = split_prompt_answer(tok, texts.prompt, tok.encode(texts.prompt),
                                       texts.completions[0], where, "completion");
  KtoRow out;
  out.where = where;
  out.answer = side.answer;
  out.completion = process(std::move(side.prompt), std::move(side.answer), where, &out.prompt);
  out.completion.desirable = row["label"].get<bool>() ? 1 : 0;
  return out;
}

std::vector<KtoRow> load_kto_rows(const std::string& spec, const KtoFormatter& formatter,
                                  const std::string& base_dir) {
  std::vector<KtoRow> out;
  // Pairs are unpaired a block at a time: the block's chosen answers, then
  // its rejected ones (each with the row's place for errors).
  struct Half {
    ojson row;
    std::string where;
  };
  std::vector<Half> chosen, rejected;
  bool paired = false, first = true;
  auto flush = [&] {
    for (auto* half : {&chosen, &rejected})
      for (const Half& h : *half) out.push_back(formatter.format(h.row, h.where));
    chosen.clear();
    rejected.clear();
  };
  for_each_jsonl_row(spec, base_dir, [&](const ojson& row, const std::string& where) {
    const bool is_pair = is_preference_row(row);
    if (first) paired = is_pair;
    first = false;
    if (is_pair != paired)
      throw std::invalid_argument(
          where + ": " +
          (paired ? "a row without \"chosen\" and \"rejected\" among preference pairs"
                  : "a preference pair among unpaired rows (prompt, completion, label)") +
          ": one file holds one kind (TRL's datasets have one set of columns)");
    try {
      if (!paired) {
        out.push_back(formatter.format(row, where));
        return;
      }
      if (!row.is_object()) throw std::invalid_argument(where + ": a row must be a JSON object");
      check_preference_row_keys(row, where);
      // maybe_extract_prompt, then unpair_preference_dataset.
      const PreferenceSplit s = split_preference_row(row, where);
      chosen.push_back({ojson{{"prompt", s.prompt}, {"completion", s.chosen}, {"label", true}},
                        where + " (\"chosen\")"});
      rejected.push_back({ojson{{"prompt", s.prompt}, {"completion", s.rejected}, {"label", false}},
                          where + " (\"rejected\")"});
      if (chosen.size() == kUnpairBlock) flush();
    } catch (const DataOutOfMemory& e) {
      throw DataOutOfMemory(where + ": " + e.what());
    } catch (const std::bad_alloc&) {
      throw DataOutOfMemory(where + ": making the row's completion (" + std::to_string(out.size()) +
                            " rows so far)");
    }
  });
  flush();
  return out;
}

std::vector<Example> kto_units(const std::vector<const KtoRow*>& rows, int64_t chunk,
                               const KtoFormatter& formatter) {
  if (chunk <= 0) throw std::logic_error("kto_units: chunk must be positive");
  std::vector<Example> units;
  units.reserve(rows.size() * 2);
  for (size_t begin = 0; begin < rows.size(); begin += static_cast<size_t>(chunk)) {
    const size_t end = std::min(rows.size(), begin + static_cast<size_t>(chunk));
    for (size_t i = begin; i < end; ++i) {
      const KtoRow& row = *rows[i];
      const KtoRow& previous = *rows[i == begin ? end - 1 : i - 1];
      units.push_back(row.completion);
      Example kl = formatter.process(
          row.prompt, previous.answer,
          row.where + " (its KL row, with the completion of " + previous.where + ")");
      kl.desirable = row.completion.desirable;
      units.push_back(std::move(kl));
    }
  }
  return units;
}

}  // namespace tightfit
