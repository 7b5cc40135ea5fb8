// Odds Ratio Preference Optimization (Hong et al. 2024) as TRL 0.24's
// ORPOTrainer computes it, on preference pairs. No reference model: the
// loss is the chosen rows' NLL over every token after the first (prompt
// and completion alike) minus beta times the mean log-sigmoid of the log
// odds ratio of the chosen and rejected completions' average
// log-probabilities. So it trains adapters or the whole model alike. Each
// step:
//   token log-probs   every token of every row, no gradients (token_logps
//                     with the schedule's own targets: the prompt's too);
//   loss              TRL's NLL - beta * mean(log sigmoid(log odds)),
//                     differentiated with respect to each token's log-prob;
//   backward          token_logps with those derivatives as weights (the
//                     head's log-softmax a chunk of tokens at a time).
// Rows are tokenized as ORPOTrainer tokenizes them (preference_tokenization
// "joint", as CPOTrainer: prompt + completion together, BOS first).
#include <cmath>
#include <memory>

#include "tightfit/lr_schedule.hpp"
#include "tightfit/preference/micro_batches.hpp"
#include "tightfit/preference/pair_passes.hpp"
#include "tightfit/preference/preference_loss.hpp"
#include "tightfit/preference/schedule_hooks.hpp"

namespace {

using tf_preference::kIgnoreIndex;

struct Orpo {
  tf_sdk::Host host;
  tf_sdk::LrSchedule lr;
  tf_preference::OrpoOptions options;
  int32_t accumulation = 1;
  int64_t skipped = 0;
  tf_preference::PairPasses passes = tf_preference::PairPasses::read(host);
};

// ORPOTrainer's NLL labels are the input ids wherever the attention mask is
// set: every token after a row's first is a target. A position before the
// row's first completion target (the prompt) predicts the next input token;
// from there on the batch's own targets stand (the completion, then padding
// ignored). Rows are left-aligned and unpacked, and every row has a
// completion target (the joint tokenization appends EOS).
at::Tensor every_token_targets(const at::Tensor& tokens, const at::Tensor& targets) {
  const int64_t B = tokens.size(0), T = tokens.size(1);
  const at::Tensor scored = targets.ne(kIgnoreIndex);
  if (!scored.any(1).all().item<bool>())
    throw std::invalid_argument("schedule orpo: a preference row has no completion token to score");
  const at::Tensor position = at::arange(T, targets.options()).unsqueeze(0);
  const at::Tensor first = at::where(scored, position, T).amin(1, /*keepdim=*/true);
  const at::Tensor next =
      at::cat({tokens.narrow(1, 1, T - 1), at::full({B, 1}, kIgnoreIndex, targets.options())}, 1);
  return at::where(position.lt(first), next, targets);
}

struct Scored {
  at::Tensor targets, scored, completion;
};

Scored orpo_targets(const tf_sdk::Batch& b) {
  tf_preference::require_pairs(b, "orpo");
  Scored s;
  s.targets = every_token_targets(b.tokens(), b.targets());
  s.scored = s.targets.ne(kIgnoreIndex);
  s.completion = b.targets().ne(kIgnoreIndex);
  return s;
}

void add_metrics(tf_preference::Metrics& m, const tf_preference::OrpoResult& r) {
  tf_preference::add_reward_metrics(m, r.chosen_rewards, r.rejected_rewards, r.used.chosen,
                                    r.used.rejected);
  m["nll_loss"] = r.nll.item<double>();
  m["log_odds_ratio"] = r.log_odds_ratio.item<double>();
  m["log_odds_chosen"] = r.log_odds_chosen.item<double>();
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Orpo>(Orpo{tf_sdk::Host(api, ctx)});
    s->lr = tf_sdk::LrSchedule::read(s->host);
    s->options.beta = s->host.get_double("beta");
    s->accumulation = static_cast<int32_t>(s->host.get_int("gradient_accumulation_steps"));
    *out = s.release();
    return TF_OK;
  });
}

tf_status run_step(void* state, tf_host_context* ctx, int64_t step, int64_t total,
                   tf_step_result* out) {
  auto* s = static_cast<Orpo*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    tf_preference::preference_step(
        *s, step, total, 2, "orpo", out,
        [&](const tf_sdk::Batch& batch, double scale, tf_preference::Metrics& metrics) {
          const Scored t = orpo_targets(batch);
          tf_preference::Terms terms;  // TRL's aux_loss_coef * aux_loss
          const at::Tensor logps = s->passes.token_logps(batch, t.targets, {}, &terms);
          // d loss / d each token's log-prob, by autograd on the loss itself.
          at::AutoGradMode grad(true);
          const at::Tensor tokens = logps.detach().clone().requires_grad_(true);
          const tf_preference::OrpoResult r =
              tf_preference::orpo_loss(tokens, t.scored, t.completion, batch.pairs(), s->options);
          r.loss.backward();
          tf_preference::Terms backward_terms{scale};
          s->passes.token_logps(batch, t.targets, tokens.grad() * scale, &backward_terms);
          add_metrics(metrics, r);
          tf_preference::add_terms_metric(metrics, terms.sum);
          return r.loss.item<double>() + terms.sum;
        });
    return TF_OK;
  });
}

tf_status eval_batch(void* state, tf_host_context* ctx, const tf_batch* lent, tf_pass_result* out) {
  auto* s = static_cast<Orpo*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const tf_sdk::Batch batch(s->host, lent);
    const Scored t = orpo_targets(batch);
    tf_preference::Terms terms;
    const double loss =
        tf_preference::orpo_loss(s->passes.token_logps(batch, t.targets, {}, &terms), t.scored,
                                 t.completion, batch.pairs(), s->options)
            .loss.item<double>() +
        terms.sum;
    tf_preference::eval_result(loss, batch, out);
    return TF_OK;
  });
}

const std::vector<tf_config_key> kKeys = tf_sdk::with_lr_schedule_keys({
    tf_sdk::key("beta", TF_VALUE_FLOAT, "0.1",
                "weight of the odds-ratio term against the NLL (TRL's ORPOConfig beta, the "
                "paper's lambda)",
                1e-6, 1e6),
    tf_preference::accumulation_key(),
    tf_preference::concatenate_pairs_key(),
});

const tf_schedule_vtable kVtable = {.struct_size = sizeof(tf_schedule_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<Orpo>,
                                    .run_step = run_step,
                                    .estimate_memory = tf_preference::estimate_policy_passes<Orpo>,
                                    .save_state = tf_sdk::save_skipped_state<Orpo>,
                                    .load_state = tf_sdk::load_skipped_state<Orpo>,
                                    .eval_batch = eval_batch,
                                    .preference_tokenization = "joint"};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_SCHEDULE, "orpo", "1.0.0",
    "preference pairs without a reference model: the chosen NLL plus an odds-ratio term (TRL's "
    "ORPOTrainer)",
    kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
