// A training session: one recipe composed into a model, its strategies and a
// schedule, and trained. The session owns the kernel's parts and drives the
// training loop; each part owns its own state:
//
//   RunEnvironment  the kernel's recipe tables, device, ranks, run folder
//   PluginSet       the plugin instances and the registry they come from
//   ParamStore      the parameters (param_store.hpp)
//   Executor        stages run in forward/backward with the strategies' hooks
//   UpdateStep      the optimizer, loss scaling, clipping, micro-batches
//   Snapshots       in-memory weight snapshots and perturbations
//   TrainingData    the tokenizer and this rank's batches
//
// Building (session_build.cpp), the loop (trainer_loop.cpp), checkpoints
// (checkpoint_io.cpp), export (session_export.cpp) and generation
// (generation.cpp) are the session's own work. The host's `run` and the
// tests drive it.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_threads.hpp"
#include "distributed.hpp"
#include "executor.hpp"
#include "hf_weights.hpp"
#include "host_api.hpp"
#include "kernel_parts.hpp"
#include "memory_accounting.hpp"
#include "metrics.hpp"
#include "op_counter.hpp"
#include "param_store.hpp"
#include "plugin_set.hpp"
#include "process_memory.hpp"
#include "recipe.hpp"
#include "run_environment.hpp"
#include "sampling_options.hpp"
#include "snapshots.hpp"
#include "tightfit/plugin_api.h"
#include "training_data.hpp"
#include "update_step.hpp"

