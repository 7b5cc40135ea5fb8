// APO-zero (Anchored Preference Optimization, D'Oosterlinck et al. 2024) as
// an out-of-tree schedule, built against the installed SDK alone. For data
// whose chosen answers are better than the model's own (as the persona
// pairs are), it raises the chosen answers' likelihood against the reference
// and lowers the rejected ones', each on its own anchor — TRL's
// loss_type = "apo_zero":
//   chosen  = pi(chosen)   - ref(chosen)      (log-ratios, summed over tokens)
//   rejected = pi(rejected) - ref(rejected)
//   loss = mean(1 - sigmoid(beta chosen) + sigmoid(beta rejected))
// The services it uses are what any preference schedule has (ABI 1.10, and
// 1.20's run_pass): Batch::pairs (a batch of chosen rows, then rejected
// rows), Batch::sequence_logps (each row's summed log-probability through
// the fused head; with weights, the backward of their weighted sum: the
// schedule passes d loss / d logps), with PassWeights{.adapters_off = true}
// for the reference (the base with the adapters off, as PEFT's
// disable_adapter(), for that pass alone).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <memory>
#include <string>
#include <tightfit/lr_schedule.hpp>
#include <tightfit/plugin_sdk.hpp>

namespace {

struct ApoZero {
  tf_sdk::Host host;
  tf_sdk::LrSchedule lr;
  double beta = 0.1;
  int64_t skipped = 0;
};

struct Loss {
  at::Tensor loss, chosen_rewards, rejected_rewards;
};

Loss apo_zero(const at::Tensor& policy_rows, const at::Tensor& reference_rows, int64_t pairs,
              double beta) {
  const at::Tensor ratios = policy_rows - reference_rows;
  const at::Tensor chosen = ratios.narrow(0, 0, pairs), rejected = ratios.narrow(0, pairs, pairs);
  const at::Tensor losses = 1 - at::sigmoid(beta * chosen) + at::sigmoid(beta * rejected);
  return {losses.mean(), (beta * chosen).detach(), (beta * rejected).detach()};
}

// The reference's log-probabilities: one gradient-free pass of the base
// model, the adapters off for that pass alone (ABI 1.20's run_pass).
at::Tensor reference_logps(const tf_sdk::Batch& batch) {
  return batch.sequence_logps({}, tf_sdk::PassWeights{.adapters_off = true}).logps;
}

// With the adapters off the base model is the reference; without adapters
// there would be no reference at all (the policy would score itself).
void need_adapters(const tf_sdk::Host& host) {
  for (const std::string& name : host.param_names())
    if (host.param_info(name).flags & TF_PARAM_ADAPTER) return;
  throw std::invalid_argument(
      "apo_zero's reference is the base model with the adapters off, and no strategy holds "
      "adapters: add [[strategy]] plugin = \"lora\"");
}

int64_t pairs_of(const tf_sdk::Batch& batch) {
  if (batch.pairs() <= 0)
    throw std::invalid_argument(
        "apo_zero trains on preference pairs: give [data] corpus rows with \"chosen\" and "
        "\"rejected\"");
  return batch.pairs();
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<ApoZero>(ApoZero{tf_sdk::Host(api, ctx)});
    s->lr = tf_sdk::LrSchedule::read(s->host);
    s->beta = s->host.get_double("beta");
    need_adapters(s->host);  // (the strategies have declared theirs)
    *out = s.release();
    return TF_OK;
  });
}

tf_status run_step(void* state, tf_host_context* ctx, int64_t step, int64_t total,
                   tf_step_result* out) {
  auto* s = static_cast<ApoZero*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const double lr = s->lr.apply(s->host, step, total);
    s->host.zero_grad();
    const tf_sdk::Batch batch(s->host);
    const int64_t pairs = pairs_of(batch);
    const at::Tensor reference = reference_logps(batch);
    // d loss / d logps of the policy rows by autograd, then the model's
    // backward of sum_r w_r logp_r with those weights.
    at::AutoGradMode grad(true);
    const at::Tensor rows = batch.sequence_logps().logps.detach().clone().requires_grad_(true);
    const Loss l = apo_zero(rows, reference, pairs, s->beta);
    l.loss.backward();
    batch.sequence_logps(rows.grad());
    tf_sdk::step_or_skip(s->host, step, s->skipped);
    s->host.log_metric("rewards/chosen", l.chosen_rewards.mean().item<double>());
    s->host.log_metric("rewards/rejected", l.rejected_rewards.mean().item<double>());
    out->loss = l.loss.item<double>();
    out->n_tokens = batch.n_tokens();
    out->forward_passes = 3;
    out->backward_passes = 1;
    out->lr = lr;
    out->phase = "apo_zero";
    return TF_OK;
  });
}

// The held-out loss is the same loss on validation pairs.
tf_status eval_batch(void* state, tf_host_context* ctx, const tf_batch* lent, tf_pass_result* out) {
  auto* s = static_cast<ApoZero*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const tf_sdk::Batch batch(s->host, lent);
    const int64_t pairs = pairs_of(batch);
    const at::Tensor reference = reference_logps(batch);
    const double loss =
        apo_zero(batch.sequence_logps().logps, reference, pairs, s->beta).loss.item<double>();
    out->loss = loss;
    out->n_tokens = batch.n_tokens();
    out->finite = std::isfinite(loss) ? 1 : 0;
    return TF_OK;
  });
}

// Three forwards (reference, policy, policy again) and one backward against
// the plain step's forward and backward, for `tightfit plan`'s time.
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary*,
                          tf_memory_estimate* out) {
  auto* s = static_cast<ApoZero*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    out->time_factor = 5.0 / 3.0;
    return TF_OK;
  });
}

const std::vector<tf_config_key> kKeys = tf_sdk::with_lr_schedule_keys({
    tf_sdk::key("beta", TF_VALUE_FLOAT, "0.1", "how far from the reference each answer may move",
                1e-6, 1e6),
});

const tf_schedule_vtable kVtable = {.struct_size = sizeof(tf_schedule_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<ApoZero>,
                                    .run_step = run_step,
                                    .estimate_memory = estimate_memory,
                                    .save_state = tf_sdk::save_skipped_state<ApoZero>,
                                    .load_state = tf_sdk::load_skipped_state<ApoZero>,
                                    .eval_batch = eval_batch,
                                    .preference_tokenization = "dpo"};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_SCHEDULE, "apo_zero", "0.1.0",
    "preference pairs: APO-zero against the base model with the adapters off (an out-of-tree "
    "example)",
    kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
