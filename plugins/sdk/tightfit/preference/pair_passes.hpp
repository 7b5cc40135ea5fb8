// How a paired schedule (dpo, cpo, orpo) runs a batch's chosen and rejected
// rows. TRL's trainers concatenate them into one pass (concatenated_forward):
// the default. With [schedule] concatenate_pairs = false each pass runs the
// chosen rows first and the rejected rows after, each time with the other
// side's targets masked, so that the host leaves those rows out of the pass
// (token_logps runs only rows with a target): a backward keeps half the
// batch's activations, for the same log-probs (each row is scored on its own
// either way) and the same gradients, summed in another order.
//
// Each pass is one run_pass (ABI 1.20): its terms, mean logits and weights
// are its own, with nothing armed or switched around it.
//
// A model's own loss term (a mixture of experts' load-balancing loss, ABI
// 1.18): TRL adds aux_loss_coef * aux_loss of the policy's
// concatenated pass to its loss, and none of the reference model's. So the
// policy's passes take it (Terms) when the pairs run concatenated, and the
// reference's take it and drop it. One side after the other, the two
// passes' terms would not add up to the concatenated pass's (the routers'
// balance is over the whole batch): then no pass takes them, and the host
// refuses a model that adds one, naming it.
#pragma once

#include <ATen/ATen.h>

#include <cmath>

#include "tightfit/plugin_sdk.hpp"
#include "tightfit/preference/preference_loss.hpp"

namespace tf_preference {

// A policy pass's loss terms: `sum` their value, back-propagated (in a
// backward) with `grad_weight`, the weight the pass's loss has.
struct Terms {
  double grad_weight = 0;
  double sum = 0;
};

// A policy pass's logits averaged over the vocabulary at each position
// (ABI 1.19's take_mean_logits): fp32 [2P, T]; undefined on an older host.
// TRL's DPOTrainer logs their mean over each side's completion tokens as
// logits/chosen and logits/rejected.
struct MeanLogits {
  at::Tensor per_token;
  // The mean over side `side`'s counted targets (0 chosen, 1 rejected);
  // NaN where there is none or nothing was measured. With `answer_first`
  // (int64 [2P]), as DPOTrainer's rolled loss mask counts them: a row whose
  // first token is its answer's counts the batch's last column too.
  double of_side(const at::Tensor& targets, int64_t pairs, int64_t side,
                 const at::Tensor& answer_first = {}) const {
    if (!per_token.defined()) return std::nan("");
    at::Tensor counted = targets.narrow(0, side * pairs, pairs).to(at::kCPU).ne(kIgnoreIndex);
    if (answer_first.defined() && counted.size(1) > 0) {
      counted = counted.clone();
      counted.select(1, counted.size(1) - 1)
          .logical_or_(answer_first.narrow(0, side * pairs, pairs).to(at::kCPU).ne(0));
    }
    const int64_t n = counted.sum().item<int64_t>();
    if (n == 0) return std::nan("");
    return (per_token.narrow(0, side * pairs, pairs) * counted).sum(at::kDouble).item<double>() /
           static_cast<double>(n);
  }
};

class PairPasses {
 public:
  static PairPasses read(const tf_sdk::Host& host) {
    return PairPasses(host.get_bool("concatenate_pairs"));
  }

  // Each target's log-probability of `targets` (the batch's own when
  // undefined), with the backward of sum weights * logps when `weights`
  // (fp32 [2P, T]) is given; the policy's `terms` taken when concatenated.
  // With `means`, each position's mean logit too. `with`: the weights the
  // passes read (the reference's).
  at::Tensor token_logps(const tf_sdk::Batch& b, const at::Tensor& targets = {},
                         const at::Tensor& weights = {}, Terms* terms = nullptr,
                         MeanLogits* means = nullptr, const tf_sdk::PassWeights& with = {}) const {
    if (concatenated_)
      return pass(b, TF_PASS_TOKEN_LOGPS, targets, weights, terms, means, with).logps;
    const at::Tensor all = targets.defined() ? targets : b.targets();
    const int64_t pairs = b.pairs();
    at::Tensor sum;
    MeanLogits side_means[2];
    for (int64_t side = 0; side < 2; ++side) {
      at::Tensor own = at::full_like(all, kIgnoreIndex);
      own.narrow(0, side * pairs, pairs).copy_(all.narrow(0, side * pairs, pairs));
      // The other side's rows score exactly 0: adding them keeps this side's.
      const at::Tensor part = pass(b, TF_PASS_TOKEN_LOGPS, own, weights, nullptr,
                                   means ? &side_means[side] : nullptr, with)
                                  .logps;
      sum = side == 0 ? part : sum + part;
    }
    if (means && side_means[0].per_token.defined() && side_means[1].per_token.defined())
      means->per_token = side_means[0].per_token + side_means[1].per_token;
    return sum;
  }

