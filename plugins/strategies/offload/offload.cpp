// Offload: weights and optimizer state kept off the compute device.
//
// Frozen block weights (`params = "disk"`), in whatever format they are
// stored (dense, or int8/NF4 codes when quantize comes first in the recipe):
// each stage's weights are written to files under the run folder as soon as
// the stage exists (stage_params_ready, so a model larger than memory is
// never whole) and replaced by empty placeholders; the parameter's residency
// says "disk". When a stage's event begins (forward, recompute, backward, or
// an access outside a pass) its weights are swapped back into the store, and
// the next `prefetch` stages in the pass's direction are read on a background
// thread so that reading overlaps compute; when the stage ends in forward or
// backward they are swapped out again. At most prefetch + 1 stages' weights
// are resident. The kernel's compact linear fetches such a weight again in
// backward instead of keeping it, so nothing pins it; other strategies
// (quantize's dequantization) see the swapped-in storage as usual.
//
// `optimizer = "disk" | "host"` keeps the optimizer state of trainable
// parameters in that tier and runs their update there (state_tier.hpp): the
// kernel hands each update to optimizer_step_param, which brings the
// parameter and its gradient to the CPU when they are elsewhere, applies the
// run's optimizer with the tier's state (the host's optimizer_update, so the
// maths is the kernel's own) and copies the parameter back. Exact: the same
// weights as the plain run.
//
// `params = "host"` keeps the weights in host memory instead (pinned on a
// CUDA run); on a GPU, prefetched stages are also copied to the device on a
// side stream (device_upload.hpp), and the main stream waits on the copy's
// event before the stage uses them.
//
// `activations = "disk" | "host"` (with checkpoint) moves the input each
// recomputed stage keeps until backward (activation_store.hpp): written
// behind the forward pass, read back one stage ahead in backward.
//
// `trainable = true` moves trained block weights too (ZeRO-Infinity style):
// such a parameter stays the same autograd leaf and only its bytes come and
// go (free_bytes / fill_leaf), so gradients land on it and tensors autograd
// saved in forward see the same, unmodified tensor in backward. Its update
// runs in optimizer_step_param (hence optimizer = "disk" | "host"), bringing
// the bytes in when its stage is not running and writing them back.
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "offload_state.hpp"
#include "tightfit/plugin_sdk.hpp"
#include "tightfit/storage_bytes.hpp"

namespace {

namespace fs = std::filesystem;

using offload::Offload;
using offload::Offloaded;
using tf_sdk::free_bytes;
using tf_sdk::has_bytes;

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Offload>(tf_sdk::Host(api, ctx));
    s->device = s->host.run_info().device;
    s->cuda = s->device.rfind("cuda", 0) == 0;
    const std::string params = s->host.get_string("params");
    s->offload_params = params != "none";
    s->offload_trainable = s->offload_params && s->host.get_bool("trainable");
    if (s->offload_trainable && s->host.get_string("optimizer") == "none")
      throw std::invalid_argument(
          "offload: trainable = true needs optimizer = \"disk\" or \"host\": a trained weight kept "
          "in a tier "
          "is updated where it is brought in, with its optimizer state");
    s->disk = params == "disk";
    if (params == "host" && !s->cuda)
      s->host.log(
          TF_LOG_WARN,
          "offload: params = \"host\" on a CPU run keeps the weights in the same memory (no "
          "saving); params = \"disk\" is the saving here");
    s->optimizer_tier = s->host.get_string("optimizer");
    s->activations_tier = s->host.get_string("activations");
    if (!s->offload_params && s->optimizer_tier == "none" && s->activations_tier == "none")
      throw std::invalid_argument(
          "offload: params, optimizer and activations are all \"none\": nothing to offload");
    s->prefetch = s->host.get_int("prefetch");
    s->expert_prefetch = s->host.get_int("expert_prefetch");
    s->dir = s->host.get_string("dir");
    if (s->dir.empty()) s->dir = (fs::path(s->host.run_info().run_dir) / "offload").string();
    *out = s.release();
    return TF_OK;
  });
}

