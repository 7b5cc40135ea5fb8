// A training session: one recipe composed into a model, its strategies and a
// schedule, with the kernel's store, executor, optimizer, data, accounting,
// metrics and checkpoints. The host's `run` and the tests drive it.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "data.hpp"
#include "distributed.hpp"
#include "generation.hpp"
#include "kernel_keys.hpp"
#include "memory_accounting.hpp"
#include "metrics.hpp"
#include "optimizer.hpp"
#include "param_store.hpp"
#include "plugin_loader.hpp"
#include "recipe.hpp"
#include "tightfit/plugin_api.h"

namespace tightfit {
class Session;
class OpTimer;
}  // namespace tightfit

// The per-plugin-instance context behind the ABI's opaque tf_host_context.
struct tf_host_context {
  tightfit::Session* session = nullptr;
  // The thread that made the context (the session's); host services refuse
  // a plugin's own threads (host_api_services.hpp), and warn about it once.
  std::thread::id owner_thread = std::this_thread::get_id();
  std::atomic<bool> warned_foreign_thread{false};
  std::string plugin_name;
  std::string role;  // "model", "strategy #1", "schedule"
  tightfit::ConfigTable config;
  std::string last_error;    // the host's last failed service call
  std::string plugin_error;  // what the plugin reported with set_error
  // A budget refusal a host service reported to this plugin and not yet
  // checked: the run stops out of budget whatever status the plugin returns.
  std::string budget_refusal;
  // Checkpoint state I/O, set only inside save_state / load_state.
  std::map<std::string, at::Tensor>* state_out = nullptr;
  const std::map<std::string, at::Tensor>* state_in = nullptr;
  std::string state_prefix;
  // The last tensor file this plugin read with tensors_load.
  std::string loaded_path;
  std::map<std::string, at::Tensor> loaded_tensors;
};

namespace tightfit {

// A non-finite loss or gradient the recipe says to stop on (or one a
// rollback could not get past).
struct NonFiniteError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A plugin reported an error.
struct PluginCallError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct StageState {
  std::string name;
  tf_stage_kind kind = TF_STAGE_BLOCK;
  bool recompute = false;
  bool skip = false;
  bool trainable = true;
  std::string device;
  int64_t activation_bytes_per_token = 0;
  int64_t flops_per_token = 0;
  int64_t frozen_activation_bytes_per_token = 0;  // 0 = unknown
  int64_t output_bytes_per_token = 0;             // 0 = unknown
  int64_t backward_bytes_per_token = 0;           // 0 = unknown
  int64_t frozen_backward_bytes_per_token = 0;    // 0 = unknown
};

struct PluginInstance {
  const LoadedPlugin* plugin = nullptr;
  void* state = nullptr;
  std::unique_ptr<tf_host_context> ctx;
};

struct PassResult {
  double loss = 0;
  int64_t n_tokens = 0;
  bool finite = true;
};

struct ProgressInfo {
  int64_t step = 0, total = 0;
  double loss = 0, lr = 0, tokens_per_s = 0, eta_s = 0, elapsed_s = 0;
  std::string phase;
  MemorySnapshot memory;
};

struct TrainSummary {
  int64_t first_step = 0, steps_run = 0, total_steps = 0;
  double final_loss = 0, val_loss = 0, unigram_entropy = 0, tokens_per_s = 0, wall_s = 0;
  double best_val_loss = std::numeric_limits<double>::quiet_NaN();  // over eval_interval evals
  int64_t backward_passes = 0;
  std::vector<double> losses;
  MemorySnapshot memory;  // peaks over the run
  std::string run_dir, metrics_path, checkpoint_dir, sample;
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

// Returns for TF_OK and TF_NOT_HANDLED; any other status (unknown ones too)
// throws PluginCallError naming the plugin's role, its name and `what`, with
// the message it set (OutOfBudgetError for a budget refusal).
void check_plugin_status(tf_status status, const PluginInstance& inst, const char* what);

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