namespace tightfit {
class OpTimer;
class Session;

// A non-finite loss or gradient the recipe says to stop on (or one a
// rollback could not get past).
struct NonFiniteError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ProgressInfo {
  int64_t step = 0, total = 0;
  double loss = 0, lr = 0, tokens_per_s = 0, eta_s = 0, elapsed_s = 0;
  std::string phase;
  MemorySnapshot memory;
  // What the schedule logged this step (log_metric), its name's prefix
  // taken off: dpo's "rewards/accuracies", mezo's "projected_grad".
  std::vector<std::pair<std::string, double>> schedule_metrics;
};

struct TrainSummary {
  int64_t first_step = 0, steps_run = 0, total_steps = 0;
  double final_loss = 0, val_loss = 0, unigram_entropy = 0, tokens_per_s = 0, wall_s = 0;
  double best_val_loss = std::numeric_limits<double>::quiet_NaN();  // over eval_interval evals
  // Seconds from train()'s start to the end of this invocation's first step
  // (NaN when none ran): with the set-up before it, the time to first step.
  double first_step_s = std::numeric_limits<double>::quiet_NaN();
  int64_t backward_passes = 0;
  std::vector<double> losses;
  MemorySnapshot memory;  // peaks over the run
  // The process's resident memory: its peak (VmHWM, set-up included) and
  // what it is made of beside the tracked tensors; "" where unknown.
  ProcessMemory process;
  std::string process_memory;
  std::string run_dir, metrics_path, checkpoint_dir, sample;
  // The folders this run wrote that are there at its end: its checkpoints
  // (those rotation kept), hf/ and adapter/.
  std::vector<std::string> saved;
  std::string data;  // instruction/chat examples and what became of them; "" for text
};

struct SessionOptions {
  bool resume = false;
  // Stop (and save) after this many steps of this session; < 0 = run to run.steps.
  // Simulates an interrupted run for resume tests and `tightfit run --stop-after`.
  int64_t stop_after_steps = -1;
  // Build the model without reading the corpus (generate, export); train() is refused.
  bool skip_data = false;
  // Validate the recipe and compose the plugins, but allocate no parameters
  // (`tightfit run --dry-run`); nothing else may be called.
  bool dry_run = false;
  // A model held beside a run (a reward model, score_texts): it joins no
  // ranks and leaves the process's memory budget, CPU threads and block
  // cache as the run set them; skip_data is implied.
  bool guest = false;
  // A dry run planned for this many ranks (`plan --ranks`, `fit --ranks`);
  // 0 = the launch environment's world size.
  int plan_world_size = 0;
  std::function<void(const ProgressInfo&)> on_progress;
  std::function<void(const std::string&)> on_log;  // kernel and plugin log lines
  // Called once the recipe is composed (plugins made, the model declared,
  // strategies configured, nothing materialized): what `tightfit plan` sees,
  // so a run plans on its own composition instead of building a second one.
  std::function<void(Session&)> on_composed;
};

class Session {
 public:
  Session(const Recipe& recipe, const PluginRegistry& registry, SessionOptions options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Runs the schedule from the current step to run.steps, saving checkpoints
  // as [save] says; then evaluates and samples. Throws OutOfBudgetError,
  // PluginCallError, std::runtime_error.
  TrainSummary train();
  // The strategies' step_begin hooks (train() calls it before each step;
  // tests that drive passes themselves call it too).
  void step_begin(int64_t step);
  // The mean loss over the first `batches` validation batches.
  double eval_loss(int64_t batches);

  // Samples n_tokens after the prompt: greedy when top_k == 1 or temperature == 0,
  // else temperature, top-k and nucleus (top_p < 1) sampling. Uses the model's
  // incremental decode when it has one and use_cache, else recomputes the
  // whole context for every new one.
  // Stops early, leaving it out, at any of `stop_ids` (end-of-sequence tokens).
  std::string generate(const std::string& prompt, int64_t n_tokens, int64_t top_k,
                       double temperature, uint64_t seed, double top_p = 1.0, bool use_cache = true,
                       const std::vector<int64_t>& stop_ids = {});
  std::string generate(const std::string& prompt, const SamplingOptions& options);
  // Writes the model as a Hugging Face folder (model.safetensors, config.json,
  // tokenizer.json when the run uses one); returns the folder.
  // merge = false leaves adapters out and writes the bases as they are (the
  // model a PEFT adapter from export_adapter applies to).
  // Weights go in shards of at most max_shard_bytes (5 GB, as transformers),
  // written as they fill: the peak is about a shard, not the model.
  std::string export_hf(const std::string& dir, bool merge = true,
                        int64_t max_shard_bytes = 5'000'000'000);
  // Writes the strategies' adapters on their own (LoRA: a PEFT adapter folder);
  // returns the folder. Throws when no strategy has adapters.
  std::string export_adapter(const std::string& dir);
  // Writes the merged model as one GGUF file for llama.cpp / ollama
  // (gguf_export): tensors of `type` ("f32", "f16", "bf16", "q8_0"), the
  // tokenizer keys of the GGUF file the run's model came from. Returns it.
  std::string export_gguf(const std::string& file, const std::string& type = "f16");
  // Writes the adapters as a llama.cpp LoRA adapter GGUF; returns the file.
  std::string export_adapter_gguf(const std::string& file, const std::string& type = "f32");

  // Hands every parameter of the whole model to `sink` (rank 0 only), one at
  // a time in stage order, dense, in Hugging Face's name and layout, merged
  // by the strategies that rewrite it (LoRA) when `merge`.
  void each_export_tensor(bool merge,
                          const std::function<void(const std::string&, const at::Tensor&)>& sink);
  // config.json as the model plugin writes it; "" when it gives none.
  std::string model_config_json();
  // Whether this rank takes part in an export (rank 0, or every rank when
  // parameters are split across ranks).
  bool exports_on_this_rank() const;

  // --- checkpoints (checkpoint_io.cpp) ---
  // The random generators a checkpoint saves, by key: the CPU's, and the
  // run's CUDA device's.
  std::vector<std::pair<std::string, at::Device>> rng_devices() const;
  // Saves the full training state after `step` completed steps, atomically.
  std::string save_checkpoint(int64_t step);
  // Loads the latest complete checkpoint in the run's checkpoint folder;
  // returns false when there is none.
  bool load_latest_checkpoint();

  // The sequence classifier in the folder `model` (score_texts), opened once
  // (KernelParts::open_scorer). Throws RecipeError.
  std::shared_ptr<TextScorer> open_scorer(const std::string& model);

  // Kernel and plugin log lines: the log, and the host's on_log.
  void log(tf_log_level level, const std::string& message);

  // --- the parts ---
  const Recipe& recipe() const { return recipe_; }
  const RunEnvironment& env() const { return env_; }
  // The CPU threads the run chose, and why ("2 threads on 2 CPUs (...)").
  std::string cpu_threads() const { return cpu_threads_ ? cpu_threads_->describe() : ""; }
  PluginSet& plugins() { return plugins_; }
  ParamStore& store() { return store_; }
  Executor& executor() { return executor_; }
  UpdateStep& update() { return update_; }
  Snapshots& snapshots() { return snapshots_; }
  TrainingData& data() { return data_; }
  ParamPlanTable& plan_table() { return plan_; }
  // The parts the services and the planner work on (plan_memory(parts())).
  const KernelParts& parts() const { return parts_; }
  const tf_host_api* host_api() const { return kernel_host_api(); }
  // The number of steps done (the step being run, 0-based, inside one).
  int64_t step() const { return step_; }
  // The record of the step being run (metrics.jsonl gets it).
  std::map<std::string, double>& step_metrics() { return step_metrics_; }

 private:
  void build(const PluginRegistry& registry);
  // build()'s steps, in order (session_build.cpp).
  void read_kernel_tables();
  std::optional<DistEnv> set_up_device_and_ranks();
  void set_up_data(const std::string& base_dir, int64_t world_size);
  void set_up_run_folder(const std::optional<DistEnv>& dist);
  void set_up_registry(const PluginRegistry& base_registry, const std::string& base_dir);
  std::string schedule_name() const;
  std::string schedule_preference_tokenization() const;
  uintptr_t schedule_features() const;
  std::string pinned_sha256(const toml::table* table) const;
  void create_model(const std::string& base_dir);
  void create_strategies();
  void check_strategy_setup(size_t i, tf_status st, const char* what);
  void create_optimizer_and_schedule();
  void create_rewards();  // session_rewards.cpp
  void materialize_params();
  // [model] weights, opened once when first asked for (session_weights.cpp);
  // nullptr when the recipe has none. Throws RecipeError naming the key.
  const HfWeightSource* weight_source();
  // Finds (and loads) the plugin `name` of `kind`, its pin checked first,
  // and validates its table; errors are RecipeErrors at `where_plugin`.
  PluginInstance make_instance(const std::string& name, tf_plugin_kind kind,
                               const toml::table* table, const std::string& role,
                               const std::string& where_plugin);
  void read_gguf_paths_as_folders(ConfigTable& config);
  void emit_progress(const ProgressInfo& p);
  // After a schedule's step: skip (the update already was), roll back to the
  // last checkpoint, or stop, as the recipe says. True when it rolled back.
  bool handle_non_finite();
  // save_checkpoint's work; save_checkpoint reports its failures.
  std::string write_checkpoint(int64_t step);
  // The first parameter or optimizer state holding a NaN or an infinity (on
  // any rank), named for a message; "" when all are finite.
  std::string non_finite_training_state();
  // profile.json in the run folder ([run] profile_ops).
  void write_op_profile(const OpTimer& timer, double wall_s,
                        const OpCounter::Counts& last_step) const;

  Recipe recipe_;
  SessionOptions options_;
  RunEnvironment env_;
  PluginSet plugins_;
  ParamStore store_;
  int64_t step_ = 0;
  std::map<std::string, double> step_metrics_;
  Executor executor_{plugins_, store_, env_, step_};
  UpdateStep update_{plugins_,      store_,
                     executor_,     step_,
                     step_metrics_, [this](tf_log_level l, const std::string& m) { log(l, m); }};
  Snapshots snapshots_{store_, executor_, update_};
  TrainingData data_{env_};
  ParamPlanTable plan_;
  KernelParts parts_;             // what every plugin instance's context points to
  std::string weights_base_dir_;  // where a relative [model] weights is looked for
  std::unique_ptr<HfWeightSource> weight_source_;
  std::map<std::string, std::shared_ptr<TextScorer>> scorers_;  // by canonical folder
  std::mutex scorers_mutex_;  // reward calls run on their own threads

  std::optional<CpuThreads> cpu_threads_;  // made as the recipe's [run] is read
  MetricsWriter metrics_;
  // The RSS before the session was built (the libraries and runtime), and
  // the most that memory-mapped file pages grew by over the steps.
  ProcessMemory process_at_start_;
  int64_t mapped_growth_ = 0;
  bool eval_unreported_logged_ = false;  // eval_loss warned that pairs have no loss here
  // Rollbacks ([run] on_non_finite) made at the current step without getting past it.
  int64_t rollbacks_here_ = 0, rollback_step_ = -1;
};

}  // namespace tightfit
