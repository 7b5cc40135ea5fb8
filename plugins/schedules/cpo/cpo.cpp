// Contrastive Preference Optimization (Xu et al. 2024) and SimPO (Meng et
// al. 2024) as TRL 0.24's CPOTrainer computes them, on preference pairs.
// No reference model: the loss compares the policy's own log-probabilities
// of the chosen and rejected completions (summed, or averaged over their
// tokens for ipo and simpo), plus cpo_alpha times the chosen completions'
// NLL. So it trains adapters or the whole model alike. Each step:
//   policy log-probs  no gradients;
//   loss              TRL's cpo_loss + cpo_alpha * NLL, differentiated with
//                     respect to the log-probs;
//   backward          sequence_logps with those derivatives as weights (the
//                     head's log-softmax a chunk of tokens at a time).
// Rows are tokenized as CPOTrainer tokenizes them (preference_tokenization
// "joint": prompt + completion together, the tokenizer's BOS first).
#include <cmath>
#include <memory>

#include "tightfit/lr_schedule.hpp"
#include "tightfit/preference/micro_batches.hpp"
#include "tightfit/preference/pair_passes.hpp"
#include "tightfit/preference/preference_loss.hpp"
#include "tightfit/preference/schedule_hooks.hpp"

namespace {

struct Cpo {
  tf_sdk::Host host;
  tf_sdk::LrSchedule lr;
  tf_preference::CpoOptions options;
  int32_t accumulation = 1;
  int64_t skipped = 0;
  tf_preference::PairPasses passes = tf_preference::PairPasses::read(host);
};

// The policy's log-probs; `terms` gets the model's own loss terms (TRL's
// aux_loss_coef * aux_loss).
tf_sdk::SequenceLogps policy_logps(const Cpo& s, const tf_sdk::Batch& b,
                                   tf_preference::Terms* terms) {
  tf_preference::require_pairs(b, "cpo");
  return s.passes.sequence_logps(b, {}, terms);
}

void add_metrics(tf_preference::Metrics& m, const tf_preference::CpoResult& r) {
  tf_preference::add_reward_metrics(m, r.chosen_rewards, r.rejected_rewards, r.used.chosen,
                                    r.used.rejected);
  m["nll_loss"] = r.nll.item<double>();
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Cpo>(Cpo{tf_sdk::Host(api, ctx)});
    s->lr = tf_sdk::LrSchedule::read(s->host);
    tf_preference::CpoOptions& o = s->options;
    o.beta = s->host.get_double("beta");
    o.loss_type = s->host.get_string("loss_type");
    o.label_smoothing = s->host.get_double("label_smoothing");
    o.cpo_alpha = s->host.get_double("cpo_alpha");
    o.simpo_gamma = s->host.get_double("simpo_gamma");
    s->accumulation = static_cast<int32_t>(s->host.get_int("gradient_accumulation_steps"));
    if (o.label_smoothing > 0 && o.loss_type != "sigmoid" && o.loss_type != "simpo")
      throw std::invalid_argument(
          "label_smoothing applies to loss_type = \"sigmoid\" or \"simpo\"; " + o.loss_type +
          " ignores it in TRL: leave it out");
    if (o.loss_type != "simpo" && s->host.has("simpo_gamma"))
      throw std::invalid_argument("simpo_gamma applies to loss_type = \"simpo\"; " + o.loss_type +
                                  " ignores it in TRL: leave it out");
    *out = s.release();
    return TF_OK;
  });
}

tf_status run_step(void* state, tf_host_context* ctx, int64_t step, int64_t total,
                   tf_step_result* out) {
  auto* s = static_cast<Cpo*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    tf_preference::preference_step(
        *s, step, total, 2, "cpo", out,
        [&](const tf_sdk::Batch& batch, double scale, tf_preference::Metrics& metrics) {
          tf_preference::Terms terms;
          const tf_sdk::SequenceLogps pol = policy_logps(*s, batch, &terms);
          // d loss / d logps of the rows, by autograd on the loss itself.
          at::AutoGradMode grad(true);
          const at::Tensor rows = pol.logps.detach().clone().requires_grad_(true);
          const tf_preference::CpoResult r =
              tf_preference::cpo_loss(rows, pol.counts, batch.pairs(), s->options);
          r.loss.backward();
          tf_preference::Terms backward_terms{scale};
          s->passes.sequence_logps(batch, rows.grad() * scale, &backward_terms);
          add_metrics(metrics, r);
          tf_preference::add_terms_metric(metrics, terms.sum);
          return r.loss.item<double>() + terms.sum;
        });
    return TF_OK;
  });
}

tf_status eval_batch(void* state, tf_host_context* ctx, const tf_batch* lent, tf_pass_result* out) {
  auto* s = static_cast<Cpo*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const tf_sdk::Batch batch(s->host, lent);
    tf_preference::Terms terms;
    const tf_sdk::SequenceLogps pol = policy_logps(*s, batch, &terms);
    const double loss = tf_preference::cpo_loss(pol.logps, pol.counts, batch.pairs(), s->options)
                            .loss.item<double>() +
                        terms.sum;
    tf_preference::eval_result(loss, batch, out);
    return TF_OK;
  });
}

const std::vector<tf_config_key> kKeys = tf_sdk::with_lr_schedule_keys({
    tf_sdk::key("beta", TF_VALUE_FLOAT, "0.1",
                "the temperature of the preference term (TRL's CPOConfig beta)", 1e-6, 1e6),
    tf_sdk::key("loss_type", TF_VALUE_STRING, "\"sigmoid\"",
                "sigmoid (CPO), hinge, ipo (log-probs averaged per token) or simpo (SimPO: "
                "averaged, with the margin simpo_gamma)",
                1, 0, "sigmoid|hinge|ipo|simpo"),
    tf_sdk::key("label_smoothing", TF_VALUE_FLOAT, "0.0",
                "sigmoid and simpo: the assumed share of flipped labels", 0, 0.4999),
    tf_sdk::key("cpo_alpha", TF_VALUE_FLOAT, "1.0",
                "weight of the chosen completions' NLL (SimPO's paper uses 0)", 0, 1e6),
    tf_sdk::key("simpo_gamma", TF_VALUE_FLOAT, "0.5", "simpo: the target reward margin", 0, 1e6),
    tf_preference::accumulation_key(),
    tf_preference::concatenate_pairs_key(),
});

const tf_schedule_vtable kVtable = {.struct_size = sizeof(tf_schedule_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<Cpo>,
                                    .run_step = run_step,
                                    .estimate_memory = tf_preference::estimate_policy_passes<Cpo>,
                                    .save_state = tf_sdk::save_skipped_state<Cpo>,
                                    .load_state = tf_sdk::load_skipped_state<Cpo>,
                                    .eval_batch = eval_batch,
                                    .preference_tokenization = "joint"};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_SCHEDULE, "cpo", "1.0.0",
    "preference pairs without a reference model: CPO or SimPO, with the chosen NLL (TRL's "
    "CPOTrainer)",
    kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
