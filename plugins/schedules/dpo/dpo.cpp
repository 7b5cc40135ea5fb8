// Direct Preference Optimization (Rafailov et al. 2023) as TRL 0.24's
// DPOTrainer computes it, on preference pairs ([data] rows with chosen and
// rejected). Each step:
//   reference log-probs  no gradients, from the reference model: with
//                        adapters, the base with them off (as PEFT's
//                        disable_adapter()); a full fine-tune's, the weights
//                        before the first update (reference_model.hpp);
//   policy log-probs     the model as it is, no gradients;
//   loss                 TRL's dpo_loss of the two (sigmoid, ipo or hinge),
//                        differentiated with respect to the policy log-probs;
//   backward             sequence_logps again with those derivatives as
//                        weights: the gradient of sum_r w_r logp_r is the
//                        loss's gradient, with the head's log-softmax taken
//                        a chunk of tokens at a time (never the whole logits).
// The extra gradient-free policy pass costs a forward; it buys a backward
// that runs through the kernel's own pass (checkpointing, offload,
// grad_ready, fused updates) unchanged.
#include <cmath>
#include <memory>

#include "tightfit/lr_schedule.hpp"
#include "tightfit/preference/micro_batches.hpp"
#include "tightfit/preference/pair_passes.hpp"
#include "tightfit/preference/precomputed_reference.hpp"
#include "tightfit/preference/preference_loss.hpp"
#include "tightfit/preference/reference_model.hpp"
#include "tightfit/preference/schedule_hooks.hpp"

namespace {

struct Dpo {
  tf_sdk::Host host;
  tf_sdk::LrSchedule lr;
  tf_preference::DpoOptions options;
  int32_t accumulation = 1;
  int64_t skipped = 0;
  tf_preference::PairPasses passes = tf_preference::PairPasses::read(host);
  tf_preference::ReferenceModel reference{"dpo"};
  // precompute_ref_log_probs: every row's reference log-probs, computed
  // before the first update (then no copy of the model is kept).
  bool precompute = false;
  tf_preference::PrecomputedReference table;
};

void prepare_reference(Dpo& s, int64_t step) {
  tf_preference::prepare_reference(s.host, s.reference, s.precompute ? &s.table : nullptr, step,
                                   "dpo");
}

struct Scores {
  tf_preference::PairLogps reference;  // as the loss uses them
  at::Tensor policy_rows, counts;      // [2P]: the policy's sums; the targets per row
  double terms = 0;  // the model's own loss terms (TRL's aux_loss_coef * aux_loss)
  // TRL's logits/chosen and logits/rejected: the policy's logits averaged
  // over each side's completion tokens and the vocabulary.
  double logits_chosen = std::nan(""), logits_rejected = std::nan("");
};

// Each pair's log-probs as the loss uses them: a sequence's sum, or its
// average over the sequence's tokens where the loss type asks (IPO).
tf_preference::PairLogps as_used(const Dpo& s, const at::Tensor& sums, const at::Tensor& counts,
                                 int64_t pairs) {
  return tf_preference::split_pairs(
      tf_preference::averages_logps(s.options) ? sums / counts.to(at::kFloat) : sums, pairs);
}

// Each row's positions as DPOTrainer counts them: the scored targets, and
// one more in a row whose first token is its answer's (ABI 1.21's
// answer_first): TRL rolls its loss mask by one, and the first token's flag
// wraps onto the batch's last column. IPO's average divides by this count.
at::Tensor trl_counts(const tf_sdk::Batch& b, const at::Tensor& counts) {
  const at::Tensor first = b.answer_first();
  return first.defined() ? counts + first.to(counts.device(), counts.scalar_type()) : counts;
}

Scores score(Dpo& s, const tf_sdk::Batch& b) {
  const int64_t pairs = tf_preference::require_pairs(b, "dpo");
  Scores r;
  const tf_sdk::SequenceLogps ref =
      s.precompute ? s.table.of(b) : s.reference.run(s.host, [&](const tf_sdk::PassWeights& w) {
        return s.passes.reference_logps(b, w);
      });
  tf_preference::Terms terms;
  tf_preference::MeanLogits means;
  const tf_sdk::SequenceLogps pol = s.passes.sequence_logps(b, {}, &terms, &means);
  r.terms = terms.sum;
  r.logits_chosen = means.of_side(b.targets(), pairs, 0, b.answer_first());
  r.logits_rejected = means.of_side(b.targets(), pairs, 1, b.answer_first());
  r.counts = trl_counts(b, pol.counts);
  r.policy_rows = pol.logps;
  r.reference = as_used(s, ref.logps, trl_counts(b, ref.counts), pairs);
  return r;
}

void add_metrics(tf_preference::Metrics& m, const tf_preference::DpoResult& r,
                 const tf_preference::PairLogps& policy) {
  tf_preference::add_reward_metrics(m, r.chosen_rewards, r.rejected_rewards, policy.chosen,
                                    policy.rejected);
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Dpo>(Dpo{tf_sdk::Host(api, ctx)});
    s->lr = tf_sdk::LrSchedule::read(s->host);
    s->options.beta = s->host.get_double("beta");
    s->options.loss_type = s->host.get_string("loss_type");
    s->options.label_smoothing = s->host.get_double("label_smoothing");
    s->accumulation = static_cast<int32_t>(s->host.get_int("gradient_accumulation_steps"));
    s->precompute = s->host.get_bool("precompute_ref_log_probs");
    s->reference.read(s->host, s->precompute);
    if (s->options.label_smoothing > 0 && s->options.loss_type != "sigmoid")
      throw std::invalid_argument("label_smoothing applies to loss_type = \"sigmoid\" (cDPO); " +
                                  s->options.loss_type + " ignores it in TRL: leave it out");
    *out = s.release();
    return TF_OK;
  });
}

