// What every host service (tf_host_api) is built from: serve() catches every
// exception and turns it into a status plus last_error, so no C++ exception
// crosses the ABI; the struct helpers honour the caller's struct_size both
// ways. The services themselves are grouped in host_api_<group>.cpp, each
// adding its entries to the table (host_api.cpp).
#pragma once

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>

#include "kernel_parts.hpp"
#include "logging.hpp"
#include "plugin_call_scope.hpp"
#include "tensor_handle.hpp"

namespace tightfit::host_services {

// A service used outside the calls it is meant for (the header promises
// TF_ERR_UNSUPPORTED for these).
struct WrongPhase : std::logic_error {
  using std::logic_error::logic_error;
};

// The status (and last_error) for an exception a host service threw; a
// budget refusal is also recorded as such for check_plugin_status.
inline tf_status status_for(tf_host_context* ctx, const std::exception& e) noexcept {
  try {
    if (auto refusal = budget_refusal(e)) {
      ctx->last_error = ctx->budget_refusal = *refusal;
      return TF_ERR_OUT_OF_MEMORY;
    }
    if (const auto* c = dynamic_cast<const c10::Error*>(&e)) {
      ctx->last_error = c->what_without_backtrace();
      return TF_ERROR;
    }
    ctx->last_error = e.what();
    if (dynamic_cast<const WrongPhase*>(&e)) return TF_ERR_UNSUPPORTED;
    if (dynamic_cast<const std::out_of_range*>(&e)) return TF_ERR_NOT_FOUND;
    if (dynamic_cast<const std::invalid_argument*>(&e)) return TF_ERR_INVALID_ARGUMENT;
  } catch (...) {  // no memory left for the message
  }
  return TF_ERROR;
}

// Whether a caller's tf_batch reaches ABI 1.16's attention_mask (an older
// one cannot say which tokens pad its rows).
bool covers_attention_mask(const tf_batch* b);

// Whether this thread may use ctx's services: it runs a call the host made
// into a plugin, or it is the thread that owns the session. A plugin's own
// thread is refused before anything of ctx is touched (last_error included,
// which that thread would race on); the host says so once per plugin.
inline bool on_a_host_thread(tf_host_context* ctx) noexcept {
  if (PluginCallScope::active() || std::this_thread::get_id() == ctx->owner_thread) return true;
  if (!ctx->warned_foreign_thread.exchange(true)) {
    try {
      const std::string warning = "[" + ctx->plugin_name +
                                  "] called a host service from a thread the host did not call "
                                  "it on; it was refused (TF_ERR_UNSUPPORTED). Only "
                                  "tensor_release, log and memory_push/pop_category may be "
                                  "called from a plugin's own threads";
      if (ctx->kernel)  // as the plugin's own log lines go (log is safe from any thread)
        ctx->kernel->log(TF_LOG_WARN, warning);
      else
        log_message(TF_LOG_WARN, warning);
    } catch (...) {  // no memory for the warning; the refusal stands
    }
  }
  return false;
}

template <class F>
tf_status serve(tf_host_context* ctx, F&& body) noexcept {
  if (ctx == nullptr) return TF_ERR_INVALID_ARGUMENT;
  if (!on_a_host_thread(ctx)) return TF_ERR_UNSUPPORTED;
  try {
    body();
    return TF_OK;
  } catch (const std::exception& e) {
    return status_for(ctx, e);
  } catch (...) {
    ctx->last_error = "unknown error in host service";
    return TF_ERROR;
  }
}

template <class T>
void require(T* p, const char* what) {
  if (p == nullptr) throw std::invalid_argument(std::string(what) + " must not be NULL");
}

// A caller's struct must at least hold its struct_size and version fields.
template <class T>
void check_size(const T* s, const char* what) {
  require(s, what);
  if (s->struct_size < sizeof(uint32_t) * 2)
    throw std::invalid_argument(std::string(what) + ".struct_size is too small");
}

// Copies a caller's struct into a zeroed one of ours, honouring its
// struct_size: fields past an older caller's struct read as 0.
template <class T>
T read_struct(const T* s) {
  check_size(s, "input struct");
  T out{};
  std::memcpy(&out, s, std::min<size_t>(s->struct_size, sizeof(T)));
  out.struct_size = sizeof(T);
  return out;
}

// Writes ours into the caller's struct, no further than its struct_size, and
// reports how much of it was written: min(the caller's size, ours).
template <class T>
void write_struct(T* dst, T src) {
  const size_t n = std::min<size_t>(dst->struct_size, sizeof(T));
  src.struct_size = static_cast<uint32_t>(n);
  std::memcpy(dst, &src, n);
}

// Strings handed to plugins stay valid for the life of the process (a
// parameter's name survives later declarations that move the table).
const char* intern(const std::string& s);

// A loss pass's mean cross-entropy over preference pairs would train on
// the rejected answers too: refused, naming the schedules that score them.
void refuse_pairs_in_a_loss_pass(const tf_batch& b);

// Every service of the table, in its order: h_<name> serves tf_host_api::<name>.
// clang-format off
#define TIGHTFIT_HOST_SERVICES(X) \
  X(set_error) X(last_error) X(log) X(config_get_bool) X(config_get_int) X(config_get_double) \
  X(config_get_string) X(config_get_list_string) X(config_get_list_int) X(config_has) X(run_info) \
  X(tensor_release) X(declare_param) X(declare_stage) X(weight) X(linear) X(param_count) \
  X(param_name) X(param_info) X(param_storage) X(param_set_storage) X(param_set_trainable) X(param_grad) X(param_add_) \
  X(stage_count) X(stage_info) X(stage_set_recompute) X(stage_set_device) X(stage_set_skip) \
  X(stage_set_trainable) X(memory_stats) X(memory_push_category) X(memory_pop_category) \
  X(next_batch) X(batch_release) X(forward) X(forward_backward) X(zero_grad) X(optimizer_step) \
  X(set_lr) X(base_lr) X(snapshot_take) X(snapshot_restore) X(snapshot_drop) X(perturb_params) \
  X(log_metric) X(state_put_tensor) X(state_get_tensor) X(state_put_double) X(state_get_double) \
  X(optimizer_apply) X(optimizer_info) X(set_micro_batch) X(micro_batch) X(tensors_save) \
  X(tensors_load) X(optimizer_update) X(dist_all_reduce) X(dist_reduce_scatter) \
  X(dist_all_gather) X(dist_broadcast) X(dist_barrier) X(plan_param_get) X(plan_param_set) \
  X(param_source_blocks) X(blocks_decode) X(sequence_logps) X(adapters_set_enabled) X(token_logps) \
  X(preference_rows) X(add_loss_term) X(expect_weights) X(take_loss_terms) \
  X(declare_param_copies) X(use_param_copies) X(take_mean_logits) X(run_pass) \
  X(read_later) X(progress) X(declare_kept_param_copies) X(generate) X(score_rewards) \
  X(score_texts) X(tiled_over_tokens)
// clang-format on

// Each declared with the exact type of its slot in the table.
#define TIGHTFIT_DECLARE_HOST_SERVICE(name) \
  std::remove_pointer_t<decltype(tf_host_api::name)> h_##name;
TIGHTFIT_HOST_SERVICES(TIGHTFIT_DECLARE_HOST_SERVICE)
#undef TIGHTFIT_DECLARE_HOST_SERVICE

}  // namespace tightfit::host_services
