// sparse: train only the blocks that matter.
//
// The first `first` and last `last` blocks train as the other strategies set
// them up (fully, or through LoRA); the blocks between them, by `middle`:
//   "skip"   — not run at all: the model becomes first + last blocks. Their
//              weights are never allocated or loaded (the kernel leaves the
//              parameters of a skipped stage absent), as the field notes'
//              16B-on-4GB recipe does.
//   "frozen" — run, but not trained: no gradients, no optimizer state.
//   "lisa"   — layerwise importance sampling (Pan et al., LISA): every
//              `interval` steps `k` of the middle blocks, drawn at random,
//              train and the rest are frozen. Embeddings and head always
//              train. The draw depends only on the run's seed and the step,
//              so every rank and a resumed run pick the same blocks.
// `first = L` (all blocks) is the plain run.
#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tightfit/plugin_sdk.hpp"

namespace {

struct Sparse {
  explicit Sparse(tf_sdk::Host h) : host(h) {}
  tf_sdk::Host host;
  int64_t first = 0, last = 0, interval = 20, k = 2;
  std::string middle;
  uint64_t seed = 0;
  std::vector<int32_t> middle_stages;
  // lisa / frozen: the middle blocks' parameters that were trainable before
  // this strategy froze them, by middle block.
  std::vector<std::vector<std::string>> trainable;
  int64_t picked_for = -1;  // the interval whose draw is in effect
};

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Sparse>(tf_sdk::Host(api, ctx));
    s->first = s->host.get_int("first");
    s->last = s->host.get_int("last");
    s->middle = s->host.get_string("middle");
    s->interval = s->host.get_int("interval");
    s->k = s->host.get_int("k");
    s->seed = s->host.run_info().seed;
    if (s->middle != "lisa" && (s->host.has("interval") || s->host.has("k")))
      throw std::invalid_argument("sparse: `interval` and `k` are for middle = \"lisa\"");
    *out = s.release();
    return TF_OK;
  });
}

// Which blocks are in the middle; "skip" takes them out before anything is
// allocated.
void set_block(Sparse& s, size_t block, bool on) {
  for (const auto& name : s.trainable[block]) s.host.set_param_trainable(name, on);
}

// Records the middle blocks' trainable parameters (LISA turns exactly these
// back on) and freezes them.
void freeze_middle(Sparse& s) {
  s.trainable.resize(s.middle_stages.size());
  for (const auto& name : s.host.param_names()) {
    const tf_param_info info = s.host.param_info(name);
    auto it = std::find(s.middle_stages.begin(), s.middle_stages.end(), info.stage);
    if (it == s.middle_stages.end() || !info.trainable) continue;
    s.trainable[static_cast<size_t>(it - s.middle_stages.begin())].push_back(name);
  }
  for (size_t b = 0; b < s.trainable.size(); ++b) set_block(s, b, false);
}

tf_status configure(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Sparse*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    std::vector<int32_t> blocks;
    for (int32_t i = 0; i < s->host.stage_count(); ++i)
      if (s->host.stage_info(i).kind == TF_STAGE_BLOCK) blocks.push_back(i);
    const auto n = static_cast<int64_t>(blocks.size());
    if (s->first + s->last > n)
      throw std::invalid_argument(
          "sparse: first = " + std::to_string(s->first) + " and last = " + std::to_string(s->last) +
          " add up to more than the model's " + std::to_string(n) + " blocks");
    s->middle_stages.assign(blocks.begin() + s->first, blocks.end() - s->last);
    if (s->middle == "lisa" && s->k > static_cast<int64_t>(s->middle_stages.size()))
      throw std::invalid_argument("sparse: k = " + std::to_string(s->k) + " but only " +
                                  std::to_string(s->middle_stages.size()) + " middle blocks");
    if (s->middle == "skip")
      for (int32_t stage : s->middle_stages) s->host.set_stage_skip(stage, true);
    else
      freeze_middle(*s);  // now, so that `plan` sees it
    return TF_OK;
  });
}

