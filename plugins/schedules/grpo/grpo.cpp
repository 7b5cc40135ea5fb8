// Group Relative Policy Optimization as TRL 0.24's GRPOTrainer runs it: the
// schedule samples its own completions of [data] prompt rows and trains on
// their rewards. Each generation (every steps_per_generation x
// num_iterations micro-batches, as TRL's; steps_per_generation is
// gradient_accumulation_steps unless given):
//   sample     each prompt's num_generations completions, a batch's prompts
//              together, with the policy as it is (the host's generate:
//              temperature, top_k, top_p, max_completion_length, stop at
//              EOS); or, with
//              completions_file, read from it (a test mode: TRL's parity);
//   score      the recipe's [[reward]] plugins, weighted and summed (NaN
//              rewards left out of the sum, as TRL's nansum);
//   advantages each reward less its group's mean, scaled (scale_rewards);
//   old, ref   the sampling policy's log-probs (when a generation outlives
//              an update: TRL's gradient_accumulation_steps not a multiple
//              of steps_per_generation x num_iterations) and the
//              reference's (beta != 0: adapters off, or the copies);
// and each micro-batch the clipped surrogate (grpo_loss.hpp), whose
// gradient with respect to the policy's per-token log-probs the host's
// token log-probs pass back-propagates. With beta = 0 and one iteration the
// importance ratio is 1 at any log-prob, so that gradient is known before
// the pass: one forward and backward, as TRL's.
#include <cmath>
#include <memory>
#include <optional>

#include "given_completions.hpp"
#include "tightfit/lr_schedule.hpp"
#include "tightfit/preference/micro_batches.hpp"
#include "tightfit/preference/reference_model.hpp"
#include "tightfit/preference/schedule_hooks.hpp"
#include "tightfit/rl/grpo_loss.hpp"
#include "tightfit/rl/online_rl.hpp"

namespace {

using tf_preference::Metrics;

// One micro-batch of a generation: its prompt + completion rows and what
// the loss reads of them.
struct Chunk {
  tf_rl::ScoredRows rows;
  at::Tensor valid;       // fp32 [n, C]: 1 on each completion's tokens
  at::Tensor mask;        // fp32 [n, C]: TRL's completion mask (truncated rows 0 when masked)
  at::Tensor advantages;  // fp32 [n]
  at::Tensor old, ref;    // fp32 [n, C], or undefined
};

struct Grpo {
  tf_sdk::Host host;
  tf_sdk::LrSchedule lr;
  tf_rl::GrpoOptions options;
  tf_rl::Sampling sampling;
  tf_rl::ScaleRewards scale = tf_rl::ScaleRewards::kGroup;
  int64_t num_iterations = 1;
  int32_t accumulation = 1;
  int32_t steps_per_generation = 1;  // micro-batches a generation samples
  bool mask_truncated = false;
  int64_t skipped = 0;
  int64_t micro_steps = 0;   // TRL's _step: micro-batches trained so far
  int64_t prompts_done = 0;  // prompts sampled so far (the completions file's line)
  double tokens_seen = 0;    // TRL's num_input_tokens_seen
  int64_t eos = -1, pad_token = -1;
  bool special_ids_known = false;
  std::optional<GivenCompletions> given;  // completions_file's, in its test mode
  uint64_t seed = 0;                      // the run's seed
  tf_preference::ReferenceModel reference{"grpo"};
  std::vector<Chunk> buffer;  // the current generation's micro-batches
  double buffer_tokens = 0;   // its completion tokens (TRL's num_items_in_batch)
};

// Whether a generation's completions train after an update of the policy
// that sampled them, so the ratio needs its log-probs kept (TRL's rule:
// gradient_accumulation_steps not a multiple of the generation's span).
bool keeps_old(const Grpo& s) {
  return s.accumulation % (static_cast<int64_t>(s.steps_per_generation) * s.num_iterations) != 0;
}

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 29);
}

