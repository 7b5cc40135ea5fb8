// Writing a reward plugin (ABI 1.25, TF_PLUGIN_REWARD): the batch a reward
// scores, read as C++ values, and its score hook from a function of the
// plugin's state and that batch. A reward returns one number a completion,
// or NaN where it has none for the row (TRL's None); the host refuses
// anything else non-finite and stops the run when the plugin fails, so a
// reward that cannot judge a row says NaN rather than guessing.
//
//   struct MyReward { tf_sdk::Host host; ... };
//   std::vector<double> score(MyReward& s, const tf_rl::RewardBatch& b);
//   const tf_reward_vtable kVtable = {.struct_size = sizeof(tf_reward_vtable),
//                                     .create = create,
//                                     .destroy = tf_sdk::destroy_state<MyReward>,
//                                     .score = tf_rl::score_hook<MyReward, score>};
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "tightfit/plugin_sdk.hpp"

namespace tf_rl {

class RewardBatch {
 public:
  explicit RewardBatch(const tf_reward_batch* b) : b_(b) {
    if (b_ == nullptr || b_->struct_size < offsetof(tf_reward_batch, lengths) + sizeof(tf_tensor))
      throw std::invalid_argument("the host's tf_reward_batch is too short for this reward");
  }
  int64_t size() const { return b_->n; }
  // Rows [g * group_size(), (g + 1) * group_size()) complete the same prompt.
  int32_t group_size() const { return b_->group_size; }
  // Row i's prompt as the model read it (the chat template applied).
  std::string_view prompt(int64_t i) const { return b_->prompts[check(i)]; }
  // Row i's completion, decoded with special tokens skipped (TRL's text);
  // when its prompt ends with an assistant message the model continued,
  // that message's content comes first, as in TRL's completions.
  std::string_view completion(int64_t i) const { return b_->completions[check(i)]; }
  // Row i's data row (its JSONL object): a reward reads its own fields.
  nlohmann::json row(int64_t i) const {
    return nlohmann::json::parse(b_->rows[check(i)], nullptr, /*allow_exceptions=*/false);
  }
  // int64 [n, C]: each completion's ids, then -1; and int64 [n] their counts.
  const at::Tensor& completion_ids() const { return tf_sdk::borrow(b_->completion_ids); }
  const at::Tensor& lengths() const { return tf_sdk::borrow(b_->lengths); }

 private:
  size_t check(int64_t i) const {
    if (i < 0 || i >= b_->n) throw std::out_of_range("reward batch row " + std::to_string(i));
    return static_cast<size_t>(i);
  }
  const tf_reward_batch* b_;
};

// The score hook of a reward whose state S has `Host host`, from
// `fn(S&, const RewardBatch&) -> std::vector<double>` (one a row).
template <class S, std::vector<double> (*fn)(S&, const RewardBatch&)>
tf_status score_hook(void* state, tf_host_context* ctx, const tf_reward_batch* batch, double* out) {
  auto* s = static_cast<S*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const RewardBatch b(batch);
    const std::vector<double> scores = fn(*s, b);
    if (static_cast<int64_t>(scores.size()) != b.size())
      throw std::logic_error("the reward scored " + std::to_string(scores.size()) + " of " +
                             std::to_string(b.size()) + " completions");
    std::copy(scores.begin(), scores.end(), out);
    return TF_OK;
  });
}

// What a sequence classifier the host opened (score_texts, ABI 1.28) gave:
// each text's score (the logit of the asked label) and what the model holds.
struct TextScores {
  std::vector<double> scores;
  int64_t weight_bytes = 0, num_labels = 0, positions = 0;
};

// Scores `texts` with the *ForSequenceClassification model in the Hugging
// Face folder `model` as transformers does (the logit of `label` at each
// text's last token that is not the pad token; no special tokens added).
// With `messages`, each text is a JSON array of chat messages the model's
// chat template renders first. No texts: opens the model and says what it
// holds. The host opens a folder once for the run.
inline TextScores score_texts(const tf_sdk::Host& host, const std::string& model,
                              const std::vector<std::string>& texts, bool messages = false,
                              int32_t label = 0, int64_t batch_rows = 0) {
  if (!TF_HAS(host.api(), tf_host_api, score_texts))
    throw std::runtime_error("this tightfit has no score_texts (plugin ABI 1.28): update it");
  std::vector<const char*> ptrs;
  ptrs.reserve(texts.size());
  for (const std::string& t : texts) ptrs.push_back(t.c_str());
  TextScores out;
  out.scores.resize(texts.size());
  tf_score_texts_request r{};
  r.struct_size = sizeof r;
  r.model = model.c_str();
  r.n = static_cast<int64_t>(texts.size());
  r.texts = ptrs.data();
  r.messages = messages ? 1 : 0;
  r.label = label;
  r.batch_rows = batch_rows;
  tf_score_texts_result res{};
  res.struct_size = sizeof res;
  res.scores = out.scores.data();
  host.check(host.api()->score_texts(host.ctx(), &r, &res));
  out.weight_bytes = res.weight_bytes;
  out.num_labels = res.num_labels;
  out.positions = res.positions;
  return out;
}

}  // namespace tf_rl
