// Gradient accumulation: each optimizer step runs forward and backward over
// `micro_batches` batches of data.batch_size, accumulating their gradients,
// then updates once. Memory is that of one micro-batch; the update is that
// of one batch micro_batches times as large (the effective batch is
// batch_size x micro_batches, as in torchtune and Hugging Face's
// gradient_accumulation_steps).
//
// Each micro-batch's loss is the mean over its counted targets (not the
// prompt, padding or packing boundaries), so its gradient is scaled by its
// share of the step's counted targets: the update is that of the whole
// batch's token mean, as transformers computes it since 4.46
// (num_items_in_batch). The micro-batches are drawn first to count them.
// Equal counts (plain text) give 1/micro_batches exactly.
#include <algorithm>
#include <cstddef>
#include <memory>
#include <numeric>
#include <vector>

#include "tightfit/lr_schedule.hpp"

namespace {

struct Accumulate {
  tf_sdk::Host host;
  tf_sdk::LrSchedule lr;
  int32_t micro_batches = 1;
  int64_t skipped = 0;
};

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Accumulate>(Accumulate{tf_sdk::Host(api, ctx)});
    s->lr = tf_sdk::LrSchedule::read(s->host);
    s->micro_batches = static_cast<int32_t>(s->host.get_int("micro_batches"));
    if (!TF_HAS(api, tf_host_api, set_micro_batch))
      throw std::invalid_argument("this host has no set_micro_batch service; update tightfit");
    *out = s.release();
    return TF_OK;
  });
}

tf_status run_step(void* state, tf_host_context* ctx, int64_t step, int64_t total,
                   tf_step_result* out) {
  auto* s = static_cast<Accumulate*>(state);
  const tf_host_api* api = s->host.api();
  return tf_sdk::guard(api, ctx, [&] {
    const double lr = s->lr.apply(s->host, step, total);
    s->host.zero_grad();
    const int32_t count = s->micro_batches;
    std::vector<std::unique_ptr<tf_sdk::Batch>> batches;
    std::vector<int64_t> targets;  // each micro-batch's counted targets
    for (int32_t i = 0; i < count; ++i) {
      batches.push_back(std::make_unique<tf_sdk::Batch>(s->host));
      targets.push_back(batches.back()->n_targets());
    }
    const int64_t counted = std::accumulate(targets.begin(), targets.end(), int64_t{0});
    // A host before ABI 1.7 does not count (-1); a step with nothing to
    // count has no gradient either way.
    const bool known = *std::min_element(targets.begin(), targets.end()) >= 0;
    const bool equal = std::all_of(targets.begin(), targets.end(),
                                   [&](int64_t n) { return n == targets.front(); });
    const bool weighed = known && !equal && counted > 0;
    // Every micro-batch's loss is read with the update's gradient norm: one
    // read a step however many micro-batches it has.
    std::vector<tf_pass_result> passes(static_cast<size_t>(count));
    std::vector<double> shares;
    int64_t tokens = 0;
    for (int32_t i = 0; i < count; ++i) {
      const size_t k = static_cast<size_t>(i);
      shares.push_back(weighed ? static_cast<double>(targets[k]) / static_cast<double>(counted)
                               : 1.0 / count);
      s->host.set_micro_batch(i, count);
      batches[k]->forward_backward_deferred(shares[k], &passes[k]);
      tokens += passes[k].n_tokens;
    }
    batches.clear();
    tf_sdk::step_or_skip(s->host, step, s->skipped);
    double loss_sum = 0;
    for (size_t k = 0; k < passes.size(); ++k)
      loss_sum += weighed ? passes[k].loss * shares[k] : passes[k].loss;
    out->loss = weighed ? loss_sum : loss_sum / count;  // the whole batch's token mean
    out->n_tokens = tokens;
    out->backward_passes = s->micro_batches;
    out->forward_passes = s->micro_batches;
    out->lr = lr;
    out->phase = "full";
    return TF_OK;
  });
}

// The memory of one micro-batch, except that the gradients of the earlier
// micro-batches are alive while the later ones run forward; micro_batches
// times the work per step.
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary*,
                          tf_memory_estimate* out) {
  auto* s = static_cast<Accumulate*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    out->time_factor = s->micro_batches;
    out->time_from_plan = 1;  // tightfit fit prices it from the plan
    if (s->micro_batches > 1 && TF_SDK_REACHES(out, tf_memory_estimate, grads_in_forward))
      out->grads_in_forward = 1;
    if (TF_SDK_REACHES(out, tf_memory_estimate, micro_batches))
      out->micro_batches = static_cast<int32_t>(s->micro_batches);
    return TF_OK;
  });
}

// `tightfit fit` may run a standard recipe's batch as micro-batches (the
// same effective batch, a smaller one in memory at a time).
const tf_plugin_search kSearch = {.struct_size = sizeof(tf_plugin_search),
                                  .claims = "gradient lifetime",
                                  .stands_in_for = "standard"};
const tf_search_value kMicro[] = {
    tf_sdk::search_value("2", "micro x{}"),
    tf_sdk::search_value("4", "micro x{}"),
    tf_sdk::search_value("8", "micro x{}"),
};
const tf_key_search kMicroSearch = tf_sdk::key_search(kMicro, TF_SEARCH_KEY_SPLITS_BATCH);

const std::vector<tf_config_key> kKeys = tf_sdk::with_lr_schedule_keys({
    tf_sdk::searched(
        tf_sdk::key("micro_batches", TF_VALUE_INT, "4",
                    "batches of data.batch_size whose gradients are summed into one update", 1,
                    1e6),
        kMicroSearch),
});

const tf_schedule_vtable kVtable = {.struct_size = sizeof(tf_schedule_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<Accumulate>,
                                    .run_step = run_step,
                                    .estimate_memory = estimate_memory,
                                    .save_state = tf_sdk::save_skipped_state<Accumulate>,
                                    .load_state = tf_sdk::load_skipped_state<Accumulate>};

const tf_plugin_descriptor kDescriptor =
    tf_sdk::searched(tf_sdk::describe(TF_PLUGIN_SCHEDULE, "accumulate", "1.0.0",
                                      "gradient accumulation over micro_batches batches per "
                                      "update; warmup then cosine/linear decay",
                                      kKeys, &kVtable),
                     kSearch);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
