// Online RL's services (ABI 1.25): generate samples prompts' completions
// (1.27: several prompts' at once) with the policy as it is (completion_sampler.hpp), and
// score_rewards hands them to the recipe's [[reward]] plugins (reward_scoring.hpp).
#include <algorithm>
#include <cstddef>

#include "completion_sampler.hpp"
#include "host_api_services.hpp"
#include "prompt_data.hpp"
#include "reward_scoring.hpp"
#include "training_data.hpp"

namespace tightfit::host_services {
namespace {

// The run's prompt rows, which know the tokenizer's special ids.
const PromptBatcher& prompt_rows(const KernelParts& k) {
  const auto* prompts = k.data && k.data->has_batches()
                            ? dynamic_cast<const PromptBatcher*>(&k.data->batcher())
                            : nullptr;
  if (prompts == nullptr)
    throw std::invalid_argument(
        "generate: the run's data holds no prompt rows (a schedule with "
        "TF_SCHEDULE_FEATURE_PROMPTS gets them)");
  return *prompts;
}

// The request's prompts (1.27: n_prompts of them, one after another in
// `ids`) and each one's seed.
void read_prompts(const tf_generate_request& r, const at::Tensor& ids, CompletionRequest& c) {
  const int64_t* all = ids.data_ptr<int64_t>();
  if (r.n_prompts == 0) {  // one prompt (and every request before 1.27)
    c.prompts.emplace_back(all, all + ids.numel());
    c.seeds.push_back(r.seed);
    return;
  }
  require(r.prompt_lengths, "tf_generate_request.prompt_lengths");
  const at::Tensor lengths = handle_tensor(r.prompt_lengths).to(at::kCPU).contiguous();
  if (r.n_prompts < 0 || lengths.dim() != 1 || lengths.scalar_type() != at::kLong ||
      lengths.numel() != r.n_prompts)
    throw std::invalid_argument(
        "tf_generate_request.prompt_lengths must be int64 [n_prompts], n_prompts >= 0");
  int64_t from = 0;
  for (int64_t b = 0; b < r.n_prompts; ++b) {
    const int64_t len = lengths[b].item<int64_t>();
    if (len < 1 || len > ids.numel() - from)
      throw std::invalid_argument("tf_generate_request: prompt " + std::to_string(b) + " has " +
                                  std::to_string(len) +
                                  " ids, and each needs at least one of those `prompt` holds");
    c.prompts.emplace_back(all + from, all + from + len);
    c.seeds.push_back(r.prompt_seeds != nullptr ? r.prompt_seeds[b]
                                                : r.seed + static_cast<uint64_t>(b));
    from += len;
  }
  if (from != ids.numel())
    throw std::invalid_argument("tf_generate_request: prompt_lengths sum to " +
                                std::to_string(from) + ", and `prompt` holds " +
                                std::to_string(ids.numel()) + " ids");
}

}  // namespace

tf_status h_generate(tf_host_context* ctx, const tf_generate_request* in, tf_generate_result* out) {
  return serve(ctx, [&] {
    const tf_generate_request r = read_struct(in);
    check_size(out, "tf_generate_result");
    require(r.prompt, "tf_generate_request.prompt");
    if (!ctx->kernel->executor)
      throw std::invalid_argument("generate: no pass can run (a plan runs none)");
    if (!PluginCallScope::active())
      throw WrongPhase("generate is only served inside a call the host made to the plugin");
    const at::Tensor prompt = handle_tensor(r.prompt);
    if (prompt.dim() != 1 || prompt.scalar_type() != at::kLong)
      throw std::invalid_argument("tf_generate_request.prompt must be int64 [P]");
    CompletionRequest c;
    read_prompts(r, prompt.to(at::kCPU).contiguous(), c);
    c.n = r.n;
    c.max_new_tokens = r.max_new_tokens;
    // An older caller's request ends before 1.26's penalty and min-p: off.
    c.rule = {r.temperature, r.top_k, r.top_p, r.min_p,
              r.repetition_penalty == 0 ? 1.0 : r.repetition_penalty};
    if (r.n_stop_ids < 0 || (r.n_stop_ids > 0 && r.stop_ids == nullptr))
      throw std::invalid_argument("tf_generate_request: n_stop_ids stop ids must be given");
    const PromptBatcher& rows = prompt_rows(*ctx->kernel);
    c.stop_ids.assign(r.stop_ids, r.stop_ids + std::max<int32_t>(r.n_stop_ids, 0));
    if (c.stop_ids.empty() && rows.eos_id() >= 0) c.stop_ids.push_back(rows.eos_id());
    Completions done = sample_completions(*ctx->kernel, c, rows.pad_id());
    tf_generate_result g{};
    g.pad = done.pad;
    g.eos = rows.eos_id();
    g.pad_token = rows.pad_token_id();
    g.completions = give_handle(std::move(done.ids));
    g.lengths = give_handle(std::move(done.lengths));
    write_struct(out, g);
  });
}

tf_status h_score_rewards(tf_host_context* ctx, const tf_reward_request* in,
                          tf_reward_scores* out) {
  return serve(ctx, [&] {
    const tf_reward_request r = read_struct(in);
    check_size(out, "tf_reward_scores");
    require(r.row_ids, "tf_reward_request.row_ids");
    require(r.completions, "tf_reward_request.completions");
    require(r.lengths, "tf_reward_request.lengths");
    RewardScores s = score_completions(*ctx->kernel, handle_tensor(r.row_ids),
                                       handle_tensor(r.completions), handle_tensor(r.lengths));
    const std::vector<const char*>& names = ctx->kernel->plugins->reward_names;
    tf_reward_scores o{};
    o.count = static_cast<int32_t>(names.size());
    o.scores = give_handle(std::move(s.scores));
    o.weights = give_handle(std::move(s.weights));
    o.names = names.data();
    write_struct(out, o);
  });
}

}  // namespace tightfit::host_services