// Streaming setup: a stage's frozen weights leave memory as soon as they exist.
tf_status stage_params_ready(void* state, tf_host_context* ctx, int32_t stage) {
  auto* s = static_cast<Offload*>(state);
  if (!s->offload_params || stage < 0) return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->offload_stage(stage);
    return TF_OK;
  });
}

tf_status params_ready(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Offload*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    if (s->optimizer_tier != "none") {
      if (s->optimizer_tier == "host" && !s->cuda)
        s->host.log(TF_LOG_WARN,
                    "offload: optimizer = \"host\" on a CPU run keeps the state in the same memory "
                    "(no saving); optimizer = \"disk\" is the saving here");
      s->state = std::make_unique<offload::StateTier>(
          s->optimizer_tier == "disk" ? offload::StateTier::Kind::disk
                                      : offload::StateTier::Kind::host,
          s->optimizer_tier == "disk" ? s->files() : "", s->cuda);
    }
    if (s->activations_tier != "none") {
      bool recomputed = false;
      for (int32_t i = 0; i < s->host.stage_count(); ++i)
        recomputed |= s->host.stage_info(i).recompute != 0;
      if (!recomputed)
        throw std::invalid_argument(
            "offload: activations = \"" + s->activations_tier +
            "\" moves the inputs that checkpointed stages keep for their recompute, and no "
            "stage is checkpointed; add [[strategy]] plugin = \"checkpoint\"");
      if (s->activations_tier == "host" && !s->cuda)
        s->host.log(
            TF_LOG_WARN,
            "offload: activations = \"host\" on a CPU run keeps them in the same memory (no "
            "saving); activations = \"disk\" is the saving here");
      const tf_host_api* api = s->host.api();
      s->activations = std::make_unique<offload::ActivationStore>(
          s->activations_tier == "disk", s->activations_tier == "disk" ? s->files() : std::string(),
          // Raw calls, unchecked: this runs on the store's own thread too,
          // where a refused category costs only the attribution.
          s->cuda, [api, ctx](const std::function<void()>& f) {
            api->memory_push_category(ctx, TF_MEM_ACTIVATIONS);
            try {
              f();
            } catch (...) {
              api->memory_pop_category(ctx);
              throw;
            }
            api->memory_pop_category(ctx);
          });
    }
    if (s->offload_params) s->offload_stage(-1);
    if (s->offload_params && s->weights.empty() && !s->state && !s->activations)
      throw std::invalid_argument(
          "offload: no frozen block weights to offload (trainable weights stay in memory in "
          "this version: combine with lora, freeze stages, or offload the optimizer state "
          "with optimizer = \"disk\")");
    if (!s->weights.empty()) {
      s->worker = std::thread([s] { s->worker_loop(); });
      s->host.log(
          TF_LOG_INFO,
          std::string(s->disk ? "disk" : "host") + " tier: " + std::to_string(s->weights.size()) +
              " weights, " + std::to_string(s->offloaded_bytes >> 20) + " MiB" +
              (s->disk ? " in " + s->dir + " (" + describe(s->tier_io) + ")" : std::string()) +
              (s->expert_weights > 0 ? "; " + std::to_string(s->expert_weights) +
                                           " expert weights brought in only when a batch is "
                                           "routed to them"
                                     : std::string()) +
              (s->expert_weights < s->on_demand_weights
                   ? "; " + std::to_string(s->on_demand_weights - s->expert_weights) +
                         " copies of weights (a reference model's) brought in only when a "
                         "pass reads them"
                   : std::string()));
    }
    return TF_OK;
  });
}