  // --- executor (executor.cpp) ---
  // `positions` (int64 [B, T], optional): packed rows' per-token positions,
  // handed to every stage of the pass (the model must declare
  // TF_MODEL_FEATURE_POSITIONS).
  at::Tensor forward_logits(const at::Tensor& tokens, bool training,
                            const at::Tensor& positions = {});
  PassResult run_pass(const at::Tensor& tokens, const at::Tensor& targets, bool backward,
                      double loss_scale, const at::Tensor& positions = {});
  at::Tensor run_stage(int32_t stage, const at::Tensor& input, bool training, bool recompute);
  void raise_stage_event(int32_t stage, tf_pass_phase phase, bool begin);
  // Activation offload of a recomputed stage's input: the index of the
  // strategy that packed it (-1: none, keep it) and its key; and the way back.
  int32_t pack_activation(int32_t stage, const at::Tensor& x, uint64_t* key);
  at::Tensor unpack_activation(int32_t strategy, int32_t stage, uint64_t key);
  at::Tensor fetch_weight(const std::string& name);
  at::Tensor fetch_resident(Param& p);
  // Runs fn with p in the device tier: a parameter a strategy keeps in
  // another tier is brought in around fn (TF_PHASE_ACCESS) unless its stage
  // is in use already.
  void with_resident(Param& p, const std::function<void()>& fn);
  bool stage_in_use(int32_t stage) const;  // fetch_weight once the weight is in the device tier
  at::Tensor linear(const at::Tensor& x, const std::string& weight, const std::string& bias);

  // --- training services ---
  void zero_grad();
  // Optimizer-in-backward: updates one parameter now, as the coming optimizer
  // step will count it.
  void optimizer_apply(const std::string& name, const at::Tensor& grad, double grad_scale);
  // Hands the finished gradients of `stage` (-1: all the rest) to strategies'
  // grad_ready hooks during backward.
  void dispatch_grads(int32_t stage);
  tf_status optimizer_step();  // TF_ERR_NON_FINITE when gradients are not finite
  // The 1-based number of the optimizer step an update made now counts as:
  // the one being taken inside optimizer_step, the coming one in backward.
  int64_t update_step() const;
  // Gradient accumulation: the coming backward passes are micro-batch `index`
  // of `count` (reset to 0 of 1 by optimizer_step).
  void set_micro_batch(int32_t index, int32_t count);
  int32_t micro_batch_index() const { return micro_index_; }
  int32_t micro_batch_count() const { return micro_count_; }
  double eval_loss(int64_t batches);
  // profile.json in the run folder ([run] profile_ops).
  void write_op_profile(const OpTimer& timer, double wall_s) const;
  // Samples n_tokens after the prompt: greedy when top_k == 1 or temperature == 0,
  // else temperature, top-k and nucleus (top_p < 1) sampling. Uses the model's
  // incremental decode when it has one and use_cache, else recomputes the
  // last seq_len tokens for every new one.
  // Stops early, leaving it out, at any of `stop_ids` (end-of-sequence tokens).
  std::string generate(const std::string& prompt, int64_t n_tokens, int64_t top_k,
                       double temperature, uint64_t seed, double top_p = 1.0, bool use_cache = true,
                       const std::vector<int64_t>& stop_ids = {});
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
  int32_t snapshot_take(bool with_optimizer);
  void snapshot_restore(int32_t id);
  void snapshot_drop(int32_t id);
  void perturb_params(uint64_t seed, double scale);

  // --- checkpoints (checkpoint_io.cpp) ---
  // The random generators a checkpoint saves, by key: the CPU's, and the
  // run's CUDA device's.
  std::vector<std::pair<std::string, at::Device>> rng_devices() const;
  // Saves the full training state after `step` completed steps, atomically.
  std::string save_checkpoint(int64_t step);
  // Loads the latest complete checkpoint in the run's checkpoint folder;
  // returns false when there is none.
  bool load_latest_checkpoint();

  // --- plugin calls ---
  // Throws PluginCallError (or OutOfBudgetError) for a failed status.
  void check(tf_status status, const PluginInstance& inst, const char* what);
  void log(tf_log_level level, const std::string& message);

  // --- state (kernel-internal; host_api.cpp and tests use it) ---
  const Recipe& recipe() const { return recipe_; }
  ParamStore& store() { return store_; }
  Optimizer& optimizer() { return *optimizer_; }
  const ConfigTable& optimizer_config() const { return opt_cfg_; }
  Batcher& batcher() { return *batcher_; }
  // This rank's rows of the next global batch (batch_size each; world_size
  // times that in all, the same rows a single process with the whole batch sees).
  Batcher::Batch next_batch();
  // The process group of a multi-process run; nullptr in a single process.
  ProcessGroup* process_group() { return pg_.get(); }
  bool is_rank0() const { return run_info_.rank == 0; }
  Tokenizer& tokenizer() { return *tokenizer_; }
  std::vector<StageState>& stages() { return stages_; }
  PluginInstance& model() { return model_; }
  std::vector<PluginInstance>& strategies() { return strategies_; }
  PluginInstance& schedule() { return schedule_; }
  const tf_host_api* host_api() const;
  const tf_run_info& run_info() const { return run_info_; }
  int64_t step() const { return step_; }
  const at::Device& device() const { return device_; }
  bool declaring() const { return declaring_; }
  std::map<std::string, double>& step_metrics() { return step_metrics_; }
  const std::string& run_dir() const { return run_dir_; }
  std::string checkpoint_dir() const;
  // Counted CPU bytes by category, plus the CUDA allocator's totals on a CUDA run.
  MemorySnapshot memory_snapshot() const;
  // The planned parameter table `plan` fills and strategies' estimates edit
  // (memory_plan.cpp); `planning` while the estimates are asked.
  std::map<std::string, tf_param_plan>& param_plan() { return param_plan_; }
  bool planning() const { return planning_; }
  void set_planning(bool on) { planning_ = on; }

