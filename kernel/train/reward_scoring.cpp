#include "reward_scoring.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernel_parts.hpp"
#include "plugin_set.hpp"
#include "prompt_data.hpp"
#include "reward_call.hpp"
#include "tensor_handle.hpp"
#include "training_data.hpp"

namespace tightfit {
namespace {

// How many rows at the start complete the same prompt (TRL's num_generations).
int32_t leading_group(const at::Tensor& row_ids) {
  const auto ids = row_ids.accessor<int64_t, 1>();
  int64_t g = 1;
  while (g < ids.size(0) && ids[g] == ids[0]) ++g;
  return static_cast<int32_t>(g);
}

}  // namespace

RewardScores score_completions(KernelParts& kernel, const at::Tensor& row_ids_in,
                               const at::Tensor& completions_in, const at::Tensor& lengths_in) {
  std::vector<RewardInstance>& rewards = kernel.plugins->rewards;
  if (rewards.empty())
    throw std::invalid_argument(
        "score_rewards: the recipe has no [[reward]] table: add one (plugin = \"length\", "
        "\"format\", \"exact_answer\" or your own reward plugin)");
  const auto* prompts = dynamic_cast<const PromptBatcher*>(&kernel.data->batcher());
  if (prompts == nullptr)
    throw std::invalid_argument("score_rewards: the run's data holds no prompt rows");
  const at::Tensor row_ids = row_ids_in.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor completions = completions_in.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor lengths = lengths_in.to(at::kCPU, at::kLong).contiguous();
  const int64_t n = row_ids.numel();
  if (row_ids.dim() != 1 || completions.dim() != 2 || completions.size(0) != n ||
      lengths.dim() != 1 || lengths.size(0) != n)
    throw std::invalid_argument(
        "score_rewards: row_ids [n], completions [n, C] and lengths [n] must agree");
  const int64_t C = completions.size(1);
  const auto len = lengths.accessor<int64_t, 1>();
  const auto rid = row_ids.accessor<int64_t, 1>();
  // Texts, ids (-1 past each end) and rows, alive for every reward's call
  // (and for one abandoned past its time limit).
  auto input = std::make_shared<RewardInput>();
  input->ids = at::full({n, C}, -1, at::kLong);
  input->lengths = lengths;
  for (int64_t i = 0; i < n; ++i) {
    if (len[i] < 0 || len[i] > C)
      throw std::invalid_argument("score_rewards: completion " + std::to_string(i) + "'s length " +
                                  std::to_string(len[i]) + " is not within its " +
                                  std::to_string(C) + " columns");
    const PromptRow& row = prompts->row(rid[i]);
    const at::Tensor own = completions[i].narrow(0, 0, len[i]);
    input->ids[i].narrow(0, 0, len[i]).copy_(own);
    const std::vector<int64_t> tokens(own.data_ptr<int64_t>(), own.data_ptr<int64_t>() + len[i]);
    input->prompts.push_back(row.text);
    // A continued assistant message's text comes first, as TRL's completions.
    input->completions.push_back(row.bootstrap +
                                 kernel.data->tokenizer().decode_skipping_special(tokens));
    input->rows.push_back(row.row);
  }
  input->group_size = n > 0 ? leading_group(row_ids) : 1;
  input->finish();
  const auto R = static_cast<int64_t>(rewards.size());
  // Row-major [n, R], filled reward by reward, one tensor at the end.
  std::vector<double> table(static_cast<size_t>(n * R), std::nan(""));
  std::vector<double> weights;
  for (int64_t r = 0; r < R; ++r) {
    RewardInstance& reward = rewards[static_cast<size_t>(r)];
    weights.push_back(reward.weight);
    const std::vector<double> scores = score_within_time_limit(reward, input);
    for (int64_t i = 0; i < n; ++i) {
      const double v = scores[static_cast<size_t>(i)];
      if (std::isinf(v))
        throw std::invalid_argument(
            "reward \"" + reward.name + "\" scored completion " + std::to_string(i) + " of " +
            prompts->row(rid[i]).where + " " + (v > 0 ? "+inf" : "-inf") +
            ": a reward is a finite number, or NaN for none; fix the reward (nothing was "
            "trained on this batch)");
      table[static_cast<size_t>(i * R + r)] = v;
    }
  }
  // A completion every reward passed over would train on a reward of 0.
  for (int64_t i = 0; i < n; ++i) {
    const double* row = table.data() + i * R;
    if (std::all_of(row, row + R, [](double v) { return std::isnan(v); }))
      throw std::invalid_argument(
          "no reward scored completion " + std::to_string(i) + " of " + prompts->row(rid[i]).where +
          " (each returned NaN, \"none\"): TRL would train it at a reward of 0 with a "
          "warning; give a reward that scores every row (nothing was trained on this batch)");
  }
  RewardScores out;
  out.scores = at::tensor(table, at::kDouble).view({n, R});
  out.weights = at::tensor(weights, at::kDouble);
  return out;
}

}  // namespace tightfit