// The tokenizer's EOS and pad ids, as the host's generate reports them
// (with completions_file, from one greedy token of the first prompt).
void learn_special_ids(Grpo& s, const tf_rl::Sampled& got) {
  s.eos = got.eos;
  s.pad_token = got.pad_token;
  s.special_ids_known = true;
}

// A chunk's completion log-probs [n, C] from a pass's [n, T].
at::Tensor at_completions(const Chunk& c, const at::Tensor& per_position) {
  return per_position.gather(1, c.rows.positions) * c.valid;
}

// A no-gradient token pass over a chunk's rows with `weights`.
tf_sdk::Batch::PassResult score_rows(Grpo& s, const Chunk& c, const tf_sdk::PassWeights& weights,
                                     bool entropies) {
  const tf_sdk::Batch rows(s.host, c.rows.tokens, c.rows.targets, c.rows.attention_mask);
  tf_pass pass = rows.new_pass(TF_PASS_TOKEN_LOGPS);
  pass.temperature = s.sampling.temperature;
  pass.entropies = entropies ? 1 : 0;
  weights.apply(pass);
  return rows.run(pass);
}

// TRL's nanstd: the unbiased deviation of the values that are not NaN.
double nanstd(const at::Tensor& x) {
  const at::Tensor v = x.masked_select(~x.isnan());
  return v.numel() > 1 ? v.std().item<double>() : std::nan("");
}

