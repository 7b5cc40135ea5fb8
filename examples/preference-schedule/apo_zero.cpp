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
// schedule passes d loss / d logps). The SDK's preference kit
// (tightfit/preference/, what dpo, cpo, orpo and kto are built from) gives
// the reference model as dpo makes it — with adapters, the base with them
// off for that pass alone (PEFT's disable_adapter()) — and the hooks'
// common parts.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <memory>
#include <tightfit/lr_schedule.hpp>
#include <tightfit/plugin_sdk.hpp>
#include <tightfit/preference/preference_loss.hpp>
#include <tightfit/preference/reference_model.hpp>
#include <tightfit/preference/schedule_hooks.hpp>

namespace {

struct ApoZero {
  tf_sdk::Host host;
  tf_sdk::LrSchedule lr;
  double beta = 0.1;
  int64_t skipped = 0;
  tf_preference::ReferenceModel reference{"apo_zero"};
};

struct Loss {
  at::Tensor loss, chosen_rewards, rejected_rewards;
};

Loss apo_zero(const at::Tensor& policy_rows, const at::Tensor& reference_rows, int64_t pairs,
              double beta) {
  const tf_preference::PairLogps ratios =
      tf_preference::split_pairs(policy_rows - reference_rows, pairs);
  const at::Tensor losses =
      1 - at::sigmoid(beta * ratios.chosen) + at::sigmoid(beta * ratios.rejected);
  return {losses.mean(), (beta * ratios.chosen).detach(), (beta * ratios.rejected).detach()};
}

// The reference's log-probabilities: one gradient-free pass of the
// reference model (the kit's: each pass's own weights, ABI 1.20's run_pass).
at::Tensor reference_logps(ApoZero& s, const tf_sdk::Batch& batch) {
  return s.reference.run(
      s.host, [&](const tf_sdk::PassWeights& w) { return batch.sequence_logps({}, w).logps; });
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<ApoZero>(ApoZero{tf_sdk::Host(api, ctx)});
    s->lr = tf_sdk::LrSchedule::read(s->host);
    s->beta = s->host.get_double("beta");
    s->reference.read(s->host, /*precompute=*/false);
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
    s->reference.keep(s->host, step);
    const tf_sdk::Batch batch(s->host);
    const int64_t pairs = tf_preference::require_pairs(batch, "apo_zero");
    const at::Tensor reference = reference_logps(*s, batch);
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
    const tf_preference::AccumulatedStep done{l.loss.item<double>(), batch.n_tokens()};
    tf_preference::step_result(done, /*accumulation=*/1, /*forwards=*/3, lr, "apo_zero", out);
    return TF_OK;
  });
}

// The held-out loss is the same loss on validation pairs.
tf_status eval_batch(void* state, tf_host_context* ctx, const tf_batch* lent, tf_pass_result* out) {
  auto* s = static_cast<ApoZero*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const tf_sdk::Batch batch(s->host, lent);
    const int64_t pairs = tf_preference::require_pairs(batch, "apo_zero");
    s->reference.keep(s->host);
    const at::Tensor reference = reference_logps(*s, batch);
    tf_preference::eval_result(
        apo_zero(batch.sequence_logps().logps, reference, pairs, s->beta).loss.item<double>(),
        batch, out);
    return TF_OK;
  });
}

// Three forwards (reference, policy, policy again) and one backward against
// the plain step's forward and backward, for `tightfit plan`'s time; a full
// fine-tune's reference copy in its tier.
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary*,
                          tf_memory_estimate* out) {
  auto* s = static_cast<ApoZero*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    tf_preference::plan_micro_batches(5.0, /*accumulation=*/1, out);
    s->reference.plan(s->host, out);
    return TF_OK;
  });
}

// Checkpoints carry the skipped steps and a full fine-tune's reference copy.
tf_status save_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<ApoZero*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->host.save_double("skipped", static_cast<double>(s->skipped));
    s->reference.save(s->host);
    return TF_OK;
  });
}
tf_status load_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<ApoZero*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->skipped = static_cast<int64_t>(s->host.saved_double("skipped"));
    s->reference.load(s->host);
    return TF_OK;
  });
}

const std::vector<tf_config_key> kKeys = tf_sdk::with_lr_schedule_keys({
    tf_sdk::key("beta", TF_VALUE_FLOAT, "0.1", "how far from the reference each answer may move",
                1e-6, 1e6),
    tf_preference::reference_tier_key(),
});

const tf_schedule_vtable kVtable = {.struct_size = sizeof(tf_schedule_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<ApoZero>,
                                    .run_step = run_step,
                                    .estimate_memory = estimate_memory,
                                    .save_state = save_state,
                                    .load_state = load_state,
                                    .eval_batch = eval_batch,
                                    .preference_tokenization = "dpo"};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_SCHEDULE, "apo_zero", "0.2.0",
    "preference pairs: APO-zero against the reference model as dpo makes it (an out-of-tree "
    "example on the SDK's preference kit)",
    kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
