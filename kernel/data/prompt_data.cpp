#include "prompt_data.hpp"

#include <algorithm>
#include <stdexcept>

#include "example_batcher.hpp"
#include "ignore_index.hpp"
#include "jsonl_rows.hpp"
#include "preference_data.hpp"

namespace tightfit {

using ojson = nlohmann::ordered_json;

bool is_prompt_only_row(const ojson& row) {
  if (!row.is_object() || !row.contains("prompt")) return false;
  for (const char* answer : {"completion", "chosen", "rejected", "messages", "output"})
    if (row.contains(answer)) return false;
  return true;
}

namespace {

// maybe_apply_chat_template({"prompt": ...})["prompt"], tokenized without
// special tokens and cut as the tokenizer cuts.
PromptRow format_prompt(const ojson& row, const std::string& where, const ChatFormatter& chat,
                        int64_t max_prompt_length, bool truncate_left) {
  if (!is_prompt_only_row(row))
    throw std::invalid_argument(
        where +
        ": a prompt row holds a \"prompt\" (text or messages) and no answer "
        "(\"completion\", \"chosen\", \"rejected\", \"messages\"): the schedule samples "
        "the completions itself");
  const ojson& prompt = row["prompt"];
  PromptRow r;
  r.where = where;
  if (prompt.is_string()) {
    r.text = prompt.get<std::string>();
  } else if (conversational(prompt)) {
    check_chat_messages(prompt, where, "prompt", /*content_required=*/true);
    const ojson tools = row.contains("tools") ? row["tools"] : ojson();
    if (prompt.back().value("role", "") == "assistant") {
      // Continued, as TRL's maybe_apply_chat_template does (continue_final_message).
      r.bootstrap = prompt.back()["content"].get<std::string>();
      r.text = continue_final_message(
          chat.render(prompt, /*add_generation_prompt=*/false, tools, where).text, r.bootstrap,
          where);
    } else {
      r.text = chat.render(prompt, /*add_generation_prompt=*/true, tools, where).text;
    }
  } else {
    throw std::invalid_argument(where +
                                ": \"prompt\" must be text or a list of messages (objects with "
                                "\"role\" and \"content\")");
  }
  r.ids = chat.tokenizer().encode(r.text);
  if (r.ids.empty())
    throw std::invalid_argument(where +
                                ": the prompt is empty once tokenized: the model would have no "
                                "token to continue; give it text");
  const auto cap = static_cast<size_t>(max_prompt_length);
  if (max_prompt_length > 0 && r.ids.size() > cap) {
    r.truncated = true;
    if (truncate_left)
      r.ids.erase(r.ids.begin(), r.ids.end() - static_cast<std::ptrdiff_t>(cap));
    else
      r.ids.resize(cap);
  }
  r.row = row.dump();
  return r;
}

}  // namespace

std::vector<PromptRow> load_prompt_rows(const std::string& spec, const ChatFormatter& chat,
                                        int64_t max_prompt_length, bool truncate_left,
                                        const std::string& base_dir) {
  std::vector<PromptRow> rows;
  for_each_jsonl_row(spec, base_dir, [&](const ojson& row, const std::string& where) {
    rows.push_back(format_prompt(row, where, chat, max_prompt_length, truncate_left));
  });
  if (rows.empty()) throw std::invalid_argument("corpus \"" + spec + "\" holds no prompt rows");
  return rows;
}

PromptBatcher::PromptBatcher(std::vector<PromptRow> rows, int64_t batch_size, uint64_t seed,
                             double val_fraction, int64_t pad_id, int64_t eos_id,
                             int64_t pad_token_id)
    : batch_size_(batch_size),
      pad_id_(pad_id),
      eos_id_(eos_id),
      pad_token_id_(pad_token_id),
      seed_(seed) {
  if (batch_size <= 0) throw std::invalid_argument("batch_size must be positive");
  // Whole rows held out, drawn as the example batcher draws them.
  const std::vector<bool> held = ExampleBatcher::held_out(rows.size(), val_fraction, seed);
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < rows.size(); ++i)
      if (held[i] == (pass == 1)) {
        (pass == 0 ? train_ : validation_).push_back(static_cast<int64_t>(rows_.size()));
        longest_ = std::max<int64_t>(longest_, static_cast<int64_t>(rows[i].ids.size()));
        rows_.push_back(std::move(rows[i]));
      }
  if (static_cast<int64_t>(train_.size()) < batch_size)
    throw std::invalid_argument(
        std::to_string(train_.size()) + " training prompts (" + std::to_string(validation_.size()) +
        " held out by val_fraction) are fewer than batch_size = " + std::to_string(batch_size) +
        ": give more prompt rows, or a smaller batch_size");
}

const PromptRow& PromptBatcher::row(int64_t id) const {
  if (id < 0 || id >= static_cast<int64_t>(rows_.size()))
    throw std::out_of_range("prompt row " + std::to_string(id) + " is not one of the run's " +
                            std::to_string(rows_.size()));
  return rows_[static_cast<size_t>(id)];
}

Batcher::Batch PromptBatcher::batch_of(const std::vector<int64_t>& ids) const {
  int64_t width = 1;
  for (int64_t id : ids) width = std::max<int64_t>(width, static_cast<int64_t>(row(id).ids.size()));
  const auto n = static_cast<int64_t>(ids.size());
  Batch b;
  b.tokens = at::full({n, width}, pad_id_, at::kLong);
  b.targets = at::full({n, width}, kIgnoreIndex, at::kLong);
  b.attention_mask = at::zeros({n, width}, at::kLong);
  b.row_ids = at::tensor(ids, at::kLong);
  b.prompts = n;
  for (int64_t r = 0; r < n; ++r) {
    const std::vector<int64_t>& p = row(ids[static_cast<size_t>(r)]).ids;
    const auto len = static_cast<int64_t>(p.size());
    b.tokens[r].narrow(0, 0, len).copy_(at::tensor(p, at::kLong));
    b.attention_mask[r].narrow(0, 0, len).fill_(1);
  }
  return b;
}

Batcher::Batch PromptBatcher::next() {
  const auto per_epoch = static_cast<int64_t>(train_.size()) / batch_size_;
  const int64_t index = position_++;
  const int64_t epoch = index / per_epoch, first = (index % per_epoch) * batch_size_;
  if (epoch != order_epoch_) {  // each epoch its own order, from (seed, epoch) alone
    order_ = seeded_permutation(train_.size(),
                                seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
    order_epoch_ = epoch;
  }
  std::vector<int64_t> ids;
  for (int64_t k = 0; k < batch_size_; ++k)
    ids.push_back(train_[order_[static_cast<size_t>(first + k)]]);
  return batch_of(ids);
}

Batcher::Batch PromptBatcher::validation(int64_t i) const {
  const std::vector<int64_t>& split = validation_.empty() ? train_ : validation_;
  std::vector<int64_t> ids;
  for (int64_t k = 0; k < batch_size_; ++k)
    ids.push_back(
        split[static_cast<size_t>((i * batch_size_ + k) % static_cast<int64_t>(split.size()))]);
  return batch_of(ids);
}

}  // namespace tightfit