// Samples and scores one generation: steps_per_generation micro-batches of
// batch_size prompts x num_generations completions; its metrics into `m`.
void generate(Grpo& s, Metrics& m) {
  const int64_t G = s.sampling.n;
  struct Part {
    std::vector<at::Tensor> prompt_of;
    at::Tensor ids, lengths, row_ids;
  };
  std::vector<Part> parts;
  std::vector<at::Tensor> all_scores;
  std::vector<std::string> names;
  at::Tensor weights;
  int64_t prompt_tokens = 0;
  for (int32_t k = 0; k < s.steps_per_generation; ++k) {
    const tf_sdk::Batch prompts(s.host);
    if (prompts.prompts() <= 0)
      throw std::invalid_argument(
          "grpo samples completions of prompts, and this batch holds none: give [data] rows "
          "with a \"prompt\" and no answer");
    const at::Tensor row_ids = prompts.row_ids().to(at::kCPU);
    Part part;
    std::vector<at::Tensor> prompts_of_batch;
    std::vector<uint64_t> seeds;
    for (int64_t r = 0; r < prompts.prompts(); ++r) {
      const at::Tensor prompt = tf_rl::prompt_ids(prompts, r);
      seeds.push_back(mix(s.seed, static_cast<uint64_t>(s.prompts_done++)));
      for (int64_t g = 0; g < G; ++g) part.prompt_of.push_back(prompt);
      prompt_tokens += G * prompt.size(0);
      prompts_of_batch.push_back(prompt);
    }
    if (!s.given) {  // the batch's prompts sampled together, each with its own seed
      tf_rl::Sampled got = tf_rl::generate(s.host, prompts_of_batch, s.sampling, seeds);
      learn_special_ids(s, got);
      part.ids = got.ids;
      part.lengths = got.lengths;
    } else {
      if (!s.special_ids_known) {  // one greedy token of the first prompt
        tf_rl::Sampling one = s.sampling;
        one.n = 1;
        one.max_new_tokens = 1;
        one.temperature = 0;
        learn_special_ids(s, tf_rl::generate(s.host, prompts_of_batch.front(), one, seeds.front()));
      }
      std::vector<tf_rl::Sampled> each;
      for (int64_t r = 0; r < prompts.prompts(); ++r)
        each.push_back(s.given->of_row(row_ids[r].item<int64_t>()));
      const tf_rl::Sampled got = tf_rl::concat_rows(each);
      part.ids = got.ids;
      part.lengths = got.lengths;
    }
    part.row_ids = row_ids.repeat_interleave(G);
    const tf_rl::Rewards rw = tf_rl::score_rewards(s.host, part.row_ids, part.ids, part.lengths);
    all_scores.push_back(rw.scores);
    names = rw.names;
    weights = rw.weights;
    parts.push_back(std::move(part));
  }
  // TRL's rewards: float32, weighted and summed over the functions (nansum).
  const at::Tensor per_func = at::cat(all_scores).to(at::kFloat);
  const at::Tensor rewards = (per_func * weights.to(at::kFloat).unsqueeze(0)).nansum(1);
  const tf_rl::Advantages adv = tf_rl::group_advantages(rewards, G, s.scale);
  // Completions, their masks and the generation's metrics.
  std::vector<at::Tensor> all_lengths, truncated_rows;
  s.buffer.clear();
  s.buffer_tokens = 0;
  int64_t first = 0;
  for (Part& part : parts) {
    const int64_t n = part.ids.size(0), C = part.ids.size(1);
    Chunk c;
    c.valid = (at::arange(C).unsqueeze(0) < part.lengths.unsqueeze(1)).to(at::kFloat);
    const at::Tensor last = part.ids.gather(1, (part.lengths - 1).clamp_min(0).unsqueeze(1));
    at::Tensor ends = last.squeeze(1) == s.eos;
    if (s.pad_token >= 0) ends = ends | (last.squeeze(1) == s.pad_token);
    const at::Tensor truncated = ~ends;
    c.mask = s.mask_truncated ? c.valid * (~truncated).to(at::kFloat).unsqueeze(1) : c.valid;
    c.rows = tf_rl::scored_rows(part.prompt_of, part.ids, part.lengths, c.mask.to(at::kLong),
                                /*pad=*/0);
    c.advantages = adv.advantages.narrow(0, first, n).contiguous();
    first += n;
    s.buffer_tokens += part.lengths.sum().item<double>();
    all_lengths.push_back(part.lengths);
    truncated_rows.push_back(truncated);
    s.buffer.push_back(std::move(c));
  }
  // Old and reference log-probs, before any update of this generation.
  for (Chunk& c : s.buffer) {
    if (keeps_old(s)) c.old = at_completions(c, score_rows(s, c, {}, false).logps);
    if (s.options.beta != 0)
      c.ref = s.reference.run(s.host, [&](const tf_sdk::PassWeights& w) {
        return at_completions(c, score_rows(s, c, w, false).logps);
      });
  }
  // TRL's _generate and _generate_and_score_completions metrics.
  const at::Tensor lengths = at::cat(all_lengths).to(at::kFloat);
  const at::Tensor truncated = at::cat(truncated_rows);
  s.tokens_seen += static_cast<double>(prompt_tokens) + lengths.sum().item<double>();
  m["num_tokens"] = s.tokens_seen;
  m["completions/mean_length"] = lengths.mean().item<double>();
  m["completions/min_length"] = lengths.min().item<double>();
  m["completions/max_length"] = lengths.max().item<double>();
  m["completions/clipped_ratio"] = truncated.to(at::kFloat).mean().item<double>();
  at::Tensor terminated = lengths.masked_select(~truncated);
  if (terminated.numel() == 0) terminated = at::zeros({1});
  m["completions/mean_terminated_length"] = terminated.mean().item<double>();
  m["completions/min_terminated_length"] = terminated.min().item<double>();
  m["completions/max_terminated_length"] = terminated.max().item<double>();
  for (size_t i = 0; i < names.size(); ++i) {
    const at::Tensor f = per_func.select(1, static_cast<int64_t>(i));
    m["rewards/" + names[i] + "/mean"] = at::nanmean(f).item<double>();
    m["rewards/" + names[i] + "/std"] = nanstd(f);
  }
  m["reward"] = adv.group_mean.mean().item<double>();
  m["reward_std"] = adv.std.mean().item<double>();
  m["frac_reward_zero_std"] = adv.std_is_zero.to(at::kFloat).mean().item<double>();
}