tf_status stage_event(void* state, tf_host_context* ctx, const tf_stage_event* ev) {
  auto* s = static_cast<Offload*>(state);
  // A new forward: activations of a pass whose backward never came are stale.
  if (s->activations && ev->phase == TF_PHASE_FORWARD && ev->begin && ev->stage == 0 &&
      s->activations->size())
    s->activations->clear();
  if (!s->by_stage.count(ev->stage)) {
    // Nothing of this stage is offloaded; still read ahead for the next ones.
    if (ev->begin && ev->phase != TF_PHASE_ACCESS) {
      const int32_t dir = ev->phase == TF_PHASE_FORWARD ? 1 : -1;
      for (int32_t k = 1; k <= s->prefetch; ++k) s->request(ev->stage + dir * k);
    }
    return TF_OK;
  }
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const int32_t dir = ev->phase == TF_PHASE_FORWARD ? 1 : -1;
    if (ev->begin) {
      s->swap_in(ev->stage);
      s->expect_for_event(ev->stage, ev->phase);
      if (ev->phase != TF_PHASE_ACCESS)
        for (int32_t k = 1; k <= s->prefetch; ++k) s->request(ev->stage + dir * k);
    } else if (ev->phase != TF_PHASE_RECOMPUTE) {  // backward of a recomputed stage still needs it
      s->swap_out(ev->stage);
    }
    return TF_OK;
  });
}

// An expert the model fetches for the tokens routed to it (ABI 1.15).
tf_status want_weight(void* state, tf_host_context* ctx, const char* name) {
  auto* s = static_cast<Offload*>(state);
  const auto it = s->weights.find(name);
  if (it == s->weights.end() || !it->second.on_demand) return TF_NOT_HANDLED;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->bring_in(it->first, it->second);
    return TF_OK;
  });
}

// An expert the model will fetch next, once its router has chosen (ABI 1.17).
tf_status expect_weight(void* state, tf_host_context* ctx, const char* name) {
  auto* s = static_cast<Offload*>(state);
  const auto it = s->weights.find(name);
  if (it == s->weights.end() || !it->second.on_demand) return TF_NOT_HANDLED;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->expect(it->first);
    return TF_OK;
  });
}

// The experts brought in during the step (forward, recompute and backward
// each count), as metrics: how much of the expert weights the batches used,
// and how many of them had been read ahead.
tf_status step_begin(void* state, tf_host_context*, int64_t) {
  auto* s = static_cast<Offload*>(state);
  s->expert_loads = s->expert_load_bytes = s->expert_ahead_hits = 0;  // outside: not its own
  s->copy_load_bytes = 0;
  return TF_OK;
}

tf_status step_end(void* state, tf_host_context* ctx, int64_t, double) {
  auto* s = static_cast<Offload*>(state);
  if (s->on_demand_weights == 0) return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    if (s->expert_weights > 0) {
      s->host.log_metric("expert_loads", static_cast<double>(s->expert_loads));
      s->host.log_metric("expert_mib", static_cast<double>(s->expert_load_bytes) / (1 << 20));
      s->host.log_metric("expert_read_ahead", static_cast<double>(s->expert_ahead_hits));
    }
    // The reference model's copies read this step (a reference pass's).
    if (s->expert_weights < s->on_demand_weights)
      s->host.log_metric("copy_mib", static_cast<double>(s->copy_load_bytes) / (1 << 20));
    s->expert_loads = s->expert_load_bytes = s->expert_ahead_hits = 0;
    s->copy_load_bytes = 0;
    return TF_OK;
  });
}

tf_status pack_activation(void* state, tf_host_context* ctx, int32_t stage, tf_tensor x,
                          uint64_t* key) {
  auto* s = static_cast<Offload*>(state);
  if (!s->activations) return TF_NOT_HANDLED;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    *key = s->activations->pack(stage, tf_sdk::borrow(x));
    return TF_OK;
  });
}

tf_status unpack_activation(void* state, tf_host_context* ctx, int32_t, uint64_t key,
                            tf_tensor* out) {
  auto* s = static_cast<Offload*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    if (!s->activations)
      throw std::logic_error("offload: unpack_activation without an activation tier");
    *out = tf_sdk::give(s->activations->unpack(key));
    return TF_OK;
  });
}

int32_t state_slots(const Offload& s) {
  return s.host.optimizer_info().n_state;
}