  // Each row's summed log-probability and target count, as
  // Batch::sequence_logps, with the backward of sum row_weights * logps when
  // `row_weights` (fp32 [2P]) is given.
  tf_sdk::SequenceLogps sequence_logps(const tf_sdk::Batch& b, const at::Tensor& row_weights = {},
                                       Terms* terms = nullptr, MeanLogits* means = nullptr,
                                       const tf_sdk::PassWeights& with = {}) const {
    if (concatenated_) {
      tf_sdk::Batch::PassResult r =
          pass(b, TF_PASS_SEQUENCE_LOGPS, {}, row_weights, terms, means, with);
      return {std::move(r.logps), std::move(r.counts)};
    }
    const at::Tensor& targets = b.targets();
    const at::Tensor weights =
        row_weights.defined()
            ? row_weights.to(at::kFloat).unsqueeze(1).expand(targets.sizes()).contiguous()
            : at::Tensor();
    return {token_logps(b, {}, weights, nullptr, means, with).sum(1),
            targets.ne(kIgnoreIndex).sum(1).to(at::kCPU, at::kLong)};
  }

  // The reference model's log-probs, one pass over the whole batch read
  // `with` its weights: the terms its model adds are taken and dropped (TRL
  // adds the policy's only).
  static tf_sdk::SequenceLogps whole_batch_reference_logps(const tf_sdk::Batch& b,
                                                           const tf_sdk::PassWeights& with) {
    Terms dropped;  // grad_weight 0
    tf_sdk::Batch::PassResult r = pass(b, TF_PASS_SEQUENCE_LOGPS, {}, {}, &dropped, nullptr, with);
    return {std::move(r.logps), std::move(r.counts)};
  }
  tf_sdk::SequenceLogps reference_logps(const tf_sdk::Batch& b,
                                        const tf_sdk::PassWeights& with) const {
    if (concatenated_) return whole_batch_reference_logps(b, with);
    return sequence_logps(b, {}, nullptr, nullptr, with);
  }

  // The plan: a backward keeps one side's activations, half the batch's.
  void estimate(const tf_model_summary* model, tf_memory_estimate* out) const {
    if (!concatenated_) plan_half_the_activations(model, out);
  }

 private:
  explicit PairPasses(bool concatenated) : concatenated_(concatenated) {}
  // One log-probs pass (run_pass): of `targets` (the batch's when
  // undefined), with the backward of sum weights * logps when `weights` is
  // given, taking the model's terms into `terms` and the mean logits into
  // `means` when asked, read `with` the given weights.
  static tf_sdk::Batch::PassResult pass(const tf_sdk::Batch& b, tf_pass_compute what,
                                        const at::Tensor& targets, const at::Tensor& weights,
                                        Terms* terms, MeanLogits* means,
                                        const tf_sdk::PassWeights& with) {
    tf_pass p = b.new_pass(what);
    if (targets.defined()) p.targets = tf_sdk::lend(targets);
    if (weights.defined()) {
      p.backward = 1;
      p.grad_weights = tf_sdk::lend(weights);
    }
    if (terms) {
      p.take_loss_terms = 1;
      p.loss_terms_grad_weight = terms->grad_weight;
    }
    p.mean_logits = means ? 1 : 0;
    with.apply(p);
    tf_sdk::Batch::PassResult r = b.run(p);
    if (terms) terms->sum = r.raw.loss_terms;
    if (means) means->per_token = r.mean_logits;
    return r;
  }
  bool concatenated_ = true;
};

inline tf_config_key concatenate_pairs_key() {
  return tf_sdk::key("concatenate_pairs", TF_VALUE_BOOL, "true",
                     "a batch's chosen and rejected rows in one pass (TRL's concatenated_forward); "
                     "false: the chosen rows' pass, then the rejected rows', each backward "
                     "keeping half the activations, for the same log-probs and gradients");
}

}  // namespace tf_preference