// One micro-batch: its backward, its loss (already divided as TRL divides
// it) and its metrics.
double train_chunk(Grpo& s, const Chunk& c, Metrics& m) {
  tf_rl::GrpoOptions o = s.options;
  o.accumulation_steps = s.accumulation;
  o.tokens_in_update = s.buffer_tokens;
  const tf_sdk::Batch rows(s.host, c.rows.tokens, c.rows.targets, c.rows.attention_mask);
  // d loss / d logp on a leaf: scattered to the positions the pass scores.
  auto backward_weights = [&](const at::Tensor& at_logps) {
    at::AutoGradMode grad(true);
    const at::Tensor leaf = at_logps.detach().clone().requires_grad_(true);
    tf_rl::grpo_loss(leaf, c.old, c.ref, c.advantages, c.mask, o).loss.backward();
    return at::zeros(c.rows.tokens.sizes(), at::kFloat)
        .scatter_add_(1, c.rows.positions, leaf.grad() * c.valid);
  };
  tf_pass pass = rows.new_pass(TF_PASS_TOKEN_LOGPS);
  pass.temperature = s.sampling.temperature;
  at::Tensor logps, entropies;
  if (o.beta == 0 && !c.old.defined()) {
    // The ratio is 1 whatever the log-probs: the weights come first.
    const at::Tensor w = backward_weights(at::zeros_like(c.mask));
    pass.backward = 1;
    pass.grad_weights = tf_sdk::lend(w);
    pass.entropies = 1;
    tf_sdk::Batch::PassResult r = rows.run(pass);
    logps = at_completions(c, r.logps);
    entropies = at_completions(c, r.entropies);
  } else {
    pass.entropies = 1;
    tf_sdk::Batch::PassResult first = rows.run(pass);
    logps = at_completions(c, first.logps);
    entropies = at_completions(c, first.entropies);
    const at::Tensor w = backward_weights(logps);
    tf_pass back = rows.new_pass(TF_PASS_TOKEN_LOGPS);
    back.temperature = s.sampling.temperature;
    back.backward = 1;
    back.grad_weights = tf_sdk::lend(w);
    rows.run(back);
  }
  at::NoGradGuard no_grad;
  const tf_rl::GrpoLoss l = tf_rl::grpo_loss(logps, c.old, c.ref, c.advantages, c.mask, o);
  const double tokens = std::max(1.0, c.mask.sum().item<double>());
  m["entropy"] = (entropies * c.mask).sum().item<double>() / tokens;
  if (o.beta != 0) m["kl"] = l.kl;
  m["clip_ratio/low_mean"] = l.clip_low;
  m["clip_ratio/low_min"] = l.clip_low;
  m["clip_ratio/high_mean"] = l.clip_high;
  m["clip_ratio/high_max"] = l.clip_high;
  m["clip_ratio/region_mean"] = l.clip_region;
  return l.loss.item<double>();
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Grpo>(Grpo{tf_sdk::Host(api, ctx)});
    tf_sdk::Host& h = s->host;
    s->lr = tf_sdk::LrSchedule::read(h);
    s->sampling.n = h.get_int("num_generations");
    s->sampling.max_new_tokens = h.get_int("max_completion_length");
    s->sampling.temperature = h.get_double("temperature");
    s->sampling.top_p = h.get_double("top_p");
    s->sampling.top_k = h.get_int("top_k");
    s->sampling.min_p = h.get_double("min_p");
    s->sampling.repetition_penalty = h.get_double("repetition_penalty");
    s->options.loss_type = tf_rl::loss_type_named(h.get_string("loss_type"));
    s->options.level = tf_rl::importance_level_named(h.get_string("importance_sampling_level"));
    s->options.epsilon_low = h.get_double("epsilon");
    s->options.epsilon_high =
        h.has("epsilon_high") ? h.get_double("epsilon_high") : s->options.epsilon_low;
    if (h.has("delta")) s->options.delta = h.get_double("delta");
    s->options.beta = h.get_double("beta");
    s->options.max_completion_length = s->sampling.max_new_tokens;
    s->scale = tf_rl::scale_rewards_named(h.get_string("scale_rewards"));
    s->num_iterations = h.get_int("num_iterations");
    s->accumulation = static_cast<int32_t>(h.get_int("gradient_accumulation_steps"));
    const int64_t spg = h.get_int("steps_per_generation");
    s->steps_per_generation = spg > 0 ? static_cast<int32_t>(spg) : s->accumulation;
    s->mask_truncated = h.get_bool("mask_truncated_completions");
    if (const std::string file = h.get_string("completions_file"); !file.empty())
      s->given.emplace(file, s->sampling.n, s->sampling.max_new_tokens);
    s->seed = h.run_info().seed;
    if (s->sampling.n < 2)
      throw std::invalid_argument(
          "num_generations = " + std::to_string(s->sampling.n) +
          ": a group needs at least 2 completions for its rewards to have a deviation (TRL "
          "refuses fewer too)");
    if (s->options.beta != 0) s->reference.read(h, /*precompute=*/false);
    *out = s.release();
    return TF_OK;
  });
}

