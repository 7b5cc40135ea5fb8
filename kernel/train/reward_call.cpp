#include "reward_call.hpp"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "plugin_set.hpp"
#include "tensor_handle.hpp"

namespace tightfit {

void RewardInput::finish() {
  prompt_ptrs.clear(), completion_ptrs.clear(), row_ptrs.clear();
  for (const std::string& s : prompts) prompt_ptrs.push_back(s.c_str());
  for (const std::string& s : completions) completion_ptrs.push_back(s.c_str());
  for (const std::string& s : rows) row_ptrs.push_back(s.c_str());
  batch = tf_reward_batch{};
  batch.struct_size = sizeof batch;
  batch.n = static_cast<int64_t>(prompts.size());
  batch.group_size = group_size;
  batch.prompts = prompt_ptrs.data();
  batch.completions = completion_ptrs.data();
  batch.rows = row_ptrs.data();
  batch.completion_ids = borrow_handle(ids);
  batch.lengths = borrow_handle(lengths);
}

namespace {

// A call in flight, shared by the host and the thread that runs it.
struct PendingScore {
  std::shared_ptr<RewardInput> input;
  std::vector<double> scores;
  tf_status status = TF_OK;
  std::exception_ptr error;  // what plugin_call threw (named already)
  bool done = false;
  std::mutex mutex;
  std::condition_variable finished;
  // An abandoned call's context, kept for as long as the call may use it.
  std::unique_ptr<tf_host_context> kept_context;
};

}  // namespace

std::vector<double> score_within_time_limit(RewardInstance& reward,
                                            const std::shared_ptr<RewardInput>& input) {
  auto call = std::make_shared<PendingScore>();
  call->input = input;
  call->scores.assign(static_cast<size_t>(input->batch.n), std::nan(""));
  PluginInstance& inst = reward.instance;
  const tf_reward_vtable* vt = inst.plugin->reward();
  void* state = inst.state;
  tf_host_context* ctx = inst.ctx.get();
  // The thread touches only what outlives an abandoned call: `call`, the
  // plugin's code and state, and the context (kept with `call` then).
  std::thread([call, vt, state, ctx] {
    tf_status status = TF_ERROR;
    std::exception_ptr error;
    {
      const PluginCallScope in_plugin_call;  // its host services, served on this thread
      try {
        status = vt->score(state, ctx, &call->input->batch, call->scores.data());
      } catch (...) {  // past the C ABI: named on the host's side
        error = std::current_exception();
      }
    }
    const std::lock_guard lock(call->mutex);
    call->status = status;
    call->error = error;
    call->done = true;
    call->finished.notify_all();
  }).detach();
  std::unique_lock lock(call->mutex);
  const auto limit = std::chrono::duration<double>(reward.time_limit_s);
  if (!call->finished.wait_for(lock, limit, [&] { return call->done; })) {
    // Abandoned: never destroyed, its context alive with the call.
    inst.state = nullptr;
    call->kept_context = std::move(inst.ctx);
    throw PluginCallError(
        "reward \"" + reward.name + "\" (plugin \"" + inst.plugin->name + "\") did not return " +
        "from score within its time_limit of " + c10::str(reward.time_limit_s) + " s (" +
        std::to_string(input->batch.n) +
        " completions); the run stops with nothing trained on this batch and the reward left "
        "running. Fix a reward that hangs, or raise [[reward]] time_limit for a slow one");
  }
  ctx->end_progress();
  if (call->error) {
    try {
      std::rethrow_exception(call->error);
    } catch (...) {
      rethrow_from_plugin(inst, "score");
    }
  }
  check_plugin_status(call->status, inst, "score");
  return call->scores;
}

}  // namespace tightfit
