// Kahneman-Tversky Optimization (Ethayarajh et al. 2024) as TRL 0.24's
// KTOTrainer computes it, on unpaired preference rows: each completion
// labelled desirable or not ([data] rows with "prompt", "completion" and
// "label", or pairs unpaired), each with a KL row (its prompt with another
// completion of its batch; kto_data.hpp). Each step:
//   reference log-probs  no gradients, from the reference model (with
//                        adapters the base with them off, else the weights
//                        before the first update: reference_model.hpp), of
//                        the completions and the KL rows;
//   policy log-probs     the same rows, no gradients;
//   KL estimate          mean(policy - reference) over the KL rows, the
//                        ranks' mean, clamped at 0: detached, as TRL's;
//   loss                 1 - sigmoid(beta (logratio - KL)) for a desirable
//                        completion, 1 - sigmoid(beta (KL - logratio)) for
//                        an undesirable one, weighted, their mean; or
//                        apo_zero_unpaired's (no KL rows scored);
//   backward             token_logps over the completions alone (the KL
//                        rows' targets masked: no gradient reaches them, and
//                        the host leaves rows without a target out of the
//                        pass) with d loss / d logps as weights.
#include <cmath>
#include <memory>

#include "tightfit/lr_schedule.hpp"
#include "tightfit/preference/micro_batches.hpp"
#include "tightfit/preference/precomputed_reference.hpp"
#include "tightfit/preference/preference_loss.hpp"
#include "tightfit/preference/reference_model.hpp"
#include "tightfit/preference/schedule_hooks.hpp"

namespace {

using tf_preference::kIgnoreIndex;

struct Kto {
  tf_sdk::Host host;
  tf_sdk::LrSchedule lr;
  tf_preference::KtoOptions options;
  int32_t accumulation = 1;
  int64_t skipped = 0;
  tf_preference::ReferenceModel reference{"kto"};
  // precompute_ref_log_probs: every row's and KL row's reference log-probs,
  // computed before the first update.
  bool precompute = false;
  tf_preference::PrecomputedReference table;
};

void prepare_reference(Kto& s, int64_t step) {
  tf_preference::prepare_reference(s.host, s.reference, s.precompute ? &s.table : nullptr, step,
                                   "kto");
}

// The batch's targets with the KL rows' (rows [n, 2n)) ignored.
at::Tensor completion_targets(const tf_sdk::Batch& b) {
  at::Tensor targets = b.targets().clone();
  targets.narrow(0, b.pairs(), b.pairs()).fill_(kIgnoreIndex);
  return targets;
}

struct Scores {
  at::Tensor policy, reference;  // the completions' summed log-probs [n]
  at::Tensor desirable;          // bool [n]
  double kl = 0;                 // detached, the ranks' mean, clamped at 0
};

Scores score(Kto& s, const tf_sdk::Batch& b, bool across_ranks) {
  const int64_t n = b.pairs();
  const at::Tensor desirable = b.desirable();
  if (n <= 0 || !desirable.defined())
    throw std::invalid_argument(
        "schedule kto trains on unpaired preference rows, and this batch holds none: give [data] "
        "corpus rows with \"prompt\", \"completion\" and \"label\" (or \"chosen\" and "
        "\"rejected\", which it unpairs)");
  // Without the KL term the KL rows go unscored (the host skips rows
  // whose targets are all ignored).
  const bool kl_rows = tf_preference::reads_kl(s.options);
  const at::Tensor targets = kl_rows ? b.targets() : completion_targets(b);
  auto sums = [&](const tf_sdk::PassWeights& w) { return b.token_logps(targets, {}, w).sum(1); };
  const at::Tensor ref = s.precompute ? s.table.of(b).logps : s.reference.run(s.host, sums);
  const at::Tensor pol = sums({});
  Scores r;
  r.policy = pol.narrow(0, 0, n);
  r.reference = ref.narrow(0, 0, n);
  r.desirable = desirable.to(at::kBool);
  if (kl_rows) {
    at::Tensor kl = (pol.narrow(0, n, n) - ref.narrow(0, n, n)).mean().to(at::kDouble);
    const tf_run_info info = s.host.run_info();
    if (across_ranks && info.world_size > 1) {
      kl = kl.reshape({1}).to(at::Device(info.device));
      s.host.all_reduce(kl, TF_REDUCE_AVG);
      kl = kl.cpu();
    }
    r.kl = std::max(0.0, kl.item<double>());
  }
  return r;
}

// What TRL stores each micro-batch: sums and counts per side, so that the
// logged value is their ratio over the step (KTOTrainer.log).
void add_metrics(tf_preference::Metrics& m, const tf_preference::KtoResult& r, double kl) {
  m["kl"] = kl;
  m["count/chosen"] = static_cast<double>(r.chosen_rewards.numel());
  m["count/rejected"] = static_cast<double>(r.rejected_rewards.numel());
  m["rewards/chosen_sum"] = r.chosen_rewards.nansum().item<double>();
  m["rewards/rejected_sum"] = r.rejected_rewards.nansum().item<double>();
  m["logps/chosen_sum"] = r.chosen_logps.nansum().item<double>();
  m["logps/rejected_sum"] = r.rejected_logps.nansum().item<double>();
}

// The step's sums over its counts (the micro-batches' and ranks' means of
// both: their ratio is the same), margins where both sides were seen.
void finish_metrics(tf_preference::Metrics& m) {
  for (const char* side : {"chosen", "rejected"}) {
    const std::string s = side;
    const double count = m["count/" + s];
    for (const char* metric : {"rewards/", "logps/"}) {
      const std::string sum = metric + s + "_sum";
      if (count > 0) m[metric + s] = m[sum] / count;
      m.erase(sum);
    }
    m.erase("count/" + s);
  }
  if (m.count("rewards/chosen") && m.count("rewards/rejected"))
    m["rewards/margins"] = m["rewards/chosen"] - m["rewards/rejected"];
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Kto>(Kto{tf_sdk::Host(api, ctx)});
    s->lr = tf_sdk::LrSchedule::read(s->host);
    s->options.beta = s->host.get_double("beta");
    s->options.loss_type = s->host.get_string("loss_type");
    s->options.desirable_weight = s->host.get_double("desirable_weight");
    s->options.undesirable_weight = s->host.get_double("undesirable_weight");
    s->accumulation = static_cast<int32_t>(s->host.get_int("gradient_accumulation_steps"));
    s->precompute = s->host.get_bool("precompute_ref_log_probs");
    s->reference.read(s->host, s->precompute);
    // A batch's KL rows are its own completions shifted by one: with one
    // row, the KL term is the row's own reward (TRL refuses it too).
    const tf_run_info info = s->host.run_info();
    if (tf_preference::reads_kl(s->options) && info.batch_size > 0 && info.batch_size / 2 <= 1)
      throw std::invalid_argument(
          "loss_type = \"kto\" estimates the KL term from the other completions of a batch, and "
          "[data] batch_size = 1 has none (TRL's KTOTrainer refuses it too): set batch_size = 2 "
          "or more, or loss_type = \"apo_zero_unpaired\"");
    *out = s.release();
    return TF_OK;
  });
}