// frozen / lisa: freeze the middle blocks' trainable parameters, those
// declared after configure (adapters of a later strategy) included.
tf_status params_ready(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Sparse*>(state);
  if (s->middle == "skip") return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    freeze_middle(*s);
    return TF_OK;
  });
}

// lisa: a new draw at the start of every interval.
tf_status step_begin(void* state, tf_host_context* ctx, int64_t step) {
  auto* s = static_cast<Sparse*>(state);
  if (s->middle != "lisa" || s->middle_stages.empty()) return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const int64_t period = step / s->interval;
    if (period == s->picked_for) return TF_OK;
    std::vector<size_t> order(s->middle_stages.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::mt19937_64 rng(s->seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(period));
    // Fisher-Yates with our own draws: std::shuffle's is not the same everywhere.
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
    std::vector<bool> on(order.size(), false);
    for (int64_t i = 0; i < s->k; ++i) on[order[static_cast<size_t>(i)]] = true;
    for (size_t b = 0; b < on.size(); ++b) set_block(*s, b, on[b]);
    s->picked_for = period;
    std::string names;
    for (size_t b = 0; b < on.size(); ++b)
      if (on[b])
        names +=
            (names.empty() ? "" : ", ") + std::string(s->host.stage_info(s->middle_stages[b]).name);
    s->host.log(TF_LOG_DEBUG,
                "sparse: steps " + std::to_string(period * s->interval) + "+ train " + names);
    return TF_OK;
  });
}

// The kernel's plan follows the skipped and frozen stages set in configure;
// LISA then trains k middle blocks at a time: their gradients and optimizer
// state (fp32 AdamW's two moments) come on top, as much as k average blocks.
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary*,
                          tf_memory_estimate* out) {
  auto* s = static_cast<Sparse*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    out->time_factor = 0;  // depends on the share of blocks run
    if (s->middle != "lisa" || s->middle_stages.empty()) return TF_OK;
    int64_t middle = 0;
    for (const auto& name : s->host.param_names()) {
      const tf_param_info info = s->host.param_info(name);
      if (std::find(s->middle_stages.begin(), s->middle_stages.end(), info.stage) !=
          s->middle_stages.end())
        middle += info.numel;
    }
    const auto trained =
        static_cast<int64_t>(static_cast<double>(middle) * static_cast<double>(s->k) /
                             static_cast<double>(s->middle_stages.size()));
    out->delta_bytes[TF_TIER_DEVICE][TF_MEM_GRADS] = 4 * trained;
    out->delta_bytes[TF_TIER_DEVICE][TF_MEM_OPTIMIZER] = 8 * trained;
    return TF_OK;
  });
}

const tf_config_key kKeys[] = {
    tf_sdk::key("first", TF_VALUE_INT, "0", "blocks at the start that train", 0, 1e6),
    tf_sdk::key("last", TF_VALUE_INT, "0", "blocks at the end that train", 0, 1e6),
    tf_sdk::key("middle", TF_VALUE_STRING, "\"frozen\"",
                "the blocks between: skip (not run, never loaded), frozen (run, not trained), "
                "lisa (k random ones train, redrawn every `interval` steps)",
                1, 0, "skip|frozen|lisa"),
    tf_sdk::key("interval", TF_VALUE_INT, "20", "lisa: steps between draws", 1, 1e9),
    tf_sdk::key("k", TF_VALUE_INT, "2", "lisa: middle blocks that train at a time", 0, 1e6),
};

const tf_strategy_vtable kVtable = {.struct_size = sizeof(tf_strategy_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<Sparse>,
                                    .configure = configure,
                                    .params_ready = params_ready,
                                    .step_begin = step_begin,
                                    .estimate_memory = estimate_memory};

const tf_plugin_descriptor kDescriptor =
    tf_sdk::describe(TF_PLUGIN_STRATEGY, "sparse", "1.0.0",
                     "train the first and last blocks; skip, freeze or LISA-sample the middle ones",
                     kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
