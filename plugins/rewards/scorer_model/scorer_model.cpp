// A reward from a reward model: a *ForSequenceClassification Hugging Face
// folder (`model`) scores each prompt + completion, as TRL's GRPOTrainer
// scores with a PreTrainedModel reward function — a row whose prompt is a
// list of messages becomes them plus {"role": "assistant", "content":
// completion}, rendered with the reward model's own chat template; a text
// prompt is prompt + completion; either is tokenized with no special tokens
// added, and the score is the logit of `label` (TRL: 0) at the last token
// that is not the pad token. The host opens the model beside the run
// (score_texts) when the reward is made, and the plan counts its weights.
#include <memory>
#include <nlohmann/json.hpp>

#include "tightfit/plugin_sdk.hpp"
#include "tightfit/rl/reward_plugin.hpp"

namespace {

struct ScorerModel {
  tf_sdk::Host host;
  std::string model;
  int32_t label = 0;
  int64_t batch_rows = 0;
};

// TRL's texts for the reward model: conversational rows (a prompt that is a
// list of messages) as messages, the others as text.
std::vector<double> score(ScorerModel& s, const tf_rl::RewardBatch& b) {
  std::vector<std::string> texts;
  bool conversational = false;
  for (int64_t i = 0; i < b.size(); ++i) {
    const nlohmann::json row = b.row(i);
    const bool messages = row.is_object() && row.contains("prompt") && row["prompt"].is_array();
    if (i == 0) conversational = messages;
    if (messages != conversational)
      throw std::invalid_argument(
          "the batch mixes rows whose prompt is a list of messages with rows whose prompt is "
          "text; TRL renders a batch one way, from its first row: give the reward model one "
          "kind");
    if (messages) {
      nlohmann::json m = row["prompt"];
      // A continued assistant message is the completion's beginning (the
      // host put its content first), as TRL pops it from the prompt.
      if (!m.empty() && m.back().is_object() && m.back().value("role", "") == "assistant")
        m.erase(m.size() - 1);
      m.push_back({{"role", "assistant"}, {"content", std::string(b.completion(i))}});
      texts.push_back(m.dump());
    } else {
      texts.push_back(std::string(b.prompt(i)) + std::string(b.completion(i)));
    }
  }
  return tf_rl::score_texts(s.host, s.model, texts, conversational, s.label, s.batch_rows).scores;
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<ScorerModel>(ScorerModel{tf_sdk::Host(api, ctx)});
    s->model = s->host.get_string("model");
    if (s->model.empty())
      throw std::invalid_argument(
          "model: give the reward model's Hugging Face folder (a *ForSequenceClassification "
          "config.json, its weights and tokenizer)");
    s->label = static_cast<int32_t>(s->host.get_int("label"));
    s->batch_rows = s->host.get_int("batch_rows");
    // Opened now: a folder it cannot read stops the run before any step.
    const tf_rl::TextScores opened = tf_rl::score_texts(s->host, s->model, {});
    if (s->label >= opened.num_labels)
      throw std::invalid_argument("label = " + std::to_string(s->label) + ", and " + s->model +
                                  " has " + std::to_string(opened.num_labels) +
                                  " labels (its config.json's id2label)");
    *out = s.release();
    return TF_OK;
  });
}

// The reward model's weights, held for the whole run.
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary*,
                          tf_memory_estimate* out) {
  auto* s = static_cast<ScorerModel*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    out->delta_bytes[TF_TIER_DEVICE][TF_MEM_WEIGHTS] +=
        tf_rl::score_texts(s->host, s->model, {}).weight_bytes;
    return TF_OK;
  });
}

const tf_config_key kKeys[] = {
    tf_sdk::key("model", TF_VALUE_PATH, "\"\"",
                "the reward model: a Hugging Face folder of a *ForSequenceClassification model"),
    tf_sdk::key("label", TF_VALUE_INT, "0", "the label whose logit is the score (TRL's 0)", 0, 1e6),
    tf_sdk::key("batch_rows", TF_VALUE_INT, "0",
                "completions scored in one forward pass (0: the whole batch, as TRL)", 0, 1e9),
};

const tf_reward_vtable kVtable = {.struct_size = sizeof(tf_reward_vtable),
                                  .create = create,
                                  .destroy = tf_sdk::destroy_state<ScorerModel>,
                                  .score = tf_rl::score_hook<ScorerModel, score>,
                                  .estimate_memory = estimate_memory};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_REWARD, "scorer_model", "1.0.0",
    "reward from a reward model's score (a Hugging Face *ForSequenceClassification folder)", kKeys,
    &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