tf_status run_step(void* state, tf_host_context* ctx, int64_t step, int64_t total,
                   tf_step_result* out) {
  auto* s = static_cast<Dpo*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    prepare_reference(*s, step);
    tf_preference::preference_step(
        *s, step, total, 3, "dpo", out,
        [&](const tf_sdk::Batch& batch, double scale, tf_preference::Metrics& metrics) {
          const Scores sc = score(*s, batch);
          // d loss / d logps of the policy rows, by autograd on the loss itself.
          at::AutoGradMode grad(true);
          const at::Tensor rows = sc.policy_rows.detach().clone().requires_grad_(true);
          const tf_preference::PairLogps policy = as_used(*s, rows, sc.counts, batch.pairs());
          const tf_preference::DpoResult r =
              tf_preference::dpo_loss(policy, sc.reference, s->options);
          r.loss.backward();
          // TRL's loss + aux_loss_coef * aux_loss: the model's terms, at the loss's weight.
          tf_preference::Terms terms{scale};
          s->passes.sequence_logps(batch, rows.grad() * scale, &terms);
          add_metrics(metrics, r, policy);
          tf_preference::add_terms_metric(metrics, sc.terms);
          if (std::isfinite(sc.logits_chosen)) metrics["logits/chosen"] = sc.logits_chosen;
          if (std::isfinite(sc.logits_rejected)) metrics["logits/rejected"] = sc.logits_rejected;
          return r.loss.item<double>() + sc.terms;
        });
    return TF_OK;
  });
}

tf_status eval_batch(void* state, tf_host_context* ctx, const tf_batch* lent, tf_pass_result* out) {
  auto* s = static_cast<Dpo*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const tf_sdk::Batch batch(s->host, lent);
    prepare_reference(*s, -1);
    const Scores sc = score(*s, batch);
    const tf_preference::PairLogps policy = as_used(*s, sc.policy_rows, sc.counts, batch.pairs());
    tf_preference::eval_result(
        tf_preference::dpo_loss(policy, sc.reference, s->options).loss.item<double>() + sc.terms,
        batch, out);
    return TF_OK;
  });
}

// Three forwards (reference, policy, policy again) and one backward against
// the plain step's forward and backward (a backward ~ two forwards).
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary* model,
                          tf_memory_estimate* out) {
  auto* s = static_cast<Dpo*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->passes.estimate(model, out);
    // Precomputed, the reference pass is gone from the step.
    tf_preference::plan_micro_batches(s->precompute ? 4.0 : 5.0, s->accumulation, out);
    // A full fine-tune keeps a copy of the trainable weights as its reference
    // (unless its log-probs are precomputed).
    if (!s->precompute) s->reference.plan(s->host, out);
    return TF_OK;
  });
}

const std::vector<tf_config_key> kKeys = tf_sdk::with_lr_schedule_keys({
    tf_sdk::key("beta", TF_VALUE_FLOAT, "0.1",
                "how far from the reference the policy may move (TRL's beta)", 1e-6, 1e6),
    tf_sdk::key("loss_type", TF_VALUE_STRING, "\"sigmoid\"",
                "sigmoid (DPO), ipo (IPO: log-probs averaged per token) or hinge (SLiC)", 1, 0,
                "sigmoid|ipo|hinge"),
    tf_sdk::key("label_smoothing", TF_VALUE_FLOAT, "0.0",
                "sigmoid only: the assumed share of flipped labels (cDPO)", 0, 0.4999),
    tf_preference::accumulation_key(),
    tf_preference::precompute_key(),
    tf_preference::reference_tier_key(),
    tf_preference::concatenate_pairs_key(),
});

const tf_schedule_vtable kVtable = {.struct_size = sizeof(tf_schedule_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<Dpo>,
                                    .run_step = run_step,
                                    .estimate_memory = estimate_memory,
                                    .save_state = tf_preference::save_reference_state<Dpo>,
                                    .load_state = tf_preference::load_reference_state<Dpo>,
                                    .eval_batch = eval_batch};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_SCHEDULE, "dpo", "1.0.0",
    "preference pairs: DPO, IPO or SLiC loss against a reference model: the base with adapters "
    "off, or a full fine-tune's weights before the first update (TRL's DPOTrainer)",
    kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