// The update of a trainable parameter where its optimizer state lives.
tf_status optimizer_step_param(void* state, tf_host_context* ctx, const char* name,
                               tf_tensor param_h, tf_tensor grad_h, double) {
  auto* s = static_cast<Offload*>(state);
  if (!s->state) return TF_NOT_HANDLED;
  const tf_host_api* api = s->host.api();
  return tf_sdk::guard(api, ctx, [&] {
    const int32_t n = state_slots(*s);
    if (n == 0) return TF_NOT_HANDLED;  // plain SGD keeps no state
    at::NoGradGuard no_grad;
    const at::Tensor& param = tf_sdk::borrow(param_h);
    const at::Tensor& grad = tf_sdk::borrow(grad_h);
    // A trained weight in the tier whose stage is not running: bring its
    // bytes in for the update, then write it back and free them again.
    Offloaded* away = nullptr;
    if (auto w = s->weights.find(name);
        w != s->weights.end() && w->second.trainable && !has_bytes(w->second.leaf)) {
      away = &w->second;
      s->fill_leaf(*away, s->read(name, *away));
    }
    const bool here = param.device().is_cpu();
    const tf_sdk::MemoryCategory transient(s->host, TF_MEM_TRANSIENT);
    // On an accelerator, the update runs on host copies (CPU Adam, as ZeRO-Offload does).
    at::Tensor p = here ? param.detach() : param.detach().to(at::kCPU);
    at::Tensor g = here ? grad : grad.to(at::kCPU);
    s->state->with_state(name, param.sizes(), n, [&](std::vector<at::Tensor>& slots) {
      s->host.optimizer_update(name, p, g, slots);
    });
    if (!here) param.detach().copy_(p);
    if (away) {  // (after a failure the run stops; the bytes may stay until then)
      s->store_back(name, *away);
      free_bytes(away->leaf);
    }
    return TF_OK;
  });
}

// The tier's state goes into checkpoints like the kernel's own.
tf_status save_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Offload*>(state);
  if (!s->state) return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const int32_t n = state_slots(*s);
    for (const auto& name : s->state->names()) {
      const tf_param_info info = s->host.param_info(name);
      s->state->with_state(name, at::IntArrayRef(info.shape, info.ndim), n,
                           [&](std::vector<at::Tensor>& slots) {
                             for (int32_t i = 0; i < n; ++i)
                               s->host.save_tensor(name + ".state" + std::to_string(i), slots[i]);
                           });
    }
    return TF_OK;
  });
}

tf_status load_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Offload*>(state);
  if (!s->state) return TF_OK;
  const tf_host_api* api = s->host.api();
  return tf_sdk::guard(api, ctx, [&] {
    const int32_t n = state_slots(*s);
    for (const auto& name : s->host.param_names()) {
      const tf_param_info info = s->host.param_info(name);
      if (!info.trainable || n == 0) continue;
      std::vector<at::Tensor> saved;
      for (int32_t i = 0; i < n; ++i) {
        std::optional<at::Tensor> slot =
            s->host.find_saved_tensor(name + ".state" + std::to_string(i));
        if (!slot) break;
        saved.push_back(std::move(*slot));
      }
      if (saved.empty()) continue;  // never updated before the checkpoint
      if (static_cast<int32_t>(saved.size()) != n)
        throw std::runtime_error("offload: the checkpoint has " + std::to_string(saved.size()) +
                                 " of " + std::to_string(n) + " optimizer state tensors for " +
                                 name);
      s->state->with_state(name, at::IntArrayRef(info.shape, info.ndim), n,
                           [&](std::vector<at::Tensor>& slots) {
                             for (int32_t i = 0; i < n; ++i) slots[i].copy_(saved[i]);
                           });
    }
    return TF_OK;
  });
}