tf_status run_step(void* state, tf_host_context* ctx, int64_t step, int64_t total,
                   tf_step_result* out) {
  auto* s = static_cast<Kto*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    prepare_reference(*s, step);
    tf_preference::preference_step(
        *s, step, total, 3, "kto", out,
        [&](const tf_sdk::Batch& batch, double scale, tf_preference::Metrics& metrics) {
          const Scores sc = score(*s, batch, /*across_ranks=*/true);
          // d loss / d logps of the completions, by autograd on the loss itself.
          at::AutoGradMode grad(true);
          const at::Tensor rows = sc.policy.detach().clone().requires_grad_(true);
          const tf_preference::KtoResult r =
              tf_preference::kto_loss(rows, sc.reference, sc.desirable, sc.kl, s->options);
          r.loss.backward();
          // Each completion's weight on its every token; the KL rows none.
          const at::Tensor targets = completion_targets(batch);
          const at::Tensor weights = at::zeros(targets.sizes(), at::kFloat);
          weights.narrow(0, 0, batch.pairs())
              .copy_((rows.grad() * scale).unsqueeze(1).expand({batch.pairs(), targets.size(1)}));
          batch.token_logps(targets, weights);
          add_metrics(metrics, r, sc.kl);
          return r.loss.item<double>();
        },
        finish_metrics);
    return TF_OK;
  });
}

tf_status eval_batch(void* state, tf_host_context* ctx, const tf_batch* lent, tf_pass_result* out) {
  auto* s = static_cast<Kto*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const tf_sdk::Batch batch(s->host, lent);
    prepare_reference(*s, -1);
    const Scores sc = score(*s, batch, /*across_ranks=*/false);
    tf_preference::eval_result(
        tf_preference::kto_loss(sc.policy, sc.reference, sc.desirable, sc.kl, s->options)
            .loss.item<double>(),
        batch, out);
    return TF_OK;
  });
}

// Two gradient-free forwards over the completions and their KL rows, one
// forward and backward over the completions, against the plain step's
// forward and backward of every row (a backward ~ two forwards).
// The backward keeps the activations of the completions alone: half the
// batch's rows (the KL rows are scored without gradients).
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary* model,
                          tf_memory_estimate* out) {
  auto* s = static_cast<Kto*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    tf_preference::plan_micro_batches((s->precompute ? 1.0 : 2.0) + 1.5, s->accumulation, out);
    tf_preference::plan_half_the_activations(model, out);
    if (!s->precompute) s->reference.plan(s->host, out);
    return TF_OK;
  });
}

const std::vector<tf_config_key> kKeys = tf_sdk::with_lr_schedule_keys({
    tf_sdk::key("beta", TF_VALUE_FLOAT, "0.1",
                "how far from the reference the policy may move (TRL's beta)", 1e-6, 1e6),
    tf_sdk::key("loss_type", TF_VALUE_STRING, "\"kto\"",
                "kto (against the KL estimate of the batch's KL rows) or apo_zero_unpaired "
                "(no KL term)",
                1, 0, "kto|apo_zero_unpaired"),
    tf_sdk::key("desirable_weight", TF_VALUE_FLOAT, "1.0",
                "weight of the desirable completions' losses (TRL's desirable_weight)", 0, 1e6),
    tf_sdk::key("undesirable_weight", TF_VALUE_FLOAT, "1.0",
                "weight of the undesirable completions' losses (TRL's undesirable_weight)", 0, 1e6),
    tf_preference::accumulation_key(),
    tf_preference::precompute_key(),
    tf_preference::reference_tier_key(),
});

const tf_schedule_vtable kVtable = {.struct_size = sizeof(tf_schedule_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<Kto>,
                                    .run_step = run_step,
                                    .estimate_memory = estimate_memory,
                                    .save_state = tf_preference::save_reference_state<Kto>,
                                    .load_state = tf_preference::load_reference_state<Kto>,
                                    .eval_batch = eval_batch,
                                    .preference_tokenization = "kto"};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_SCHEDULE, "kto", "1.0.0",
    "unpaired preference rows (prompt, completion, label; or pairs unpaired): KTO or APO-zero "
    "loss against a reference model, the base with adapters off or a full fine-tune's starting "
    "weights (TRL's KTOTrainer)",
    kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
