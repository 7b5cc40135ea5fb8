// The parts every preference schedule's hooks share, written once: a paired
// batch checked for pairs, run_step's and eval_batch's results, the plan's
// time and gradients over micro-batches, and the checkpointed state of a
// schedule with a reference model. dpo, cpo, orpo and kto use them, and so
// can a schedule built outside this tree against the installed SDK.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "tightfit/lr_schedule.hpp"
#include "tightfit/plugin_sdk.hpp"
#include "tightfit/preference/micro_batches.hpp"
#include "tightfit/preference/pair_passes.hpp"
#include "tightfit/preference/precomputed_reference.hpp"
#include "tightfit/preference/reference_model.hpp"

namespace tf_preference {

// A paired schedule's batch: its chosen rows, then as many rejected ones.
// Refused, naming the schedule, when it holds no pairs.
inline int64_t require_pairs(const tf_sdk::Batch& batch, const std::string& schedule) {
  if (batch.pairs() <= 0)
    throw std::invalid_argument("schedule " + schedule +
                                " trains on preference pairs, and this batch has none: give "
                                "[data] corpus rows with \"chosen\" and \"rejected\"");
  return batch.pairs();
}

// run_step's result for a step of `accumulation` micro-batches, each
// `forwards` forward passes and one backward.
inline void step_result(const AccumulatedStep& done, int32_t accumulation, int32_t forwards,
                        double lr, const char* phase, tf_step_result* out) {
  out->loss = done.loss;
  out->n_tokens = done.n_tokens;
  out->backward_passes = accumulation;
  out->forward_passes = forwards * accumulation;
  out->lr = lr;
  out->phase = phase;
}

// run_step's body: the learning rate, the gradients zeroed, the step's
// micro-batches through `pass` (accumulate_pairs: `pass(batch, scale,
// metrics)` returns its loss; `finish(metrics)` what is logged), the update
// or its skip, and the result, each micro-batch `forwards` forward passes
// and one backward. S has `Host host`, `LrSchedule lr`, `int32_t
// accumulation` and `int64_t skipped`.
template <class S, class Pass, class Finish>
void preference_step(S& s, int64_t step, int64_t total, int32_t forwards, const char* phase,
                     tf_step_result* out, Pass&& pass, Finish&& finish) {
  const double lr = s.lr.apply(s.host, step, total);
  s.host.zero_grad();
  const AccumulatedStep done = accumulate_pairs(s.host, s.accumulation, std::forward<Pass>(pass),
                                                std::forward<Finish>(finish));
  tf_sdk::step_or_skip(s.host, step, s.skipped);
  step_result(done, s.accumulation, forwards, lr, phase, out);
}
template <class S, class Pass>
void preference_step(S& s, int64_t step, int64_t total, int32_t forwards, const char* phase,
                     tf_step_result* out, Pass&& pass) {
  preference_step(s, step, total, forwards, phase, out, std::forward<Pass>(pass), [](Metrics&) {});
}

// eval_batch's result: the batch's loss, its tokens, whether it is finite.
inline void eval_result(double loss, const tf_sdk::Batch& batch, tf_pass_result* out) {
  out->loss = loss;
  out->n_tokens = batch.n_tokens();
  out->finite = std::isfinite(loss) ? 1 : 0;
}

// estimate_memory's time and gradients for `accumulation` micro-batches of
// `forwards` forward-pass equivalents each (a backward is about two),
// against the plain step's forward and backward (three). The gradients of
// the earlier micro-batches live through the later ones.
inline void plan_micro_batches(double forwards, int32_t accumulation, tf_memory_estimate* out) {
  out->time_factor = forwards / 3.0 * accumulation;
  if (accumulation > 1) out->grads_in_forward = 1;
}

// estimate_memory of a pair schedule without a reference model (cpo,
// orpo): its pair passes' activations, and two forwards (policy, policy
// again) and one backward a micro-batch. S has `Host host`, `PairPasses
// passes` and `int32_t accumulation`.
template <class S>
tf_status estimate_policy_passes(void* state, tf_host_context* ctx, const tf_model_summary* model,
                                 tf_memory_estimate* out) {
  auto* s = static_cast<S*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->passes.estimate(model, out);
    plan_micro_batches(4.0, s->accumulation, out);
    return TF_OK;
  });
}

// save_state / load_state of a schedule with a reference model: S has
// `Host host`, `int64_t skipped`, `bool precompute`, `ReferenceModel
// reference` and `PrecomputedReference table`. The checkpoint carries the
// skipped steps, a full fine-tune's reference copy and the precomputed
// reference log-probs.
template <class S>
tf_status save_reference_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<S*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->host.save_double("skipped", static_cast<double>(s->skipped));
    s->reference.save(s->host);
    s->table.save(s->host);
    return TF_OK;
  });
}
template <class S>
tf_status load_reference_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<S*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->skipped = static_cast<int64_t>(s->host.saved_double("skipped"));
    if (!s->precompute)
      s->reference.load(s->host);
    else if (!load_reference_table(s->host, s->reference, s->table, s->reference.schedule()))
      throw std::runtime_error(
          "the checkpoint holds no precomputed reference log-probs (it was saved without "
          "precompute_ref_log_probs): resume with the recipe that saved it");
    return TF_OK;
  });
}

}  // namespace tf_preference