tf_status run_step(void* state, tf_host_context* ctx, int64_t step, int64_t total,
                   tf_step_result* out) {
  auto* s = static_cast<Grpo*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const double lr = s->lr.apply(s->host, step, total);
    if (s->options.beta != 0) s->reference.keep(s->host, step);
    s->host.zero_grad();
    Metrics generation, sums;
    int generations = 0;  // this step's (every one logs the same keys)
    double loss = 0;
    int64_t tokens = 0;
    const int64_t every = static_cast<int64_t>(s->steps_per_generation) * s->num_iterations;
    for (int32_t k = 0; k < s->accumulation; ++k) {
      if (s->micro_steps % every == 0 || s->buffer.empty()) {
        // TRL logs the mean over a step's generations (steps_per_generation
        // below the accumulation: several), num_tokens as it stands at the last.
        Metrics g;
        generate(*s, g);
        for (const auto& [key, value] : g)
          generation[key] = key == "num_tokens" ? value : generation[key] + value;
        ++generations;
      }
      const Chunk& c = s->buffer[static_cast<size_t>(s->micro_steps % s->steps_per_generation)];
      if (s->accumulation > 1) s->host.set_micro_batch(k, s->accumulation);
      Metrics m;
      loss += train_chunk(*s, c, m);
      tokens += c.rows.tokens.numel();
      for (const auto& [key, value] : m) sums[key] += value / s->accumulation;
      ++s->micro_steps;
    }
    for (const auto& [key, value] : generation)
      s->host.log_metric(key, key == "num_tokens" ? value : value / generations);
    for (const auto& [key, value] : sums) s->host.log_metric(key, value);
    tf_sdk::step_or_skip(s->host, step, s->skipped);
    out->loss = loss;
    out->n_tokens = tokens;
    out->backward_passes = s->accumulation;
    const bool one_pass = s->options.beta == 0 && !keeps_old(*s);
    out->forward_passes = (one_pass ? 1 : 2) * s->accumulation;
    out->lr = lr;
    out->phase = "grpo";
    return TF_OK;
  });
}

// The checkpoint: the counters, and a generation not yet used up
// (num_iterations > 1, or steps_per_generation past the accumulation) so
// that a resumed run trains on the same completions.
// The plan (ABI 1.26): training passes of batch_size x num_generations rows,
// each its prompt and completion; the generation of a batch's prompts'
// num_generations completions each, at once (the host plans their decode
// cache, each row the longest prompt and max_completion_length);
// the generation's buffer of old and reference log-probs. Each micro-batch
// is one forward and backward, and a no-gradient forward for each of the
// old and reference log-probs it needs. Sampling's own time is not in the
// plan's time factor.
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary* model,
                          tf_memory_estimate* out) {
  auto* s = static_cast<Grpo*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const int64_t G = s->sampling.n, C = s->sampling.max_new_tokens;
    const int64_t prompts = s->host.run_info().batch_size;  // a batch's prompts
    const bool one_pass = s->options.beta == 0 && !keeps_old(*s);
    const int64_t logps = (s->options.beta != 0 ? 1 : 0) + (keeps_old(*s) ? 1 : 0);
    tf_preference::plan_micro_batches(static_cast<double>((one_pass ? 3 : 4) + logps),
                                      s->accumulation, out);
    if (TF_SDK_REACHES(out, tf_memory_estimate, micro_batches))
      out->micro_batches = s->accumulation;
    out->delta_bytes[TF_TIER_DEVICE][TF_MEM_OTHER] +=
        static_cast<int64_t>(s->steps_per_generation) * prompts * G * C * 4 * (2 + logps);
    if (TF_SDK_REACHES(model, tf_model_summary, prompt_tokens) &&
        TF_SDK_REACHES(out, tf_memory_estimate, generate_new_tokens)) {
      out->pass_rows = prompts * G;
      out->pass_seq_len = std::max<int64_t>(model->prompt_tokens, 1) + C;
      out->generate_rows = s->given ? 0 : prompts * G;  // completions_file: nothing sampled
      out->generate_new_tokens = C;
      if (TF_SDK_REACHES(out, tf_memory_estimate, generate_prompts))
        out->generate_prompts = s->given ? 0 : prompts;
    }
    return TF_OK;
  });
}

