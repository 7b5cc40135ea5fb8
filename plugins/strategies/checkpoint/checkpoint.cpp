// Activation checkpointing as a strategy plugin: it only marks stages for
// recompute; the kernel's generic stage Function runs a marked stage without
// keeping its activations and re-runs it in backward.
//
// `every = N` checkpoints blocks 0, N, 2N, ...; `every = 1` checkpoints all.
#include <memory>

#include "tightfit/plugin_sdk.hpp"

namespace {

struct Checkpoint {
  tf_sdk::Host host;
  int64_t every = 1;
};

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Checkpoint>(Checkpoint{tf_sdk::Host(api, ctx)});
    s->every = s->host.get_int("every");
    *out = s.release();
    return TF_OK;
  });
}

tf_status configure(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Checkpoint*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    int64_t block = 0, marked = 0;
    for (int32_t i = 0, n = s->host.stage_count(); i < n; ++i) {
      const tf_stage_info info = s->host.stage_info(i);
      // Blocks that run: a block skipped (sparse, before this strategy) has nothing to keep.
      if (info.kind != TF_STAGE_BLOCK || info.skip) continue;
      if (block++ % s->every == 0) {
        s->host.set_stage_recompute(i, true);
        ++marked;
      }
    }
    s->host.log(TF_LOG_INFO, "recomputing " + std::to_string(marked) + " of " +
                                 std::to_string(block) + " blocks in backward");
    return TF_OK;
  });
}

// The kernel's plan already follows the stages this strategy marks for
// recomputation (their inputs kept, each rerun in backward); what it adds is
// time: the recomputed stages' forward once more.
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary*,
                          tf_memory_estimate* out) {
  auto* s = static_cast<Checkpoint*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    out->time_factor = tf_sdk::recompute_time_factor(s->host);
    out->time_from_plan = 1;  // tightfit fit prices it from the plan
    return TF_OK;
  });
}

// `tightfit fit` may add it, checkpointing every 2nd block or every one.
const tf_plugin_search kSearch = {.struct_size = sizeof(tf_plugin_search), .stack_order = 40};
const tf_search_value kEvery[] = {
    tf_sdk::search_value("2", "checkpoint {}"),
    tf_sdk::search_value("1", "checkpoint {}"),
};
const tf_key_search kEverySearch = tf_sdk::key_search(kEvery);

const tf_config_key kKeys[] = {
    tf_sdk::searched(tf_sdk::key("every", TF_VALUE_INT, "1",
                                 "checkpoint every N-th block (1 = all blocks)", 1, 1e6),
                     kEverySearch),
};

const tf_strategy_vtable kVtable = {.struct_size = sizeof(tf_strategy_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<Checkpoint>,
                                    .configure = configure,
                                    .estimate_memory = estimate_memory};

const tf_plugin_descriptor kDescriptor = tf_sdk::searched(
    tf_sdk::describe(TF_PLUGIN_STRATEGY, "checkpoint", "1.0.0",
                     "activation checkpointing: recompute every N-th block in backward", kKeys,
                     &kVtable),
    kSearch);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
