// The training loop: steps, progress, evaluation and saving on schedule, the
// non-finite policy, and the run's summary.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>

#include "cross_entropy.hpp"
#include "cuda_memory.hpp"
#include "data_setup.hpp"
#include "device_spec.hpp"
#include "file_util.hpp"
#include "generation.hpp"
#include "hf_shards.hpp"
#include "hf_weights.hpp"
#include "kernel_keys.hpp"
#include "logging.hpp"
#include "op_timer.hpp"
#include "safetensors.hpp"
#include "session.hpp"
#include "strategy_chain.hpp"
#include "tensor_handle.hpp"

namespace tightfit {
namespace fs = std::filesystem;

void Session::step_begin(int64_t step) {
  MemoryAccounting::instance().clear_refusal();  // one a plugin recovered from is over
  StrategyChain(strategies_).each(&tf_strategy_vtable::step_begin, "step_begin", step);
}

void Session::emit_progress(const ProgressInfo& p) {
  if (options_.on_progress) options_.on_progress(p);
}

bool Session::handle_non_finite() {
  const std::string policy = run_cfg_.get_string("on_non_finite");
  step_metrics_["non_finite"] = 1;
  if (policy == "skip") return false;  // the schedule skipped the update
  if (policy == "stop")
    throw NonFiniteError(non_finite_ +
                         ". The run stops ([run] on_non_finite = \"stop\"); saved checkpoints "
                         "are as they were. Lower the learning rate or set optimizer.grad_clip, "
                         "or choose \"skip\" or \"rollback\"");
  // Rollback: weights, optimizer and plugin state from the last checkpoint;
  // the data goes on past the batches since (they would lead here again).
  if (rollback_step_ != step_) rollbacks_here_ = 0;
  rollback_step_ = step_;
  if (++rollbacks_here_ > 3)
    throw NonFiniteError(non_finite_ + " again after 3 rollbacks; the run stops");
  const int64_t position = batcher_ ? batcher_->position() : 0;
  const int64_t bad_step = step_;
  if (!load_latest_checkpoint())
    throw NonFiniteError(non_finite_ +
                         "; on_non_finite = \"rollback\" but there is no checkpoint to roll back "
                         "to yet (set [save] every = N)");
  if (batcher_) batcher_->set_position(position);
  log(TF_LOG_WARN, "rolled back to the checkpoint of step " + std::to_string(step_) +
                       " after the non-finite step " + std::to_string(bad_step) +
                       "; training goes on with the batches after it");
  return true;
}

TrainSummary Session::train() {
  if (!batcher_)
    throw std::logic_error("this session was built without data (skip_data); it cannot train");
  TrainSummary sum;
  sum.run_dir = run_dir_;
  sum.checkpoint_dir = checkpoint_dir();
  sum.unigram_entropy = unigram_entropy_;
  sum.data = data_description_;
  sum.first_step = step_;
  sum.total_steps = run_info_.total_steps;
  // Rank 0 writes the metrics (its losses are the global batch's).
  const std::string metrics_path = (fs::path(run_dir_) / "metrics.jsonl").string();
  if (is_rank0()) metrics_ = MetricsWriter(metrics_path);
  sum.metrics_path = metrics_path;
  auto& acct = MemoryAccounting::instance();
  acct.reset_peaks();
  if (device_.is_cuda()) cuda_reset_peak(device_.has_index() ? device_.index() : 0);

  const int64_t total = run_info_.total_steps;
  const int64_t log_every = run_cfg_.get_int("log_every");
  const int64_t save_every = save_cfg_.get_int("every");
  const int64_t eval_interval = run_cfg_.get_int("eval_interval");
  const auto t0 = std::chrono::steady_clock::now();
  int64_t tokens = 0;
  std::optional<OpTimer> op_timer;
  if (run_cfg_.get_bool("profile_ops")) op_timer.emplace();
  try {
    const int64_t stop_at =
        options_.stop_after_steps >= 0 ? std::min(total, step_ + options_.stop_after_steps) : total;
    for (; step_ < stop_at; ++step_) {
      step_metrics_.clear();
      const auto step_t0 = std::chrono::steady_clock::now();
      const double op_s0 = op_timer ? op_timer->seconds() : 0;
      step_begin(step_);
      tf_step_result r{};
      r.struct_size = sizeof r;
      non_finite_.clear();
      check(schedule_.plugin->schedule()->run_step(schedule_.state, schedule_.ctx.get(), step_,
                                                   total, &r),
            schedule_, "run_step");
      StrategyChain(strategies_).each(&tf_strategy_vtable::step_end, "step_end", step_, r.loss);
      if (!non_finite_.empty()) {
        const int64_t bad_step = step_;
        if (handle_non_finite()) {
          sum.losses.push_back(r.loss);
          metrics_.write({{"step", bad_step + 1},
                          {"loss", nullptr},
                          {"non_finite", 1},
                          {"rolled_back_to", step_}});
          --step_;  // the loop's ++ lands on the checkpoint's step
          continue;
        }
      }
      tokens += r.n_tokens * run_info_.world_size;
      sum.backward_passes += r.backward_passes;
      sum.losses.push_back(r.loss);
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const MemorySnapshot mem = memory_snapshot();
      nlohmann::json rec = {{"step", step_ + 1},
                            {"loss", r.loss},
                            {"lr", r.lr},
                            {"tokens", r.n_tokens},
                            {"elapsed_s", elapsed},
                            {"phase", r.phase ? r.phase : "full"},
                            {"backward_passes", r.backward_passes}};
      for (int c = 0; c < TF_MEM_CATEGORY_COUNT - 1; ++c)
        rec["peak_" + std::string(category_name(static_cast<tf_mem_category>(c)))] = mem.peak[c];
      rec["peak_total"] = mem.total_peak;
      nlohmann::json at_peak = nlohmann::json::object();
      for (int c = 0; c < TF_MEM_CATEGORY_COUNT; ++c)
        at_peak[category_name(static_cast<tf_mem_category>(c))] = mem.at_peak[c];
      rec["at_peak"] = std::move(at_peak);
      if (device_.is_cuda()) rec["peak_device"] = mem.device_peak;
      for (const auto& [k, v] : step_metrics_)
        rec[k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
      if (op_timer) {
        rec["op_s"] = op_timer->seconds() - op_s0;
        rec["step_s"] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - step_t0).count();
      }
      // Held-out loss every eval_interval steps (and after the last).
      if (eval_interval > 0 && ((step_ + 1) % eval_interval == 0 || step_ + 1 == stop_at)) {
        const double val = eval_loss(run_cfg_.get_int("eval_batches"));
        rec["eval_loss"] = std::isfinite(val) ? nlohmann::json(val) : nlohmann::json(nullptr);
        if (std::isfinite(val) && !(val >= sum.best_val_loss)) sum.best_val_loss = val;
      }
      metrics_.write(rec);
      const int64_t done = step_ + 1;
      if (done % log_every == 0 || done == stop_at) {
        ProgressInfo p;
        p.step = done;
        p.total = total;
        p.loss = r.loss;
        p.lr = r.lr;
        p.elapsed_s = elapsed;
        p.tokens_per_s = elapsed > 0 ? static_cast<double>(tokens) / elapsed : 0;
        const int64_t run_steps = done - sum.first_step;
        p.eta_s = run_steps > 0
                      ? elapsed / static_cast<double>(run_steps) * static_cast<double>(total - done)
                      : 0;
        p.phase = r.phase ? r.phase : "full";
        p.memory = mem;
        emit_progress(p);
      }
      if (save_every > 0 && done % save_every == 0 && done < stop_at) save_checkpoint(done);
    }
    sum.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sum.memory = memory_snapshot();
    if (op_timer && is_rank0()) write_op_profile(*op_timer, sum.wall_s);
    // An interrupted run always saves, so that --resume can continue it.
    if ((save_cfg_.get_bool("final") || step_ < total) && step_ > sum.first_step)
      save_checkpoint(step_);
    if (save_cfg_.get_bool("hf")) export_hf((fs::path(run_dir_) / "hf").string());
    if (is_rank0() && save_cfg_.get_bool("adapter"))
      export_adapter((fs::path(run_dir_) / "adapter").string());
    sum.steps_run = step_ - sum.first_step;
    sum.tokens_per_s = sum.wall_s > 0 ? static_cast<double>(tokens) / sum.wall_s : 0;
    sum.final_loss = sum.losses.empty() ? std::nan("") : sum.losses.back();
    sum.val_loss = eval_loss(run_cfg_.get_int("eval_batches"));
    if (std::isfinite(sum.val_loss) && !(sum.val_loss >= sum.best_val_loss))
      sum.best_val_loss = sum.val_loss;
    if (const int64_t n = run_cfg_.get_int("sample_tokens"); n > 0)
      sum.sample = generate(run_cfg_.get_string("sample_prompt"), n,
                            run_cfg_.get_int("sample_top_k"), 0.8, run_info_.seed);
  } catch (const c10::Error& e) {
    if (auto refusal = budget_refusal(e)) throw OutOfBudgetError(*refusal);
    throw;
  }
  return sum;
}

}  // namespace tightfit