// Frozen block weights and/or the optimizer state leave the device tier; a
// stage's weights come back while it computes, with `prefetch` more stages
// on their way. Before the weights are offloaded (a plan made from the
// recipe) the same selection is made from the declarations, at their
// declared (dense) size.
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary* model,
                          tf_memory_estimate* out) {
  auto* s = static_cast<Offload*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    std::map<int32_t, int64_t> stage_bytes;
    int64_t moved_experts = 0, largest_expert = 0;  // on demand, not with their stage
    if (s->offload_params) {
      for (const std::string& name : s->host.param_names()) {
        const tf_param_info info = s->host.param_info(name);
        if ((info.trainable && (!s->offload_trainable || info.format != TF_FORMAT_DENSE)) ||
            info.stage < 0 || s->host.stage_info(info.stage).kind != TF_STAGE_BLOCK ||
            s->host.stage_info(info.stage).skip)
          continue;
        // In a plan: what earlier strategies planned for it (4-bit after
        // quantize), moved to this tier in the table.
        const bool on_demand = offload::read_on_demand(info);
        int64_t bytes = info.stored_bytes > 0 ? info.stored_bytes : tf_sdk::dense_bytes(info);
        if (s->host.has_param_plan() && s->offloaded_bytes == 0) {
          const tf_param_plan p = s->host.planned(name);
          if (p.tier != TF_TIER_DEVICE) continue;
          bytes = p.bytes;
          s->host.plan(name, p.bytes, p.format, s->tier());
        }
        if (on_demand) {
          moved_experts += bytes;
          largest_expert = std::max(largest_expert, bytes);
          continue;
        }
        stage_bytes[info.stage] += bytes;
      }
    }
    int64_t moved = s->offloaded_bytes + (s->offloaded_bytes == 0 ? moved_experts : 0), largest = 0;
    for (const auto& [stage, bytes] : stage_bytes) {
      if (s->offloaded_bytes == 0) moved += bytes;
      largest = std::max(largest, bytes);
    }
    if (!s->host.has_param_plan() || s->offloaded_bytes > 0) {  // as a weights delta
      out->delta_bytes[TF_TIER_DEVICE][TF_MEM_WEIGHTS] -= moved;
      out->delta_bytes[s->tier()][TF_MEM_WEIGHTS] += moved;
    }
    // Stages in flight with their weights, and the experts resident at once;
    // those read ahead wait in host memory (the same memory on a CPU run).
    out->delta_bytes[TF_TIER_DEVICE][TF_MEM_TRANSIENT] +=
        (1 + s->prefetch) * largest +
        static_cast<int64_t>(Offload::kExpertsResident) * largest_expert;
    if (s->disk)
      out->delta_bytes[s->cuda ? TF_TIER_HOST : TF_TIER_DEVICE][TF_MEM_TRANSIENT] +=
          s->expert_prefetch * largest_expert;
    if (s->optimizer_tier != "none") {
      const int64_t bytes = 4 * state_slots(*s) * model->n_trainable;
      out->delta_bytes[TF_TIER_DEVICE][TF_MEM_OPTIMIZER] -= bytes;
      out->delta_bytes[s->optimizer_tier == "disk" ? TF_TIER_DISK : TF_TIER_HOST]
                      [TF_MEM_OPTIMIZER] += bytes;
    }
    if (s->activations_tier != "none" &&
        TF_SDK_REACHES(out, tf_memory_estimate, recompute_inputs_tier))
      out->recompute_inputs_tier = s->activations_tier == "disk" ? TF_TIER_DISK : TF_TIER_HOST;
    out->time_factor = 0;
    out->time_from_plan = 1;  // tightfit fit prices it from the plan
    if (TF_SDK_REACHES(out, tf_memory_estimate, prefetch_stages))
      out->prefetch_stages = static_cast<int32_t>(s->prefetch);  // reads it hides behind compute
    return TF_OK;
  });
}

