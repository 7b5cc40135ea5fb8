#include "memory_plan.hpp"

#include <algorithm>

#include "checked_size.hpp"
#include "cuda_memory.hpp"
#include "fused_head_loss.hpp"
#include "generation_plan.hpp"
#include "kernel_parts.hpp"
#include "plan_contribution.hpp"
#include "process_memory.hpp"
#include "stage_flow.hpp"
#include "strategy_chain.hpp"

namespace tightfit {

namespace {

int64_t element_bytes(at::ScalarType t) {
  return static_cast<int64_t>(c10::elementSize(t));
}

// The state slots per trainable value the recipe's optimizer keeps (fp32).
int64_t optimizer_slots(const OptimizerConfig& opt) {
  if (opt.name == "adamw") return 2;
  return opt.momentum != 0 ? 1 : 0;
}

// A head whose projection the loss computes in chunks (Executor::fusable_head).
struct FusedHeadPlan {
  int32_t head = -1;
  int64_t chunk_rows = 0;
  int64_t chunk = 0;        // one chunk's fp32 logits (their gradient written over them)
  int64_t hidden_grad = 0;  // the gradient of the hidden state forward keeps for backward
};

FusedHeadPlan fused_head_plan(const KernelParts& s, int64_t tokens) {
  FusedHeadPlan f;
  f.head = s.executor->fusable_head();
  if (f.head < 0) return f;
  const StageState& st = s.executor->stages()[static_cast<size_t>(f.head)];
  const Param& w = s.store->get(st.projection_weight);
  const int64_t vocab = w.shape[0], width = w.shape[1], elt = element_bytes(w.dtype);
  f.chunk_rows =
      std::min(tokens, fused_loss_chunk_rows(vocab, s.env->config.run.loss_chunk_tokens));
  // fp32 logits, and their copy in the weight's dtype when it is another; a
  // capped head's slope of its cap beside them (fp32).
  const int64_t slope = st.projection_softcap > 0 ? 4 : 0;
  f.chunk =
      checked_product({f.chunk_rows, vocab, 4 + (elt != 4 ? elt : 0) + slope}, "a loss chunk");
  f.hidden_grad = checked_product({tokens, width, elt}, "the head's hidden gradient");
  return f;
}

// The kernel's baseline: what the declarations show, stage by stage.
struct StagePlan {
  int64_t live = 0;    // activations it keeps for backward (as the model declares)
  int64_t input = 0;   // the input a recomputed stage keeps instead
  int64_t output = 0;  // its output, held while a recomputed stage's backward runs
  bool recomputed = false;
  int64_t grads = 0;      // gradients its backward produces
  int64_t temporary = 0;  // its backward's own workspace
  int64_t dropped = 0;    // kept at the end of forward, gone before its backward (the logits)
  int64_t computing = 0;  // what its forward holds at once without autograd (no backward)
  bool backward = false;  // gradients flow through it
  bool block = false;     // a decoder block (strategies' block_bytes are alive while it computes)
  StageFlow flow;         // what the plan reports of it
};

struct Baseline {
  CategoryCounts bytes{};
  std::vector<StagePlan> stages;
  int64_t largest_param = 0;   // the update's workspace: a group of parameters'
  bool low_precision = false;  // a trained parameter is stored in 16 bits
  int64_t live_total = 0;      // all stages' activations were none recomputed
  int64_t n_params = 0, n_trainable = 0;
  int64_t kept_bytes = 0;  // the copies the kernel keeps: not the strategies' to estimate
  // A fused head's forward: a chunk's logits and the projection's weight
  // gradient, which forward makes and backward hands over.
  int64_t head_forward = 0;
  int64_t logits_tokens = 0;  // a fused head's chunk (0: not fused)
};

// The training pass's shape: the batch's, or a schedule's own (pass_rows).
struct PassShape {
  int64_t rows = 0, seq_len = 0;
};

Baseline baseline(const KernelParts& s, PassShape shape) {
  Baseline b;
  const tf_run_info& run = s.env->run_info;
  const int64_t tokens =
      checked_product({shape.rows, shape.seq_len}, "tokens per batch (batch_size x seq_len)");
  const int64_t slots = optimizer_slots(s.env->config.optimizer);
  const auto& stages = s.executor->stages();
  const size_t n = stages.size();
  b.stages.resize(n);
  std::vector<bool> own_trainable(n, false), any_trainable(n, false);
  auto stage_of = [&](const Param& p) -> size_t {
    // Shared parameters (tied embeddings) count where their gradient is born: the head.
    return p.stage >= 0 && static_cast<size_t>(p.stage) < n ? static_cast<size_t>(p.stage) : n - 1;
  };
  for (const Param& p : s.store->all()) {
    const size_t st = stage_of(p);
    if (p.absent || (p.stage >= 0 && stages[st].skip)) continue;  // never allocated
    const int64_t count = p.numel();
    const int64_t bytes = checked_product({count, element_bytes(p.dtype)}, "parameter " + p.name);
    if (p.copy_of.empty()) b.n_params += count;  // a copy is not more of the model
    if (p.kept_by_host) b.kept_bytes += bytes;
    const bool adapter = (p.flags & TF_PARAM_ADAPTER) != 0;
    b.bytes[adapter ? TF_MEM_ADAPTERS : TF_MEM_WEIGHTS] += bytes;
    if (!p.trainable) continue;
    b.n_trainable += count;
    b.bytes[TF_MEM_GRADS] += bytes;
    b.bytes[TF_MEM_OPTIMIZER] += 4 * slots * count;
    b.largest_param = std::max(b.largest_param, count);
    b.low_precision = b.low_precision || element_bytes(p.dtype) < 4;
    b.stages[st].grads += bytes;
    any_trainable[p.stage >= 0 ? st : 0] = true;
    if (!adapter) {
      own_trainable[st] = true;
      if (p.stage < 0) own_trainable[0] = true;  // the embedding uses it too
    }
  }
  // The head's vocabulary: the output rows of its weight (its own, or the
  // tied embedding counted there) — the model's, which may be larger than
  // the tokenizer's.
  int64_t vocab = run.vocab_size;
  for (const Param& p : s.store->all())
    if (p.shape.size() == 2 && (p.stage < 0 || static_cast<size_t>(p.stage) == n - 1))
      vocab = std::max(vocab, p.shape[0]);
  // fp32: the logits' gradient, which the loss writes over the logits it
  // kept (cross_entropy.hpp), alive through the head's backward.
  const int64_t logit_grads =
      checked_product({4, tokens, vocab}, "the logits' gradient (4 bytes x tokens x vocabulary)");
  const FusedHeadPlan fused = fused_head_plan(s, tokens);
  b.logits_tokens = fused.head >= 0 ? fused.chunk_rows : 0;
  // Autograd keeps a stage's activations only when a gradient flows back
  // through it: a trainable parameter at or before it.
  bool flows = false;
  int64_t previous_output = 0;
  for (size_t i = 0; i < n; ++i) {
    const StageState& st = stages[i];
    StagePlan& sp = b.stages[i];
    sp.block = st.kind == TF_STAGE_BLOCK;
    if (st.skip) continue;
    flows = flows || any_trainable[i];
    auto per_batch = [&](int64_t per_token, const char* what) {
      return checked_product({per_token, tokens}, "stage " + st.name + "'s " + what);
    };
    const int64_t full = per_batch(st.activation_bytes_per_token, "activations");
    const int64_t frozen = st.frozen_activation_bytes_per_token > 0
                               ? per_batch(st.frozen_activation_bytes_per_token, "activations")
                               : full;
    const int64_t output =
        st.output_bytes_per_token > 0 ? per_batch(st.output_bytes_per_token, "output") : full / 16;
    const bool fused_here = static_cast<int32_t>(i) == fused.head;
    // A fused head keeps its hidden state's gradient instead of the logits.
    const int64_t kept_logits =
        fused_here ? per_batch(st.projection_bytes_per_token, "logits") - fused.hidden_grad : 0;
    sp.backward = flows;
    sp.flow = {flows, flows && st.recompute, own_trainable[i],
               (own_trainable[i] ? full : frozen) - kept_logits,
               flows && st.recompute ? previous_output : 0};
    if (flows) {
      sp.live = (own_trainable[i] ? full : frozen) - kept_logits;
      // A recomputed stage keeps only its input until its backward reruns it.
      sp.recomputed = st.recompute;
      sp.input = previous_output;
      sp.output = output;
      b.live_total += sp.live;
      b.bytes[TF_MEM_ACTIVATIONS] += st.recompute ? sp.input : sp.live;
      // The gradients alive at once in its backward, as the model declares
      // them; else those of its output and of its input. The head's are the
      // logits'.
      const int64_t declared =
          own_trainable[i] ? st.backward_bytes_per_token : st.frozen_backward_bytes_per_token;
      sp.temporary = fused_here                 ? 2 * fused.hidden_grad
                     : st.kind == TF_STAGE_HEAD ? logit_grads
                     : declared > 0             ? per_batch(declared, "backward workspace")
                                                : output + previous_output;
      // The logits themselves are held for the loss, not by autograd: the
      // loss's backward starts after they are let go.
      if (st.kind == TF_STAGE_HEAD && !fused_here) sp.dropped = std::min(output, sp.live);
      if (fused_here) b.head_forward = fused.chunk + (own_trainable[i] ? sp.grads : 0);
    }
    sp.computing =
        live_without_autograd(full - kept_logits) + (fused_here                 ? fused.chunk
                                                     : st.kind == TF_STAGE_HEAD ? logit_grads
                                                                                : 0);
    previous_output = output;
  }
  return b;
}

tf_model_summary summary(const KernelParts& s, const Baseline& b, PassShape shape) {
  tf_model_summary m{};
  m.struct_size = sizeof m;
  m.n_params = b.n_params;
  m.n_trainable = b.n_trainable;
  m.param_bytes = b.bytes[TF_MEM_WEIGHTS] - b.kept_bytes;
  m.n_stages = static_cast<int32_t>(s.executor->stages().size());
  m.batch_size = shape.rows;
  m.seq_len = shape.seq_len;
  m.activation_bytes = b.live_total;  // strategies' activation deltas are against this
  m.logits_tokens = b.logits_tokens;
  m.vocab_size = s.env->run_info.vocab_size;
  for (const StageState& st : s.executor->stages()) {
    if (st.skip) continue;
    m.decode_cache_bytes_per_token += st.decode_cache_bytes_per_token;
    m.decode_state_bytes += st.decode_state_bytes;
    if (st.kind == TF_STAGE_HEAD && !st.projection_weight.empty())
      m.vocab_size = std::max(m.vocab_size, s.store->get(st.projection_weight).shape.at(0));
  }
  m.prompt_tokens = s.data->prompts() ? s.data->longest_prompt() : 0;
  return m;
}

MemoryPlan plan_at(const KernelParts& s, PassShape shape) {
  const Baseline b = baseline(s, shape);
  const tf_model_summary model = summary(s, b, shape);
  MemoryPlan plan;
  plan.n_params = b.n_params;
  plan.n_trainable = b.n_trainable;
  plan.batch_size = shape.rows;
  plan.seq_len = shape.seq_len;
  if (const std::optional<ProcessMemory> now = read_process_memory()) plan.host_overhead = now->rss;
  plan.process_scope = s.env->budget.scope == MemoryBudget::Scope::kProcess;
  plan.block_cache = s.env->config.run.cpu_block_cache;

  TierCounts held{};
  bool grads_in_forward = false;
  int64_t update_bytes = 0, forward_bytes = 0, block_bytes = 0;
  int64_t generate_rows = 0, generate_new_tokens = 0, generate_prompts = 0;
  held[TF_TIER_DEVICE] = b.bytes;
  // The planned parameter table: declared, dense, on the device; strategies
  // that convert or move parameters edit it while they are asked.
  auto& table = s.plan->params;
  table.clear();
  const auto& stages = s.executor->stages();
  for (const Param& p : s.store->all()) {
    if (p.absent || (p.stage >= 0 && static_cast<size_t>(p.stage) < stages.size() &&
                     stages[static_cast<size_t>(p.stage)].skip))
      continue;
    // The copies the kernel keeps sit in their own tier (no strategy sees them).
    table[p.name] = tf_param_plan{sizeof(tf_param_plan), p.numel() * element_bytes(p.dtype),
                                  TF_FORMAT_DENSE, p.kept_by_host ? p.residency : TF_TIER_DEVICE};
  }
  s.plan->planning = true;
  struct EndPlanning {
    const KernelParts& s;
    ~EndPlanning() { s.plan->planning = false; }
  } end_planning{s};
  for (PluginInstance& inst : s.plugins->strategies)
    plan.contributions.push_back(ask_plan_contribution(
        s, inst, inst.plugin->name, inst.plugin->strategy()->estimate_memory, model));
  if (s.plugins->schedule.plugin)
    plan.contributions.push_back(ask_plan_contribution(
        s, s.plugins->schedule, "schedule " + s.plugins->schedule.plugin->name,
        s.plugins->schedule.plugin->schedule()->estimate_memory, model));
  // A reward that holds memory (a scorer model) says so; the others hold none.
  for (RewardInstance& r : s.plugins->rewards)
    if (r.instance.plugin->reward()->estimate_memory)
      plan.contributions.push_back(ask_plan_contribution(
          s, r.instance, "reward " + r.name, r.instance.plugin->reward()->estimate_memory, model));
  s.plan->planning = false;
  // On a GPU, cuBLAS keeps its workspaces in the caching allocator from the
  // first matmul on: resident through every moment of every step.
  if (const at::Device& dev = s.env->device; dev.is_cuda()) {
    const int64_t measured = cuda_library_workspace_bytes(dev.has_index() ? dev.index() : 0);
    PlanContribution c;
    c.plugin = measured >= 0 ? "cuBLAS workspaces (measured on this GPU)"
                             : "cuBLAS workspaces (assumed 2 x 32MiB: the GPU is not here)";
    c.delta[TF_TIER_DEVICE][TF_MEM_TRANSIENT] =
        measured >= 0 ? measured : kAssumedCublasWorkspaceBytes;
    plan.contributions.push_back(c);
  }
  std::vector<bool> backward;
  for (const StagePlan& sp : b.stages) backward.push_back(sp.backward);
  if (PlanContribution tiles = tiled_feed_forward_contribution(s, backward); tiles.time_factor > 0)
    plan.contributions.push_back(std::move(tiles));
  // Weights and adapters per tier from the table.
  held[TF_TIER_DEVICE][TF_MEM_WEIGHTS] = held[TF_TIER_DEVICE][TF_MEM_ADAPTERS] = 0;
  for (const auto& [name, planned] : table) {
    const bool adapter = (s.store->get(name).flags & TF_PARAM_ADAPTER) != 0;
    held[static_cast<size_t>(planned.tier)][adapter ? TF_MEM_ADAPTERS : TF_MEM_WEIGHTS] +=
        planned.bytes;
  }
  for (const PlanContribution& c : plan.contributions) {
    if (!c.estimated) {
      plan.unestimated.push_back(c.plugin);
      continue;
    }
    for (int t = 0; t < TF_TIER_COUNT; ++t)
      for (int k = 0; k < TF_MEM_CATEGORY_COUNT; ++k) held[t][k] += c.delta[t][k];
    if (c.time_factor > 0) plan.time_factor *= c.time_factor;
    grads_in_forward = grads_in_forward || c.grads_in_forward;
    update_bytes += c.update_bytes;
    forward_bytes += c.forward_bytes;
    block_bytes += c.block_bytes;
    if (c.generate_rows > generate_rows) generate_prompts = c.generate_prompts;
    generate_rows = std::max(generate_rows, c.generate_rows);
    generate_new_tokens = std::max(generate_new_tokens, c.generate_new_tokens);
    if (c.pass_rows > 0) plan.pass_rows = c.pass_rows, plan.pass_seq_len = c.pass_seq_len;
    if (c.recompute_inputs_tier != TF_TIER_DEVICE)
      plan.recompute_inputs_tier = c.recompute_inputs_tier;
  }
  for (auto& tier : held)
    for (auto& v : tier) v = std::max<int64_t>(v, 0);

  // Strategies' effects on the categories the timeline is made of, as
  // factors on the baseline's per-stage numbers.
  const CategoryCounts& d = held[TF_TIER_DEVICE];
  auto factor = [&](tf_mem_category c) {
    return b.bytes[c] > 0 ? static_cast<double>(d[c]) / static_cast<double>(b.bytes[c]) : 0.0;
  };
  const double grad = factor(TF_MEM_GRADS);
  // Activation deltas (autocast, adapters' inputs, MeZO's none) are against
  // the stages' own activations, recomputed or not.
  const double act = b.live_total > 0
                         ? std::max(0.0, static_cast<double>(b.live_total + d[TF_MEM_ACTIVATIONS] -
                                                             b.bytes[TF_MEM_ACTIVATIONS]) /
                                             static_cast<double>(b.live_total))
                         : 0.0;
  auto scaled = [](int64_t v, double f) {
    return static_cast<int64_t>(static_cast<double>(v) * f);
  };
  const int64_t resident =
      d[TF_MEM_WEIGHTS] + d[TF_MEM_ADAPTERS] + d[TF_MEM_OPTIMIZER] + d[TF_MEM_TRANSIENT];
  const int64_t all_grads = d[TF_MEM_GRADS];

  // The step's moments: the end of forward, each stage's backward (last to
  // first), the update.
  // Recomputed stages' inputs a strategy keeps on a tier: there, and on the
  // device only while their stage reruns (with the next one read ahead).
  const bool inputs_away = plan.recompute_inputs_tier != TF_TIER_DEVICE;
  auto kept_by = [&](const StagePlan& sp) {
    return sp.recomputed ? (inputs_away ? 0 : sp.input) : scaled(sp.live, act);
  };
  // The stages' own (unscaled) activations the peak holds: how much of a
  // strategy's activation delta, planned against all of them, is there.
  int64_t kept = 0, kept_live = 0, peak_live = 0;
  auto live_kept_by = [&](const StagePlan& sp) { return sp.recomputed ? 0 : sp.live; };
  // A tiled feed-forward fetches its frozen weights once for all its tiles
  // (tiled_tokens.cpp): a gated MLP's three dense at once, where a block
  // otherwise has one at a time.
  block_bytes = std::max<int64_t>(0, block_bytes);
  if (s.env->config.run.mlp_tile_tokens > 0) block_bytes *= 3;
  for (const StagePlan& sp : b.stages) {
    kept += kept_by(sp);
    kept_live += live_kept_by(sp);
    if (sp.recomputed && inputs_away)
      held[static_cast<size_t>(plan.recompute_inputs_tier)][TF_MEM_ACTIVATIONS] += sp.input;
  }
  held[TF_TIER_DEVICE][TF_MEM_ACTIVATIONS] = kept;
  // The input read ahead while stage i reruns: the next recomputed one below it.
  auto read_ahead = [&](size_t i) -> int64_t {
    if (!inputs_away) return 0;
    for (size_t j = i; j-- > 0;)
      if (b.stages[j].recomputed) return b.stages[j].input;
    return 0;
  };
  const int64_t earlier_grads = grads_in_forward ? all_grads : 0;
  // Forward at its end (the head), and in the last block, whose own
  // workspace (a dequantized weight) is gone before the head runs.
  int64_t best = resident + kept + earlier_grads + b.head_forward + forward_bytes;
  plan.peak_moment = "forward";
  peak_live = kept_live;
  bool at_block = false;  // the peak is while a block computes
  const int64_t kept_before_head =
      kept - (!b.stages.empty() && !b.stages.back().block ? kept_by(b.stages.back()) : 0);
  if (block_bytes > 0 && resident + kept_before_head + earlier_grads + block_bytes > best) {
    best = resident + kept_before_head + earlier_grads + block_bytes;
    at_block = true;
  }
  int64_t later_grads = 0;  // of the stages whose backward is done
  for (size_t i = b.stages.size(); i-- > 0;) {
    const StagePlan& sp = b.stages[i];
    kept -= kept_by(sp);
    kept_live -= live_kept_by(sp);
    if (!sp.backward) continue;
    const int64_t own = scaled(sp.grads, grad);
    const int64_t now = resident + kept + scaled(sp.live - sp.dropped, act) +
                        (sp.recomputed ? sp.input + read_ahead(i) + sp.output : 0) + sp.temporary +
                        (sp.block ? block_bytes : 0) +
                        (grads_in_forward ? all_grads + own : later_grads + own);
    if (now > best) {
      best = now;
      plan.peak_moment = "backward";
      at_block = sp.block;
      peak_live = kept_live + sp.live - sp.dropped;
    }
    later_grads += own;
  }
  // Forward passes only (MeZO) when neither gradients nor kept activations
  // remain: one stage at a time. (Gradients alone can plan to nothing when
  // strategies that each shrink them stack, as bf16 with the fused update.)
  if (all_grads == 0 && act == 0) {
    best = resident;
    plan.peak_moment = "forward";
    at_block = false;
    peak_live = 0;
    for (const StagePlan& sp : b.stages) {
      const int64_t now = resident + sp.computing + (sp.block ? block_bytes : 0);
      if (now > best) best = now, at_block = sp.block;
    }
  } else {
    const int64_t workspace =
        4 * Optimizer::group_elements(b.largest_param, b.n_trainable, b.low_precision);
    const int64_t update = resident + all_grads + workspace + update_bytes;
    if (update > best) {
      best = update;
      plan.peak_moment = "update";
      at_block = false;
      peak_live = 0;
    }
  }
  // Sampling (a schedule's generate): after the update and before the next
  // pass, no gradient or kept activation alive; a block's own workspace (a
  // dequantized weight) while each block decodes.
  bool at_generation = false;
  if (generate_rows > 0) {
    plan.generation = plan_generation(s, generate_rows, generate_prompts, model.prompt_tokens,
                                      generate_new_tokens);
    const int64_t now = resident + plan.generation.bytes() + block_bytes;
    if (now > best) {
      best = now;
      plan.peak_moment = "generation";
      at_block = true;
      at_generation = true;
      peak_live = 0;
    }
  }
  plan.device_peak = best;
  plan.activation_share_at_peak =
      b.live_total > 0 ? static_cast<double>(peak_live) / static_cast<double>(b.live_total) : 0;
  for (const StagePlan& sp : b.stages) plan.stages.push_back(sp.flow);
  plan.routed = plan_routed_reads(s, plan.stages);
  if (at_block) held[TF_TIER_DEVICE][TF_MEM_TRANSIENT] += block_bytes;
  if (at_generation) {  // the sampler's bytes count as transient, as the run measures them
    held[TF_TIER_DEVICE][TF_MEM_GRADS] = held[TF_TIER_DEVICE][TF_MEM_ACTIVATIONS] = 0;
    held[TF_TIER_DEVICE][TF_MEM_TRANSIENT] += plan.generation.bytes();
  }
  plan.at_peak = held;
  plan.device_peak_by_category = d;
  for (int k = 0; k < TF_MEM_CATEGORY_COUNT; ++k) {
    plan.host_bytes += held[TF_TIER_HOST][k];
    plan.disk_bytes += held[TF_TIER_DISK][k];
  }
  // On a CPU run the host tier is the same memory the run counts.
  plan.tracked_peak = plan.device_peak + (s.env->device.is_cpu() ? plan.host_bytes : 0);
  return plan;
}

}  // namespace

MemoryPlan plan_memory(const KernelParts& s) {
  const PassShape batch{s.env->run_info.batch_size, s.env->run_info.seq_len};
  MemoryPlan plan = plan_at(s, batch);
  // A schedule whose passes have their own shape: everything again at it,
  // every plugin asked with that shape in tf_model_summary.
  if (plan.pass_rows > 0 && plan.pass_seq_len > 0 &&
      (plan.pass_rows != batch.rows || plan.pass_seq_len != batch.seq_len))
    plan = plan_at(s, {plan.pass_rows, plan.pass_seq_len});
  return plan;
}

std::string describe_device_peak(const MemoryPlan& plan) {
  std::string out;
  for (int c = 0; c < TF_MEM_CATEGORY_COUNT; ++c) {
    const int64_t v = plan.at_peak[TF_TIER_DEVICE][static_cast<size_t>(c)];
    if (v <= 0) continue;
    out += (out.empty() ? "" : ", ") + std::string(category_name(static_cast<tf_mem_category>(c))) +
           " " + format_bytes(v);
  }
  return out;
}

}  // namespace tightfit