 private:
  void build(const PluginRegistry& registry);
  // build()'s steps, in order (session_build.cpp).
  void read_kernel_tables();
  std::optional<DistEnv> set_up_device_and_ranks();
  void set_up_data(const std::string& base_dir, int64_t world_size);
  void set_up_run_folder(const std::optional<DistEnv>& dist);
  void create_model(const PluginRegistry& base_registry, const std::string& base_dir);
  void create_strategies();
  void check_strategy_setup(size_t i, tf_status st, const char* what);
  void create_optimizer_and_schedule();
  void materialize_params(const std::string& base_dir);
  // Finds (and loads) the plugin `name` of `kind`, its pin checked first,
  // and validates its table; errors are RecipeErrors at `where_plugin`.
  PluginInstance make_instance(const std::string& name, tf_plugin_kind kind,
                               const toml::table* table, const std::string& role,
                               const std::string& where_plugin);
  void emit_progress(const ProgressInfo& p);
  // fp16 loss scaling: the product of the strategies' factors, and the
  // finiteness of each step's unscaled gradients reported back to them.
  double strategies_loss_scale();
  void report_loss_scale(bool finite);
  // One parameter's update: a strategy's optimizer_step_param or the kernel's.
  void update_param(Param& p, const at::Tensor& grad, int64_t step);

  Recipe recipe_;
  SessionOptions options_;
  PluginRegistry registry_;  // owns the plugin records the instances point to
  ConfigTable run_cfg_, data_cfg_, opt_cfg_, save_cfg_;
  std::string run_dir_;
  at::Device device_{at::kCPU};
  tf_run_info run_info_{};
  std::string device_str_, run_dir_str_;

  ParamStore store_;
  std::vector<StageState> stages_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Batcher> batcher_;
  std::string data_description_;  // examples and what became of them; "" for a text corpus
  double unigram_entropy_ = 0;
  std::unique_ptr<ProcessGroup> pg_;

  PluginInstance model_;
  std::vector<PluginInstance> strategies_;
  PluginInstance schedule_;
  bool declaring_ = false;

  int64_t step_ = 0;
  std::map<std::string, double> step_metrics_;
  // Numeric faults ([run] on_non_finite): what the last non-finite update
  // found (empty: none this step), the debug injections not yet fired, and
  // rollbacks made at the current step without getting past it.
  std::string non_finite_;
  std::set<int64_t> nan_steps_pending_;
  int64_t rollbacks_here_ = 0, rollback_step_ = -1;
  // After a schedule's step: skip (the update already was), roll back to the
  // last checkpoint, or stop, as the recipe says. True when it rolled back.
  bool handle_non_finite();
  // save_checkpoint's work; save_checkpoint reports its failures.
  std::string write_checkpoint(int64_t step);
  std::map<std::string, tf_param_plan> param_plan_;
  bool planning_ = false;
  std::map<int32_t, std::map<std::string, at::Tensor>> snapshots_;
  int32_t next_snapshot_ = 1;
  MetricsWriter metrics_;
  int32_t micro_index_ = 0, micro_count_ = 1;
  bool in_optimizer_step_ = false;
  double applied_loss_scale_ = 1.0;           // the loss scale of this step's backward passes
  std::vector<int> active_events_;            // per stage: stage events begun and not yet ended
  std::vector<bool> grads_dispatched_;        // per backward: grad_ready already called
  std::optional<at::Device> compute_device_;  // the running stage's, while one runs
  at::Tensor pass_positions_;    // packed rows' positions while a pass runs (backward included)
  at::Tensor recompute_anchor_;  // requires grad so checkpointed stages always get a backward
};

}  // namespace tightfit