// `tightfit fit` may add it. A host tier is searched on CUDA runs only (on
// a CPU run it is the same memory); inputs move only for checkpointed
// stages; a trained weight goes to a tier with its optimizer state.
const tf_plugin_search kSearch = {.struct_size = sizeof(tf_plugin_search), .stack_order = 50};
const tf_search_value kParamTiers[] = {
    tf_sdk::search_value("\"none\"", nullptr, nullptr, 0, TF_SEARCH_VALUE_OFF),
    tf_sdk::search_value("\"host\"", "weights@host", nullptr, 0, TF_SEARCH_VALUE_CUDA_ONLY,
                         "where block weights live"),
    tf_sdk::search_value("\"disk\"", "weights@disk", nullptr, 0, 0, "where block weights live"),
};
const tf_search_value kStateTiers[] = {
    tf_sdk::search_value("\"none\"", nullptr, nullptr, 0, TF_SEARCH_VALUE_OFF),
    tf_sdk::search_value("\"host\"", "optimizer@host", nullptr, 0, TF_SEARCH_VALUE_CUDA_ONLY,
                         "optimizer state"),
    tf_sdk::search_value("\"disk\"", "optimizer@disk", nullptr, 0, 0, "optimizer state"),
};
const tf_search_value kInputTiers[] = {
    tf_sdk::search_value("\"none\"", nullptr, nullptr, 0, TF_SEARCH_VALUE_OFF),
    tf_sdk::search_value("\"host\"", "activations@host", nullptr, 0, TF_SEARCH_VALUE_CUDA_ONLY,
                         nullptr, "checkpoint"),
    tf_sdk::search_value("\"disk\"", "activations@disk", nullptr, 0, 0, nullptr, "checkpoint"),
};
const tf_search_value kTrainable[] = {
    tf_sdk::search_value("false", nullptr, nullptr, 0, TF_SEARCH_VALUE_OFF),
    tf_sdk::search_value("true", "trained weights too"),
};
const tf_search_value kPrefetch[] = {
    // more read ahead holds more
    tf_sdk::search_value("2", "prefetch {}"),
    tf_sdk::search_value("1", "prefetch {}"),
};
const tf_key_search kParamsSearch = tf_sdk::key_search(kParamTiers);
const tf_key_search kStateSearch = tf_sdk::key_search(kStateTiers);
const tf_key_search kInputsSearch = tf_sdk::key_search(kInputTiers);
const tf_key_search kTrainableSearch = tf_sdk::key_search(kTrainable, 0, "params");
const tf_key_search kPrefetchSearch = tf_sdk::key_search(kPrefetch, 0, "params");

const tf_config_key kKeys[] = {
    tf_sdk::searched(
        tf_sdk::key("params", TF_VALUE_STRING, "\"disk\"",
                    "tier for frozen block weights (none: leave them)", 1, 0, "disk|host|none"),
        kParamsSearch),
    tf_sdk::searched(tf_sdk::key("optimizer", TF_VALUE_STRING, "\"none\"",
                                 "tier for the optimizer state of trainable weights, updated "
                                 "there (ZeRO-Offload)",
                                 1, 0, "none|host|disk"),
                     kStateSearch),
    tf_sdk::searched(tf_sdk::key("activations", TF_VALUE_STRING, "\"none\"",
                                 "tier for the inputs checkpointed stages keep until backward "
                                 "(needs checkpoint)",
                                 1, 0, "none|host|disk"),
                     kInputsSearch),
    tf_sdk::searched(
        tf_sdk::key("trainable", TF_VALUE_BOOL, "false",
                    "params tier also for trained block weights (needs optimizer = disk|host)"),
        kTrainableSearch),
    tf_sdk::searched(tf_sdk::key("prefetch", TF_VALUE_INT, "1",
                                 "stages read ahead on a background thread", 0, 64),
                     kPrefetchSearch),
    tf_sdk::key("expert_prefetch", TF_VALUE_INT, "6",
                "disk tier: expert weights read ahead on that thread once the router has chosen "
                "(and in backward, those the forward used); 0 = each read when fetched",
                0, 1024),
    tf_sdk::key("dir", TF_VALUE_STRING, "\"\"", "disk tier folder; empty = <run folder>/offload"),
};

const tf_strategy_vtable kVtable = {.struct_size = sizeof(tf_strategy_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<Offload>,
                                    .params_ready = params_ready,
                                    .step_begin = step_begin,
                                    .step_end = step_end,
                                    .stage_event = stage_event,
                                    .optimizer_step_param = optimizer_step_param,
                                    .estimate_memory = estimate_memory,
                                    .save_state = save_state,
                                    .load_state = load_state,
                                    .stage_params_ready = stage_params_ready,
                                    .pack_activation = pack_activation,
                                    .unpack_activation = unpack_activation,
                                    .want_weight = want_weight,
                                    .expect_weight = expect_weight};

const tf_plugin_descriptor kDescriptor =
    tf_sdk::searched(tf_sdk::describe(TF_PLUGIN_STRATEGY, "offload", "0.2.0",
                                      "frozen block weights on a disk tier streamed with prefetch; "
                                      "optimizer state on a host/disk "
                                      "tier, updated there",
                                      kKeys, &kVtable),
                     kSearch);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