tf_status save_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Grpo*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const tf_sdk::Host& h = s->host;
    h.save_double("skipped", static_cast<double>(s->skipped));
    h.save_double("micro_steps", static_cast<double>(s->micro_steps));
    h.save_double("prompts_done", static_cast<double>(s->prompts_done));
    h.save_double("tokens_seen", s->tokens_seen);
    h.save_double("buffer_tokens", s->buffer_tokens);
    h.save_double("buffer_chunks", static_cast<double>(s->buffer.size()));
    for (size_t k = 0; k < s->buffer.size(); ++k) {
      const Chunk& c = s->buffer[k];
      const std::string p = "buffer." + std::to_string(k) + ".";
      h.save_tensor(p + "tokens", c.rows.tokens);
      h.save_tensor(p + "targets", c.rows.targets);
      h.save_tensor(p + "attention_mask", c.rows.attention_mask);
      h.save_tensor(p + "positions", c.rows.positions);
      h.save_tensor(p + "valid", c.valid);
      h.save_tensor(p + "mask", c.mask);
      h.save_tensor(p + "advantages", c.advantages);
      if (c.old.defined()) h.save_tensor(p + "old", c.old);
      if (c.ref.defined()) h.save_tensor(p + "ref", c.ref);
    }
    return TF_OK;
  });
}

tf_status load_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Grpo*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const tf_sdk::Host& h = s->host;
    s->skipped = static_cast<int64_t>(h.saved_double("skipped"));
    s->micro_steps = static_cast<int64_t>(h.saved_double("micro_steps"));
    s->prompts_done = static_cast<int64_t>(h.saved_double("prompts_done"));
    s->tokens_seen = h.saved_double("tokens_seen");
    s->buffer_tokens = h.saved_double("buffer_tokens");
    s->buffer.clear();
    const auto chunks = static_cast<int64_t>(h.saved_double("buffer_chunks"));
    for (int64_t k = 0; k < chunks; ++k) {
      const std::string p = "buffer." + std::to_string(k) + ".";
      Chunk c;
      c.rows.tokens = h.saved_tensor(p + "tokens");
      c.rows.targets = h.saved_tensor(p + "targets");
      c.rows.attention_mask = h.saved_tensor(p + "attention_mask");
      c.rows.positions = h.saved_tensor(p + "positions");
      c.valid = h.saved_tensor(p + "valid");
      c.mask = h.saved_tensor(p + "mask");
      c.advantages = h.saved_tensor(p + "advantages");
      if (auto old = h.find_saved_tensor(p + "old")) c.old = *old;
      if (auto ref = h.find_saved_tensor(p + "ref")) c.ref = *ref;
      s->buffer.push_back(std::move(c));
    }
    s->reference.load(h);
    return TF_OK;
  });
}

