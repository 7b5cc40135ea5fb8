// TRL's gradient_accumulation_steps for a preference schedule: a step runs
// `count` micro-batches of batch_size pairs, each one's loss divided by
// count before its backward (transformers' Trainer scaling, which TRL's
// preference trainers keep by setting model_accepts_loss_kwargs = False),
// and logs each metric as the mean over the micro-batches, as TRL's
// store_metrics and log average what they stored; across ranks, the
// loss and the metrics are the ranks' means, as TRL gathers them. Memory is
// one micro-batch's (plus the gradients kept between them).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tightfit/plugin_sdk.hpp"

namespace tf_preference {

using Metrics = std::map<std::string, double>;

// The metrics every TRL preference trainer logs, from the rewards (beta
// times what each trainer calls them) and the log-probs its loss used.
inline void add_reward_metrics(Metrics& m, const at::Tensor& chosen_rewards,
                               const at::Tensor& rejected_rewards, const at::Tensor& chosen_logps,
                               const at::Tensor& rejected_logps) {
  m["rewards/chosen"] = chosen_rewards.mean().item<double>();
  m["rewards/rejected"] = rejected_rewards.mean().item<double>();
  m["rewards/accuracies"] =
      chosen_rewards.gt(rejected_rewards).to(at::kFloat).mean().item<double>();
  m["rewards/margins"] = (chosen_rewards - rejected_rewards).mean().item<double>();
  m["logps/chosen"] = chosen_logps.mean().item<double>();
  m["logps/rejected"] = rejected_logps.mean().item<double>();
}

// The model's own loss terms that the policy's pass added (a mixture of
// experts' router_aux_loss_coef * aux_loss: TRL logs the aux_loss without
// its coefficient), when it added any.
inline void add_terms_metric(Metrics& m, double terms) {
  if (terms != 0) m["aux_loss_term"] = terms;
}

struct AccumulatedStep {
  double loss = 0;  // the mean of the micro-batches' losses
  int64_t n_tokens = 0;
};

// `pass(batch, scale, metrics)` runs one micro-batch: its backward with the
// loss times `scale`, its metrics into `metrics`; returns its loss.
// `finish(metrics)`, when given, turns the averaged metrics into those
// logged (KTO's sums over counts) after the ranks' mean.
template <class Pass, class Finish>
AccumulatedStep accumulate_pairs(const tf_sdk::Host& host, int32_t count, Pass&& pass,
                                 Finish&& finish) {
  AccumulatedStep step;
  Metrics sums;
  for (int32_t i = 0; i < count; ++i) {
    // Strategies that update as gradients arrive wait for the last one.
    if (count > 1) host.set_micro_batch(i, count);
    const tf_sdk::Batch batch(host);
    Metrics metrics;
    step.loss += pass(batch, 1.0 / count, metrics) / count;
    step.n_tokens += batch.n_tokens();
    for (const auto& [key, value] : metrics) sums[key] += value / count;
  }
  const tf_run_info info = host.run_info();
  if (info.world_size > 1) {
    // Each rank scored its own pairs. TRL logs the ranks' mean loss and
    // every metric over all ranks' pairs (equal on each: the ranks' mean).
    std::vector<double> values{step.loss};
    for (const auto& [key, value] : sums) values.push_back(value);
    at::Tensor all = at::tensor(values, at::kDouble).to(at::Device(info.device));
    host.all_reduce(all, TF_REDUCE_AVG);
    all = all.cpu();
    step.loss = all[0].item<double>();
    int64_t i = 1;
    for (auto& [key, value] : sums) value = all[i++].item<double>();
  }
  finish(sums);
  for (const auto& [key, value] : sums) host.log_metric(key, value);
  return step;
}

template <class Pass>
AccumulatedStep accumulate_pairs(const tf_sdk::Host& host, int32_t count, Pass&& pass) {
  return accumulate_pairs(host, count, std::forward<Pass>(pass), [](Metrics&) {});
}

// The key every preference schedule reads (TRL's name).
inline tf_config_key accumulation_key() {
  return tf_sdk::key("gradient_accumulation_steps", TF_VALUE_INT, "1",
                     "micro-batches of data.batch_size pairs whose gradients make one update "
                     "(each loss divided by their count, as TRL's trainers)",
                     1, 1e6);
}

// TRL's precompute_ref_log_probs (precomputed_reference.hpp).
inline tf_config_key precompute_key() {
  return tf_sdk::key("precompute_ref_log_probs", TF_VALUE_BOOL, "false",
                     "the reference model's log-probs of every row computed once before the "
                     "first update, then looked up: no reference pass a step and, for a full "
                     "fine-tune, no copy of the model (TRL's precompute_ref_log_probs)");
}

}  // namespace tf_preference
