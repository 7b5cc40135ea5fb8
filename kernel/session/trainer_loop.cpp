// The training loop: steps, progress, evaluation and saving on schedule, the
// non-finite policy, and the run's summary.
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <memory>
#include <optional>

#include "cuda_memory.hpp"
#include "host_reads.hpp"
#include "op_counter.hpp"
#include "op_timer.hpp"
#include "plugin_hooks.hpp"
#include "process_memory.hpp"
#include "session.hpp"
#include "step_record.hpp"
#include "stop_request.hpp"
#include "strategy_chain.hpp"

namespace tightfit {
namespace fs = std::filesystem;

void Session::step_begin(int64_t step) {
  MemoryAccounting::instance().clear_refusal();  // one a plugin recovered from is over
  if (cpu_threads_) cpu_threads_->between_steps();
  StrategyChain(plugins_.strategies).each(TF_STRATEGY_HOOK(step_begin), step);
}

void Session::emit_progress(const ProgressInfo& p) {
  if (options_.on_progress) options_.on_progress(p);
}

bool Session::handle_non_finite() {
  const std::string policy = env_.config.run.on_non_finite;
  step_metrics_["non_finite"] = 1;
  if (policy == "skip") return false;  // the schedule skipped the update
  if (policy == "stop")
    throw NonFiniteError(update_.non_finite() +
                         ". The run stops ([run] on_non_finite = \"stop\"); saved checkpoints "
                         "are as they were. Lower the learning rate or set optimizer.grad_clip, "
                         "or choose \"skip\" or \"rollback\"");
  // Rollback: weights, optimizer and plugin state from the last checkpoint;
  // the data goes on past the batches since (they would lead here again).
  if (rollback_step_ != step_) rollbacks_here_ = 0;
  rollback_step_ = step_;
  if (++rollbacks_here_ > 3)
    throw NonFiniteError(update_.non_finite() + " again after 3 rollbacks; the run stops");
  const int64_t position = data_.has_batches() ? data_.batcher().position() : 0;
  const int64_t bad_step = step_;
  if (!load_latest_checkpoint())
    throw NonFiniteError(update_.non_finite() +
                         "; on_non_finite = \"rollback\" but there is no checkpoint to roll back "
                         "to yet (set [save] every = N)");
  if (data_.has_batches()) data_.batcher().set_position(position);
  log(TF_LOG_WARN, "rolled back to the checkpoint of step " + std::to_string(step_) +
                       " after the non-finite step " + std::to_string(bad_step) +
                       "; training goes on with the batches after it");
  return true;
}

TrainSummary Session::train() {
  if (!data_.has_batches())
    throw std::logic_error("this session was built without data (skip_data); it cannot train");
  TrainSummary sum;
  sum.run_dir = env_.run_dir;
  sum.checkpoint_dir = env_.checkpoint_dir();
  sum.unigram_entropy = data_.unigram_entropy();
  sum.data = data_.description();
  sum.first_step = step_;
  sum.total_steps = env_.run_info.total_steps;
  // Rank 0 writes the metrics (its losses are the global batch's).
  const std::string metrics_path = (fs::path(env_.run_dir) / "metrics.jsonl").string();
  // A fresh run starts the file; a resumed one (or a second train()) continues
  // it after the rows of the steps it has done.
  if (env_.is_rank0()) metrics_ = MetricsWriter(metrics_path, /*resumed_at_step=*/step_);
  sum.metrics_path = metrics_path;
  auto& acct = MemoryAccounting::instance();
  acct.reset_peaks();
  if (env_.device.is_cuda()) cuda_reset_peak(env_.device.has_index() ? env_.device.index() : 0);

  const int64_t total = env_.run_info.total_steps;
  const int64_t log_every = env_.config.run.log_every;
  const int64_t save_every = env_.config.save.every;
  const int64_t eval_interval = env_.config.run.eval_interval;
  if (!env_.config.save.final && save_every == 0 && !env_.config.save.hf &&
      !env_.config.save.adapter)
    log(TF_LOG_WARN,
        "this run keeps nothing: [save] final = false, and no every, hf or adapter; what it "
        "trains is gone when it ends (set [save] final = true, every = N, hf = true or "
        "adapter = true to keep it)");
  const auto t0 = std::chrono::steady_clock::now();
  int64_t tokens = 0;
  // Steps whose update was skipped as non-finite (on_non_finite = "skip"):
  // when they are all the steps run, nothing was trained, and nothing is
  // saved as if it had been.
  int64_t skipped = 0;
  std::optional<OpTimer> op_timer;
  std::optional<OpCounter> op_counter;
  OpCounter::Counts last_step_ops;
  if (env_.config.run.profile_ops) {
    op_timer.emplace();
    op_counter.emplace();
  }
  // Ctrl-C or SIGTERM while steps run: the loop stops at the next step
  // boundary and saves, as an interrupted run does. Every rank stops at the
  // same one (a rank that stopped alone would leave the others in a
  // collective): with several, they agree each step on a 4-byte maximum.
  arm_stop_request();
  struct Disarm {
    ~Disarm() { disarm_stop_request(); }
  } disarm;
  // With several ranks, a Ctrl-C on any of them stops all at the same step
  // boundary: each step all-reduces every rank's flag (queued with the
  // step's work) and the step's one read of the device brings the result
  // back (pending_reads), so the ranks agree a step later without a wait of
  // their own. The reduced value is the same on every rank.
  // (Shared with the fill, which a step that throws leaves pending.)
  const auto a_rank_stops = std::make_shared<bool>(false);
  auto stop_here = [&] {
    if (!env_.pg) return stop_requested() != 0;
    if (*a_rank_stops && stop_requested() == 0) request_stop(SIGINT);  // another rank's: said alike
    return *a_rank_stops;
  };
  auto share_stop_flag = [&] {
    if (!env_.pg) return;
    at::Tensor flag = at::full({1}, stop_requested() != 0 ? 1.0f : 0.0f, at::kFloat);
    flag = flag.to(env_.device);
    env_.pg->all_reduce(flag, ReduceOp::Max);
    executor_.pending_reads().add(
        flag, [a_rank_stops](double any) { *a_rank_stops = any > 0; }, /*outlives=*/true);
  };
  bool interrupted = false;
  try {
    const int64_t stop_at =
        options_.stop_after_steps >= 0 ? std::min(total, step_ + options_.stop_after_steps) : total;
    for (; step_ < stop_at; ++step_) {
      if (stop_here()) {
        interrupted = true;
        break;
      }
      step_metrics_.clear();
      const auto step_t0 = std::chrono::steady_clock::now();
      const double op_s0 = op_timer ? op_timer->seconds() : 0;
      const OpCounter::Counts ops0 = op_counter ? op_counter->counts() : OpCounter::Counts{};
      const int64_t reads0 = host_reads();
      step_begin(step_);
      tf_step_result r{};
      r.struct_size = sizeof r;
      update_.clear_non_finite();
      PluginInstance& schedule = plugins_.schedule;
      // A pass's loss may wait for the update's read inside run_step; what
      // waits when it returns would be written into a call that ended.
      executor_.pending_reads().open();
      share_stop_flag();
      const tf_status stepped = call_hook(schedule, schedule.plugin->schedule(),
                                          TF_SCHEDULE_HOOK(run_step), step_, total, &r);
      const size_t unread = executor_.pending_reads().close();
      check_plugin_status(stepped, schedule, "run_step");
      if (unread > 0)
        throw PluginCallError("schedule \"" + schedule.plugin->name + "\" deferred the read of " +
                              std::to_string(unread) +
                              " pass(es) (tf_pass.defer_read) and made no update after them, so "
                              "their results were never read: a pass whose loss the schedule "
                              "needs without an update reads it at once (defer_read = 0)");
      StrategyChain(plugins_.strategies).each(TF_STRATEGY_HOOK(step_end), step_, r.loss);
      // The step's own ops and reads, before the loop's bookkeeping.
      const OpCounter::Counts step_ops =
          op_counter ? op_counter->counts() - ops0 : OpCounter::Counts{};
      const int64_t step_reads = host_reads() - reads0;
      if (op_counter) last_step_ops = step_ops;
      if (!update_.non_finite().empty()) {
        const int64_t bad_step = step_;
        if (handle_non_finite()) {
          sum.losses.push_back(r.loss);
          if (!metrics_.write({{"step", bad_step + 1},
                               {"loss", nullptr},
                               {"non_finite", 1},
                               {"rolled_back_to", step_}}))
            log(TF_LOG_WARN, metrics_.error());
          --step_;  // the loop's ++ lands on the checkpoint's step
          continue;
        }
        ++skipped;
      }
      tokens += r.n_tokens * env_.run_info.world_size;
      sum.backward_passes += r.backward_passes;
      sum.losses.push_back(r.loss);
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (std::isnan(sum.first_step_s)) sum.first_step_s = elapsed;
      const MemorySnapshot mem = env_.memory_snapshot();
      const std::optional<ProcessMemory> process = read_process_memory();
      if (process) {
        mapped_growth_ = std::max(mapped_growth_, process->rss_file - process_at_start_.rss_file);
        // The allocator checks the process budget as tensors are made; RSS
        // that grew otherwise (libraries' own heap) is caught here.
        if (auto refusal = MemoryAccounting::instance().process_refusal(*process, 0))
          throw OutOfBudgetError(*refusal);
      }
      nlohmann::json rec = step_record({step_ + 1, &r, elapsed, &mem, env_.device.is_cuda(),
                                        &step_metrics_, process ? &*process : nullptr});
      if (op_timer) {
        rec["op_s"] = op_timer->seconds() - op_s0;
        // ATen ops dispatched (those the step called; and with the ones they
        // ran inside), and the reads of device values a GPU would wait for:
        // the kernel's and every Tensor::item() (a plugin's too).
        rec["ops"] = step_ops.outermost;
        rec["ops_all"] = step_ops.all;
        rec["host_reads"] = step_reads + step_ops.of("aten::_local_scalar_dense");
        rec["step_s"] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - step_t0).count();
      }
      // Held-out loss every eval_interval steps (and after the last).
      if (eval_interval > 0 && ((step_ + 1) % eval_interval == 0 || step_ + 1 == stop_at)) {
        const double val = eval_loss(env_.config.run.eval_batches);
        rec["eval_loss"] = std::isfinite(val) ? nlohmann::json(val) : nlohmann::json(nullptr);
        if (std::isfinite(val) && !(val >= sum.best_val_loss)) sum.best_val_loss = val;
      }
      if (!metrics_.write(rec)) log(TF_LOG_WARN, metrics_.error());
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
        const std::string prefix = plugins_.schedule.plugin->name + ".";
        for (const auto& [key, value] : step_metrics_)
          if (key.rfind(prefix, 0) == 0)
            p.schedule_metrics.emplace_back(key.substr(prefix.size()), value);
        emit_progress(p);
      }
      if (save_every > 0 && done % save_every == 0 && done < stop_at &&
          skipped < done - sum.first_step)
        sum.saved.push_back(save_checkpoint(done));
    }
    sum.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sum.memory = env_.memory_snapshot();
    if (const std::optional<ProcessMemory> process = read_process_memory()) {
      sum.process = *process;
      // The counted bytes are the host's (a GPU's are apart, in device_peak).
      sum.process_memory = describe_process_memory(process_at_start_, *process,
                                                   sum.memory.total_peak, mapped_growth_);
    }
    if (op_timer && env_.is_rank0()) write_op_profile(*op_timer, sum.wall_s, last_step_ops);
    if (const int64_t run = step_ - sum.first_step; run > 0 && skipped == run)
      throw NonFiniteError(
          "every one of the " + std::to_string(run) +
          " steps run was non-finite and its update skipped ([run] on_non_finite = \"skip\"): "
          "nothing was trained, so nothing was saved (the checkpoints saved before are as they "
          "were). Lower the learning rate or set optimizer.grad_clip, and check the data and the "
          "base weights for NaN");
    // An interrupted run always saves, so that --resume can continue it.
    disarm_stop_request();  // the save, once begun, is finished
    if ((env_.config.save.final || step_ < total) && step_ > sum.first_step)
      sum.saved.push_back(save_checkpoint(step_));
    if (interrupted) {
      // Stopped by a signal: what --resume needs is saved; the exports, the
      // held-out loss and the sample are the end of a run, which this is not.
      sum.steps_run = step_ - sum.first_step;
      sum.final_loss = sum.losses.empty() ? std::nan("") : sum.losses.back();
      sum.val_loss = std::nan("");
      sum.tokens_per_s = sum.wall_s > 0 ? static_cast<double>(tokens) / sum.wall_s : 0;
      return sum;
    }
    if (env_.config.save.hf)
      sum.saved.push_back(export_hf((fs::path(env_.run_dir) / "hf").string()));
    if (env_.is_rank0() && env_.config.save.adapter)
      sum.saved.push_back(export_adapter((fs::path(env_.run_dir) / "adapter").string()));
    // Rotation may have removed checkpoints saved earlier in this run.
    std::vector<std::string> kept;
    for (const std::string& f : sum.saved) {
      std::error_code ec;
      if (fs::exists(f, ec) && std::find(kept.begin(), kept.end(), f) == kept.end())
        kept.push_back(f);
    }
    sum.saved = std::move(kept);
    sum.steps_run = step_ - sum.first_step;
    sum.tokens_per_s = sum.wall_s > 0 ? static_cast<double>(tokens) / sum.wall_s : 0;
    sum.final_loss = sum.losses.empty() ? std::nan("") : sum.losses.back();
    sum.val_loss = eval_loss(env_.config.run.eval_batches);
    if (std::isfinite(sum.val_loss) && !(sum.val_loss >= sum.best_val_loss))
      sum.best_val_loss = sum.val_loss;
    if (const int64_t n = env_.config.run.sample_tokens; n > 0) {
      try {
        sum.sample = generate(env_.config.run.sample_prompt, n, env_.config.run.sample_top_k, 0.8,
                              env_.run_info.seed);
      } catch (const std::exception& e) {
        // The sample never crops its context (as `generate`): a sample past
        // the model's positions is the recipe's request, refused by name.
        const std::string why = dynamic_cast<const c10::Error*>(&e)
                                    ? static_cast<const c10::Error&>(e).what_without_backtrace()
                                    : e.what();
        throw RecipeError(
            recipe_.source() + ": [run] sample_tokens = " + std::to_string(n) +
            ": the sample after training failed (" + why +
            "). Training finished and what [save] asked for is saved; lower run.sample_tokens so "
            "that the prompt and the sample fit the model's positions, and sample with "
            "`tightfit generate`");
      }
    }
  } catch (const c10::Error& e) {
    if (auto refusal = budget_refusal(e)) throw OutOfBudgetError(*refusal);
    if (auto op = nondeterministic_op(e))
      throw RecipeError(recipe_.source() + ": [run] deterministic = true (the default on CUDA): " +
                        *op + ". Set [run] deterministic = false to train with the faster, " +
                        "non-repeatable kernels (a resumed run then differs in the last bits)");
    throw;
  }
  return sum;
}

}  // namespace tightfit
