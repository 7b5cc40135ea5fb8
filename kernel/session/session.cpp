#include "session.hpp"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "file_util.hpp"
#include "host_reads.hpp"
#include "ignore_index.hpp"
#include "input_files.hpp"
#include "json_output.hpp"
#include "logging.hpp"
#include "op_timer.hpp"
#include "plugin_hooks.hpp"
#include "strategy_chain.hpp"
#include "tensor_handle.hpp"

namespace tightfit {
namespace fs = std::filesystem;

Session::Session(const Recipe& recipe, const PluginRegistry& registry, SessionOptions options)
    : recipe_(recipe), options_(std::move(options)) {
  process_at_start_ = read_process_memory().value_or(ProcessMemory{});
  parts_.env = &env_;
  parts_.plugins = &plugins_;
  parts_.store = &store_;
  parts_.executor = &executor_;
  parts_.update = &update_;
  parts_.snapshots = &snapshots_;
  parts_.data = &data_;
  parts_.plan = &plan_;
  parts_.step_metrics = &step_metrics_;
  parts_.weights = [this] { return weight_source(); };
  parts_.log = [this](tf_log_level level, const std::string& message) { log(level, message); };
  parts_.open_scorer = [this](const std::string& model) { return open_scorer(model); };
  try {
    build(registry);
  } catch (const c10::Error& e) {
    if (auto refusal = budget_refusal(e)) throw OutOfBudgetError(*refusal);
    throw;
  }
}

// The plugins go first, while every part they may still reach exists.
Session::~Session() {
  plugins_.destroy_all();
  forget_inputs(this);  // its files may go now, and their inode numbers be reused
}

void Session::log(tf_log_level level, const std::string& message) {
  if (options_.on_log) options_.on_log(message);
  log_message(level, message);
}

void Session::write_op_profile(const OpTimer& timer, double wall_s,
                               const OpCounter::Counts& last_step) const {
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& [name, s] : timer.by_name()) ops.push_back({{"op", name}, {"seconds", s}});
  // The last step's dispatched ops by name, most first.
  std::vector<std::pair<std::string, int64_t>> counts(last_step.outermost_by_name.begin(),
                                                      last_step.outermost_by_name.end());
  std::stable_sort(counts.begin(), counts.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  nlohmann::json dispatched = nlohmann::json::array();
  for (const auto& [name, n] : counts) dispatched.push_back({{"op", name}, {"count", n}});
  nlohmann::json j = {{"wall_s", wall_s},
                      {"inside_ops_s", timer.seconds()},
                      {"ops", ops},
                      {"last_step_dispatched", dispatched}};
  write_file_synced((fs::path(env_.run_dir) / "profile.json").string(), dump_json(j, 1));
}

double Session::eval_loss(int64_t batches) {
  if (batches <= 0) return std::nan("");
  at::NoGradGuard no_grad;
  // A schedule that defines its loss (preference training) scores the
  // held-out batches itself; the mean cross-entropy of chosen and rejected
  // rows together would be no loss anyone trains on.
  PluginInstance& schedule = plugins_.schedule;
  const bool by_schedule = schedule.plugin->schedule()->eval_batch != nullptr;
  if (!by_schedule && (data_.pairs() || data_.prompts())) {
    if (!eval_unreported_logged_)
      log(TF_LOG_WARN, "no held-out loss: schedule \"" + schedule.plugin->name +
                           "\" defines none for " +
                           (data_.pairs() ? "preference pairs" : "prompts") + " (eval_batch)");
    eval_unreported_logged_ = true;
    return std::nan("");
  }
  double sum = 0;
  at::Tensor on_device;  // the batches' losses, summed where they are and read once
  for (int64_t i = 0; i < batches; ++i) {
    auto b = data_.batcher().validation(i);
    if (!by_schedule) {
      const at::Tensor loss = executor_
                                  .forward_loss(b.tokens, b.targets, /*training=*/false,
                                                {b.positions, b.attention_mask})
                                  .detach()
                                  .to(at::kDouble);
      on_device = on_device.defined() ? on_device + loss.to(on_device.device()) : loss;
      continue;
    }
    tf_batch batch{};
    batch.struct_size = sizeof batch;
    batch.n_tokens = b.tokens.numel();
    batch.n_targets = count_not_equal(b.targets, kIgnoreIndex);
    batch.pairs = b.pairs;
    batch.prompts = b.prompts;
    batch.tokens = give_handle(b.tokens);
    batch.targets = give_handle(b.targets);
    batch.positions = b.positions.defined() ? give_handle(b.positions) : nullptr;
    batch.desirable = b.desirable.defined() ? give_handle(b.desirable) : nullptr;
    batch.row_ids = b.row_ids.defined() ? give_handle(b.row_ids) : nullptr;
    batch.attention_mask = b.attention_mask.defined() ? give_handle(b.attention_mask) : nullptr;
    batch.answer_first = b.answer_first.defined() ? give_handle(b.answer_first) : nullptr;
    tf_pass_result r{};
    r.struct_size = sizeof r;
    const tf_status st =
        call_hook(schedule, schedule.plugin->schedule(), TF_SCHEDULE_HOOK(eval_batch), &batch, &r);
    for (tf_tensor t : {batch.tokens, batch.targets, batch.positions, batch.desirable,
                        batch.row_ids, batch.attention_mask, batch.answer_first})
      release_handle(t);
    check_plugin_status(st, schedule, "eval_batch");
    sum += r.loss;
  }
  if (on_device.defined()) sum += read_value(on_device);
  return sum / static_cast<double>(batches);
}

}  // namespace tightfit