const std::vector<tf_config_key> kKeys = tf_sdk::with_lr_schedule_keys({
    tf_sdk::key("num_generations", TF_VALUE_INT, "8",
                "completions sampled for each prompt: a group, whose rewards are compared", 2,
                1024),
    tf_sdk::key("max_completion_length", TF_VALUE_INT, "256",
                "the most tokens a completion has (one that reaches it is truncated)", 1, 1e6),
    tf_sdk::key("temperature", TF_VALUE_FLOAT, "1.0",
                "sampling temperature; the log-probs are taken at it too, as TRL's", 1e-6, 100),
    tf_sdk::key("top_p", TF_VALUE_FLOAT, "1.0", "nucleus sampling's mass (1 = off)", 1e-6, 1),
    tf_sdk::key("top_k", TF_VALUE_INT, "0", "sample among the k likeliest tokens (0 = off)", 0,
                1e9),
    tf_sdk::key("min_p", TF_VALUE_FLOAT, "0.0",
                "keep tokens at least min_p times as likely as the likeliest (0 = off, TRL's None)",
                0, 1),
    tf_sdk::key("repetition_penalty", TF_VALUE_FLOAT, "1.0",
                "divide the logits of ids already in the row (prompt included) by it, multiply "
                "negative ones (1 = off)",
                1e-6, 1e6),
    tf_sdk::key("beta", TF_VALUE_FLOAT, "0.0",
                "the KL term's weight against the reference model (0: no reference pass)", 0, 1e6),
    tf_sdk::key("epsilon", TF_VALUE_FLOAT, "0.2", "the clip range's lower side (and upper)", 0, 1),
    tf_sdk::key("epsilon_high", TF_VALUE_FLOAT, "0.2",
                "the clip range's upper side (DAPO's clip-higher; epsilon when left out)", 0, 1e3),
    tf_sdk::key("delta", TF_VALUE_FLOAT, "1.0",
                "two-sided clipping: the ratio's upper bound for negative advantages (left out: "
                "none)",
                1, 1e6),
    tf_sdk::key("loss_type", TF_VALUE_STRING, "\"dapo\"",
                "how token losses are averaged: grpo, bnpo, dr_grpo or dapo (TRL 0.24's default)",
                1, 0, "grpo|bnpo|dr_grpo|dapo"),
    tf_sdk::key("importance_sampling_level", TF_VALUE_STRING, "\"token\"",
                "token, or sequence (GSPO: one importance weight per completion)", 1, 0,
                "token|sequence"),
    tf_sdk::key("scale_rewards", TF_VALUE_STRING, "\"group\"",
                "advantages divided by the group's reward deviation, the batch's, or none "
                "(Dr. GRPO)",
                1, 0, "group|batch|none"),
    tf_sdk::key("num_iterations", TF_VALUE_INT, "1",
                "updates on each generation's completions (TRL's mu; > 1 keeps the sampling "
                "policy's log-probs for the ratio)",
                1, 1e4),
    tf_sdk::key("mask_truncated_completions", TF_VALUE_BOOL, "false",
                "leave completions cut at max_completion_length out of the loss"),
    tf_preference::accumulation_key(),
    tf_sdk::key("steps_per_generation", TF_VALUE_INT, "0",
                "micro-batches of batch_size prompts each generation samples at once (0: "
                "gradient_accumulation_steps, TRL's default); a generation longer than an "
                "update keeps the sampling policy's log-probs",
                0, 1e4),
    tf_preference::reference_tier_key(),
    tf_sdk::key("completions_file", TF_VALUE_PATH, "\"\"",
                "test mode: each prompt's completions read from this JSONL file "
                "({\"row\": N, \"completion_ids\": [[ids], ...]} a line per prompt row), not "
                "sampled"),
});

const tf_schedule_vtable kVtable = {.struct_size = sizeof(tf_schedule_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<Grpo>,
                                    .run_step = run_step,
                                    .estimate_memory = estimate_memory,
                                    .save_state = save_state,
                                    .load_state = load_state,
                                    .features = TF_SCHEDULE_FEATURE_PROMPTS};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_SCHEDULE, "grpo", "1.0.0",
    "online RL: samples completions of prompt rows, scores them with the recipe's [[reward]] "
    "plugins and trains on group-relative advantages (TRL's GRPOTrainer: GRPO, Dr. GRPO, DAPO, "
    "GSPO)",
    kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
