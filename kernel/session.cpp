#include "session.hpp"

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
#include "strategy_chain.hpp"
#include "tensor_handle.hpp"

namespace tightfit {
namespace fs = std::filesystem;

Session::Session(const Recipe& recipe, const PluginRegistry& registry, SessionOptions options)
    : recipe_(recipe), options_(std::move(options)) {
  try {
    build(registry);
  } catch (const c10::Error& e) {
    if (auto refusal = budget_refusal(e)) throw OutOfBudgetError(*refusal);
    throw;
  }
}

Session::~Session() {
  auto destroy = [](PluginInstance& inst, auto destroy_fn) {
    if (inst.plugin && inst.state && destroy_fn) destroy_fn(inst.state);
    inst.state = nullptr;
  };
  destroy(schedule_, schedule_.plugin ? schedule_.plugin->schedule()->destroy : nullptr);
  for (auto& s : strategies_) destroy(s, s.plugin->strategy()->destroy);
  destroy(model_, model_.plugin ? model_.plugin->model()->destroy : nullptr);
}

void Session::log(tf_log_level level, const std::string& message) {
  if (options_.on_log) options_.on_log(message);
  log_message(level, message);
}

void Session::check(tf_status status, const PluginInstance& inst, const char* what) {
  check_plugin_status(status, inst, what);
}

void check_plugin_status(tf_status status, const PluginInstance& inst, const char* what) {
  if (status == TF_OK || status == TF_NOT_HANDLED) return;
  std::string msg = inst.ctx->plugin_error;
  if (msg.empty()) msg = inst.ctx->last_error;
  if (msg.empty()) msg = "status " + std::to_string(static_cast<int>(status));
  inst.ctx->plugin_error.clear();
  inst.ctx->last_error.clear();
  // A budget refusal a host service reported may come back from the plugin
  // as a generic error: the service recorded it.
  const std::string refusal = std::exchange(inst.ctx->budget_refusal, std::string());
  if (!refusal.empty()) throw OutOfBudgetError(refusal);
  if (status == TF_ERR_OUT_OF_MEMORY) throw OutOfBudgetError(msg);
  throw PluginCallError(inst.ctx->role + " plugin \"" + inst.plugin->name + "\" failed in " + what +
                        ": " + msg);
}

std::string Session::checkpoint_dir() const {
  const std::string d = save_cfg_.get_string("dir");
  return d.empty() ? (fs::path(run_dir_) / "checkpoints").string() : d;
}

PluginInstance Session::make_instance(const std::string& name, tf_plugin_kind kind,
                                      const toml::table* table, const std::string& role,
                                      const std::string& where_plugin) {
  // "sha256" in any plugin table pins the plugin's file: checked on the
  // bytes that are loaded, before any of their code runs in this process.
  std::string pinned;
  const toml::node* pin = table ? table->get("sha256") : nullptr;
  if (pin) {
    const std::optional<std::string> want = pin->value<std::string>();
    if (!want || want->size() != 64 ||
        want->find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
      throw RecipeError(recipe_.where(*pin) +
                        ": sha256 must be the 64 hex digits of the plugin file's SHA-256 "
                        "(`tightfit plugins check FILE` prints it)");
    pinned = *want;
    for (char& c : pinned) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  const LoadedPlugin* found = nullptr;
  try {
    found = &registry_.find(name, kind, pinned);
  } catch (const PluginPinMismatch& e) {
    const PluginInfo* info = registry_.find_any(name);
    throw RecipeError(recipe_.where(*pin) + ": plugin \"" + name + "\" at " +
                      (info ? info->path : std::string("?")) + " has SHA-256 " + e.actual +
                      ", not the pinned " + pinned +
                      ". The file changed since it was pinned: if you trust the new build, "
                      "pin its hash; otherwise restore the pinned file. It was not loaded");
  } catch (const PluginLoadError& e) {
    throw RecipeError(where_plugin + ": " + e.what());
  }
  const LoadedPlugin& plugin = *found;
  PluginInstance inst;
  inst.plugin = &plugin;
  inst.ctx = std::make_unique<tf_host_context>();
  inst.ctx->session = this;
  inst.ctx->plugin_name = plugin.name;
  inst.ctx->role = role;
  // "weights" in [model] is the kernel's: Hugging Face weights to start from.
  inst.ctx->config =
      recipe_.validate(table, "[" + role + "] (plugin " + plugin.name + ")", plugin.keys,
                       role == "model" ? std::vector<std::string>{"plugin", "weights", "sha256"}
                                       : std::vector<std::string>{"plugin", "sha256"});
  return inst;
}

void Session::build(const PluginRegistry& base_registry) {
  recipe_.check_top_level(kernel_top_level_tables());
  run_cfg_ = recipe_.validate(recipe_.table("run"), "[run]", run_keys());
  for (int64_t at : run_cfg_.get_int_list("debug_nan_at_steps")) nan_steps_pending_.insert(at);
  data_cfg_ = recipe_.validate(recipe_.table("data"), "[data]", data_keys());
  opt_cfg_ = recipe_.validate(recipe_.table("optimizer"), "[optimizer]", optimizer_keys());
  save_cfg_ = recipe_.validate(recipe_.table("save"), "[save]", save_keys());

  if (const int64_t threads = run_cfg_.get_int("threads"); threads > 0)
    at::set_num_threads(static_cast<int>(threads));
  // A dry run allocates nothing: its budget must not refuse what the
  // process does next (fit measures this machine after planning).
  MemoryAccounting::instance().set_budget(options_.dry_run ? 0
                                                           : run_cfg_.get_size("memory_budget"));

  device_str_ = run_cfg_.get_string("device");
  try {
    device_ = parse_training_device(device_str_);
  } catch (const std::invalid_argument& e) {
    throw RecipeError(recipe_.source() + ": [run].device: " + e.what());
  }
  // A dry run plans a GPU recipe on a machine without one (nothing is
  // allocated); a real run needs the device.
  if (device_.is_cuda() && !at::hasCUDA() && !options_.dry_run)
    throw RecipeError(recipe_.source() + ": [run].device is \"" + device_str_ +
                      "\" but no CUDA device is available here; use device = \"cpu\"");
  if (device_.is_cuda() && device_.has_index() && !options_.dry_run &&
      !cuda_device_usable(device_.index()))
    throw RecipeError(recipe_.source() + ": [run].device is \"" + device_str_ +
                      "\" but this machine has " + std::to_string(cuda_device_count()) +
                      " CUDA devices (cuda:0 ...); name one of them");
  // More than one process: join the group before anything is allocated, so
  // that a rank that cannot start stops the others at once.
  std::optional<DistEnv> dist;
  try {
    dist = dist_env_from_environment();
  } catch (const std::invalid_argument& e) {
    throw RecipeError(std::string("distributed launch: ") + e.what());
  }
  if (dist && device_.is_cuda() && !device_.has_index())
    device_ = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(dist->local_rank));
  if (dist && device_.is_cuda()) device_str_ = device_.str();
  if (dist && !options_.dry_run) {
    const auto timeout = std::chrono::milliseconds(
        static_cast<int64_t>(run_cfg_.get_double("dist_timeout") * 1000.0));
    pg_ = std::make_unique<ProcessGroup>(*dist, device_, timeout);
    log(TF_LOG_DEBUG, "rank " + std::to_string(dist->rank) + " of " +
                          std::to_string(dist->world_size) + " joined (" + pg_->backend() + ")");
  }
  if (device_.is_cuda() && !options_.dry_run) {
    // The budget is the device's: the caching allocator's memory fraction.
    const int idx = device_.has_index() ? device_.index() : 0;
    cuda_set_budget(idx, run_cfg_.get_size("memory_budget"));
    MemoryAccounting::instance().set_budget(0);
  }

  // Data.
  const std::string base_dir = fs::path(recipe_.source()).parent_path().string();
  try {
    DataRequest req;
    req.corpus = data_cfg_.get_string("corpus");
    req.tokenizer = data_cfg_.get_string("tokenizer");
    req.base_dir = base_dir;
    if (const toml::table* mt = recipe_.table("model"); mt && mt->contains("weights"))
      req.weights = (*mt)["weights"].value_or(std::string{});
    req.chat_template = data_cfg_.get_string("chat_template");
    req.train_on = data_cfg_.get_string("train_on");
    req.packing = data_cfg_.get_bool("packing");
    req.seq_len = data_cfg_.get_int("seq_len");
    req.batch_size = data_cfg_.get_int("batch_size");
    req.world_size = dist ? dist->world_size : 1;
    req.val_fraction = data_cfg_.get_double("val_fraction");
    req.seed = static_cast<uint64_t>(run_cfg_.get_int("seed"));
    req.memory_budget = run_cfg_.get_size("memory_budget");
    req.budget_counts_host = !device_.is_cuda();
    req.read_data = !options_.skip_data && !options_.dry_run;
    DataSetup data = setup_data(req);
    tokenizer_ = std::move(data.tokenizer);
    batcher_ = std::move(data.batcher);
    unigram_entropy_ = data.unigram_entropy;
    data_description_ = data.description;
    if (!data_description_.empty()) log(TF_LOG_INFO, "data: " + data_description_);
  } catch (const std::invalid_argument& e) {
    throw RecipeError(recipe_.source() + ": [data]: " + e.what());
  } catch (const OutOfBudgetError&) {
    throw;
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const c10::Error*>(&e)) throw;
    throw RecipeError(recipe_.source() + ": [data]: " + e.what());
  }

  // Run folder. A fresh run never writes over another run's checkpoints, and
  // its name never leads out of out_dir (nor a relative [save] dir upwards).
  auto stays_inside = [](const fs::path& p) {
    if (p.empty() || p.is_absolute()) return false;
    for (const auto& part : p)
      if (part == "..") return false;
    return true;
  };
  if (!stays_inside(run_cfg_.get_string("name")))
    throw RecipeError(recipe_.source() + ": [run].name = \"" + run_cfg_.get_string("name") +
                      "\" would leave out_dir (an absolute path, or ..): name the run, and set "
                      "out_dir for where its folder goes");
  if (const std::string d = save_cfg_.get_string("dir");
      !d.empty() && !fs::path(d).is_absolute() && !stays_inside(d))
    throw RecipeError(recipe_.source() + ": [save].dir = \"" + d +
                      "\" climbs out of the working folder (..): give an absolute path if that "
                      "is where checkpoints go");
  run_dir_ = (fs::path(run_cfg_.get_string("out_dir")) / run_cfg_.get_string("name")).string();
  if (!options_.resume && save_cfg_.get_string("dir").empty()) {
    const std::string base = run_dir_;
    for (int i = 2; fs::exists(fs::path(run_dir_) / "checkpoints" / "manifest.json"); ++i)
      run_dir_ = base + "." + std::to_string(i);
  }
  if (!options_.skip_data && !options_.dry_run) fs::create_directories(run_dir_);
  run_dir_str_ = fs::absolute(run_dir_).string();

  run_info_ = tf_run_info{};
  run_info_.struct_size = sizeof run_info_;
  run_info_.device = device_str_.c_str();
  run_info_.rank = dist ? dist->rank : 0;
  run_info_.world_size = dist ? dist->world_size : 1;
  run_info_.dry_run = options_.dry_run ? 1 : 0;
  if (options_.dry_run && options_.plan_world_size > 0)
    run_info_.world_size = options_.plan_world_size;
  run_info_.local_rank = dist ? dist->local_rank : 0;
  run_info_.vocab_size = tokenizer_->vocab_size();
  run_info_.seq_len = data_cfg_.get_int("seq_len");
  run_info_.batch_size = data_cfg_.get_int("batch_size");
  run_info_.total_steps = run_cfg_.get_int("steps");
  run_info_.seed = static_cast<uint64_t>(run_cfg_.get_int("seed"));
  run_info_.run_dir = run_dir_str_.c_str();

  // Plugins: the recipe's own paths add to the installed ones (a name taken
  // twice is a conflict the registry reports when the name is used).
  registry_ = base_registry;
  PluginRegistry& registry = registry_;
  for (const auto& p : run_cfg_.get_string_list("plugin_paths")) {
    fs::path path = p;
    if (path.is_relative()) path = fs::path(base_dir) / path;
    registry.add_path(path.string(), "recipe");
  }
  for (const auto& prob : registry.problems()) log_message(TF_LOG_DEBUG, prob);

  const toml::table* model_table = recipe_.table("model");
  const std::string model_name = recipe_.required_string(model_table, "model", "plugin");
  model_ = make_instance(model_name, TF_PLUGIN_MODEL, model_table, "model",
                         recipe_.where(*model_table->get("plugin")));
  if (data_cfg_.get_bool("packing") &&
      !(model_.plugin->model_features & TF_MODEL_FEATURE_POSITIONS))
    throw RecipeError(recipe_.source() + ": [data] packing = true: model plugin \"" + model_name +
                      "\" does not read per-token positions (TF_MODEL_FEATURE_POSITIONS), so its "
                      "attention would cross from one example to the next in a packed row; set "
                      "packing = false");
  declaring_ = true;
  check(model_.plugin->model()->create(host_api(), model_.ctx.get(), &model_.state), model_,
        "create");
  if (stages_.empty())
    throw PluginCallError("model plugin \"" + model_name + "\" declared no stages");
  if (stages_.front().kind != TF_STAGE_EMBED || stages_.back().kind != TF_STAGE_HEAD)
    throw PluginCallError("model plugin \"" + model_name +
                          "\" must declare an embed stage first and a head stage last");

  int idx = 0;
  for (const toml::table* t : recipe_.array_tables("strategy")) {
    ++idx;
    const std::string name = recipe_.required_string(t, "strategy", "plugin");
    const std::string role = "strategy #" + std::to_string(idx);
    strategies_.push_back(
        make_instance(name, TF_PLUGIN_STRATEGY, t, "[strategy]", recipe_.where(*t->get("plugin"))));
    PluginInstance& s = strategies_.back();
    s.ctx->role = role;
    const tf_status st = s.plugin->strategy()->create(host_api(), s.ctx.get(), &s.state);
    // A strategy that refuses its keys is a recipe error at its table.
    if (st == TF_ERR_INVALID_ARGUMENT)
      throw RecipeError(recipe_.where(*t->get("plugin")) + ": " + s.ctx->plugin_error);
    check(st, s, "create");
  }
  // A strategy that cannot accept the recipe (no matching target, a bad
  // combination) is a recipe error at its [[strategy]] table.
  const auto strategy_tables = recipe_.array_tables("strategy");
  auto configure_step = [&](size_t i, tf_status st, const char* what) {
    if (st == TF_ERR_INVALID_ARGUMENT) {
      const std::string msg = strategies_[i].ctx->plugin_error;
      strategies_[i].ctx->plugin_error.clear();
      throw RecipeError(recipe_.where(*strategy_tables[i]->get("plugin")) + ": " + msg);
    }
    check(st, strategies_[i], what);
  };
  StrategyChain(strategies_)
      .each_with(&tf_strategy_vtable::configure, "configure",
                 [&](size_t i, tf_status st) { configure_step(i, st, "configure"); });
  declaring_ = false;

  // The optimizer (it holds no state yet) and the schedule too, so a dry
  // run (`plan`) can ask strategies and the schedule for their estimates.
  OptimizerConfig oc;
  oc.name = opt_cfg_.get_string("name");
  oc.lr = opt_cfg_.get_double("lr");
  oc.weight_decay = opt_cfg_.get_double("weight_decay");
  oc.beta1 = opt_cfg_.get_double("beta1");
  oc.beta2 = opt_cfg_.get_double("beta2");
  oc.eps = opt_cfg_.get_double("eps");
  oc.momentum = opt_cfg_.get_double("momentum");
  oc.grad_clip = opt_cfg_.get_double("grad_clip");
  optimizer_ = std::make_unique<Optimizer>(oc);
  const toml::table* sched_table = recipe_.table("schedule");
  const std::string sched_name = sched_table && sched_table->contains("plugin")
                                     ? recipe_.required_string(sched_table, "schedule", "plugin")
                                     : "standard";
  schedule_ = make_instance(sched_name, TF_PLUGIN_SCHEDULE, sched_table, "schedule",
                            sched_table && sched_table->get("plugin")
                                ? recipe_.where(*sched_table->get("plugin"))
                                : recipe_.source());
  check(schedule_.plugin->schedule()->create(host_api(), schedule_.ctx.get(), &schedule_.state),
        schedule_, "create");

  if (options_.dry_run) return;

  // Dropout and other ops draw from the global generators; seed them per run.
  at::manual_seed(run_info_.seed);
  // Stage by stage: initialize, load the stage's weights, let strategies
  // convert them (stage_params_ready); only then allocate the next stage.
  std::unique_ptr<HfWeightSource> weights;
  const toml::node* weights_key = model_table->get("weights");
  auto weights_error = [&](const std::exception& e) {
    if (dynamic_cast<const c10::Error*>(&e)) throw;
    throw RecipeError(recipe_.where(*weights_key) + ": " + e.what());
  };
  if (weights_key) {
    if (!weights_key->is_string())
      throw RecipeError(recipe_.where(*weights_key) + ": [model].weights must be a path string");
    fs::path path = weights_key->value_or(std::string{});
    if (path.is_relative() && !fs::exists(path)) path = fs::path(base_dir) / path;
    try {
      weights = std::make_unique<HfWeightSource>(path.string());
    } catch (const std::runtime_error& e) {
      weights_error(e);
    }
  }
  // A parameter lives on its stage's device (shard's layers mode places
  // stages); shared ones (tied embeddings) on the first stage's.
  // Parameters of skipped stages (sparse) are never allocated or loaded.
  auto place = [&](const Param& p) -> std::optional<at::Device> {
    const size_t stage = p.stage >= 0 ? static_cast<size_t>(p.stage) : 0;
    if (stage >= stages_.size()) return device_;
    if (p.stage >= 0 && stages_[stage].skip) return std::nullopt;
    return at::Device(stages_[stage].device);
  };
  store_.materialize(run_info_.seed, place, [&](size_t first, size_t last) {
    auto& params = store_.all();
    if (weights) {
      try {
        for (size_t k = first; k < last; ++k)
          if (!(params[k].flags & TF_PARAM_ADAPTER) && !params[k].absent)
            weights->load(params[k]);  // adapters load on their own
      } catch (const std::runtime_error& e) {
        weights_error(e);
      }
    }
    const int32_t stage = params[first].stage;
    if (params[first].absent) return;  // a skipped stage: nothing to convert
    StrategyChain(strategies_)
        .each_with(
            &tf_strategy_vtable::stage_params_ready, "stage_params_ready",
            [&](size_t i, tf_status st) { configure_step(i, st, "stage_params_ready"); }, stage);
  });
  StrategyChain(strategies_)
      .each_with(&tf_strategy_vtable::params_ready, "params_ready",
                 [&](size_t i, tf_status st) { configure_step(i, st, "params_ready"); });

  recompute_anchor_ = at::empty({0}, at::TensorOptions().device(device_)).requires_grad_(true);

  // Found now rather than after the training: [save] hf needs every weight.
  if (save_cfg_.get_bool("hf"))
    for (const Param& p : store_.all())
      if (p.absent)
        throw RecipeError(recipe_.source() + ": [save] hf = true, but " + p.name +
                          " belongs to a block the recipe skips (sparse middle = \"skip\"), so "
                          "there is no whole model to export; set hf = false (and adapter = true "
                          "for LoRA) or use middle = \"frozen\"");
  if (options_.resume && !load_latest_checkpoint() && !options_.skip_data)
    log(TF_LOG_WARN, "--resume: no checkpoint in " + checkpoint_dir() + "; starting from step 0");
  if (pg_) pg_->barrier();  // every rank composed the same run
}

Batcher::Batch Session::next_batch() {
  Batcher::Batch b = batcher_->next();
  if (run_info_.world_size > 1) {
    const int64_t rows = b.tokens.size(0) / run_info_.world_size;
    b.tokens = b.tokens.narrow(0, run_info_.rank * rows, rows).contiguous();
    b.targets = b.targets.narrow(0, run_info_.rank * rows, rows).contiguous();
    if (b.positions.defined())
      b.positions = b.positions.narrow(0, run_info_.rank * rows, rows).contiguous();
  }
  return b;
}

std::string Session::export_hf(const std::string& dir, bool merge, int64_t max_shard_bytes) {
  // Gathering parameters split across ranks takes every rank; rank 0 writes.
  const bool sharded = std::any_of(store_.all().begin(), store_.all().end(),
                                   [](const Param& p) { return p.residency == TF_TIER_SHARDED; });
  if (!is_rank0() && !sharded) return dir;
  const tf_model_vtable* vt = model_.plugin->model();
  const char* config = nullptr;
  if (vt->hf_config_json)
    check(vt->hf_config_json(model_.state, model_.ctx.get(), &config), model_, "hf_config_json");
  if (!config)
    log(TF_LOG_WARN, "model plugin \"" + model_.plugin->name +
                         "\" gives no config.json; exporting weights only");
  at::NoGradGuard no_grad;
  CategoryScope scope(TF_MEM_TRANSIENT);
  // One parameter at a time, in stage order: dense from any tier, merged by
  // the strategies that rewrite it (LoRA), into the current shard.
  std::optional<HfShardWriter> writer;
  if (is_rank0()) writer.emplace(dir, max_shard_bytes);
  for (const Param& p : store_.all()) {
    if (p.flags & TF_PARAM_ADAPTER) continue;
    if (p.absent)
      throw std::runtime_error(
          "parameter " + p.name +
          " belongs to a block this recipe skips (sparse middle = \"skip\"); it was never "
          "loaded, so there is no whole model to export. Export the adapters alone (--adapter), "
          "or train with middle = \"frozen\"");
    at::Tensor value = fetch_weight(p.name).detach();
    if (merge)
      StrategyChain(strategies_)
          .thread_tensor(&tf_strategy_vtable::export_weight, "export_weight", value,
                         p.name.c_str());
    if (writer) writer->add(p.name, hf_layout(p, value));
  }
  if (writer) {
    writer->finish();
    write_hf_side_files(dir, config ? config : "", tokenizer_->source_file());
  }
  return dir;
}

std::string Session::export_adapter(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create " + dir + ": " + ec.message());
  at::NoGradGuard no_grad;
  bool written = false;
  StrategyChain(strategies_)
      .each_with(
          &tf_strategy_vtable::export_adapter, "export_adapter",
          [&](size_t i, tf_status st) {
            written = written || st == TF_OK;
            check(st, strategies_[i], "export_adapter");
          },
          dir.c_str());
  if (!written)
    throw std::runtime_error(
        "no strategy of this recipe has adapters to export (add a [[strategy]] with plugin = "
        "\"lora\"), or export the whole model without --adapter");
  return dir;
}

MemorySnapshot Session::memory_snapshot() const {
  MemorySnapshot m = MemoryAccounting::instance().snapshot();
  CudaMemory c;
  if (device_.is_cuda() && cuda_memory(device_.has_index() ? device_.index() : 0, &c)) {
    m.device_current = c.allocated;
    m.device_peak = c.peak_allocated;
  }
  return m;
}

void Session::optimizer_apply(const std::string& name, const at::Tensor& grad, double grad_scale) {
  Param& p = store_.get(name);
  if (!p.trainable) throw std::invalid_argument("parameter \"" + name + "\" is frozen");
  at::Tensor g = grad;
  if (grad_scale != 1.0) {
    CategoryScope transient(TF_MEM_TRANSIENT);
    g = grad * grad_scale;
  }
  CategoryScope scope(TF_MEM_OPTIMIZER);
  update_param(p, g, optimizer_->steps() + 1);
}

int64_t Session::update_step() const {
  return in_optimizer_step_ ? optimizer_->steps() : optimizer_->steps() + 1;
}

void Session::update_param(Param& p, const at::Tensor& grad, int64_t step) {
  // Strategies that keep the state themselves (8-bit AdamW, offloaded state)
  // update where it lives; otherwise the kernel's optimizer does.
  if (StrategyChain(strategies_)
          .first_handled(&tf_strategy_vtable::optimizer_step_param, "optimizer_step_param",
                         p.name.c_str(), borrow_handle(p.value), borrow_handle(grad),
                         optimizer_->lr()) < 0)
    optimizer_->update(p, grad, step);
}

void Session::zero_grad() {
  for (Param& p : store_.all())
    if (p.value.defined() && p.value.grad().defined()) p.value.mutable_grad() = at::Tensor();
  StrategyChain(strategies_).each(&tf_strategy_vtable::drop_held_grads, "drop_held_grads");
}

void Session::set_micro_batch(int32_t index, int32_t count) {
  if (count < 1 || index < 0 || index >= count)
    throw std::invalid_argument("micro-batch " + std::to_string(index) + " of " +
                                std::to_string(count) + ": need 0 <= index < count");
  micro_index_ = index;
  micro_count_ = count;
}

double Session::strategies_loss_scale() {
  double scale = 1.0;
  StrategyChain(strategies_).each(&tf_strategy_vtable::loss_scale, "loss_scale", &scale);
  if (!(scale > 0) || !std::isfinite(scale))
    throw PluginCallError("strategies asked for a loss scale of " + std::to_string(scale) +
                          "; it must be finite and > 0");
  return scale;
}

void Session::report_loss_scale(bool finite) {
  StrategyChain(strategies_)
      .each(&tf_strategy_vtable::loss_scale_update, "loss_scale_update", int32_t{finite ? 1 : 0});
}

tf_status Session::optimizer_step() {
  micro_index_ = 0;
  micro_count_ = 1;
  std::vector<Param*> params = store_.trainable();
  if (applied_loss_scale_ != 1.0) {
    at::NoGradGuard no_grad;
    for (Param* p : params)
      if (p->value.grad().defined()) p->value.mutable_grad().div_(applied_loss_scale_);
  }
  const bool scaled = applied_loss_scale_ != 1.0;
  applied_loss_scale_ = 1.0;
  // Gradients strategies hold themselves (ZeRO's reduce-scattered parts)
  // count in the norm, are clipped by the same factor and updated after.
  double held_sq = 0;
  StrategyChain(strategies_).each(&tf_strategy_vtable::grad_norm_sq, "grad_norm_sq", &held_sq);
  const Optimizer::Clip clip = optimizer_->clip(params, held_sq);
  const double norm = clip.norm;
  step_metrics_["grad_norm"] = norm;
  if (!std::isfinite(norm)) {
    // Name the parameters whose gradients went bad before they are dropped.
    std::vector<std::string> bad;
    {
      at::NoGradGuard no_grad;
      for (Param* p : params)
        if (p->value.grad().defined() && !p->value.grad().isfinite().all().item<bool>())
          bad.push_back(p->name);
    }
    std::string where;
    for (size_t i = 0; i < std::min<size_t>(bad.size(), 3); ++i) where += (i ? ", " : "") + bad[i];
    if (bad.size() > 3) where += " and " + std::to_string(bad.size() - 3) + " more";
    non_finite_ = "step " + std::to_string(step_) + ": non-finite gradient" +
                  (bad.empty() ? std::string(" (held by a strategy)")
                               : " in " + std::to_string(bad.size()) + " of " +
                                     std::to_string(params.size()) + " parameters: " + where);
    log(TF_LOG_WARN, non_finite_);
    zero_grad();
    if (scaled) report_loss_scale(false);
    return TF_ERR_NON_FINITE;
  }
  if (scaled) report_loss_scale(true);
  CategoryScope scope(TF_MEM_OPTIMIZER);
  optimizer_->begin_step();
  in_optimizer_step_ = true;
  struct Done {
    bool& flag;
    ~Done() { flag = false; }
  } done{in_optimizer_step_};
  for (Param* p : params) {
    const at::Tensor& g = p->value.grad();
    if (g.defined()) update_param(*p, g, optimizer_->steps());
  }
  StrategyChain(strategies_)
      .each(&tf_strategy_vtable::apply_held_grads, "apply_held_grads", clip.scale);
  return TF_OK;
}

// profile.json in the run folder: seconds inside each outermost operator
// over the run, largest first, against the run's wall time.
void Session::write_op_profile(const OpTimer& timer, double wall_s) const {
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& [name, s] : timer.by_name()) ops.push_back({{"op", name}, {"seconds", s}});
  nlohmann::json j = {{"wall_s", wall_s}, {"inside_ops_s", timer.seconds()}, {"ops", ops}};
  write_file_synced((fs::path(run_dir_) / "profile.json").string(), j.dump(1));
}

double Session::eval_loss(int64_t batches) {
  if (batches <= 0) return std::nan("");
  at::NoGradGuard no_grad;
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    auto b = batcher_->validation(i);
    at::Tensor logits = forward_logits(b.tokens.to(device_), /*training=*/false, b.positions);
    sum += cross_entropy_mean(logits.reshape({-1, logits.size(-1)}).to(at::kFloat),
                              b.targets.to(logits.device()).reshape({-1}))
               .item<double>();
  }
  return sum / static_cast<double>(batches);
}

std::string Session::generate(const std::string& prompt, int64_t n_tokens, int64_t top_k,
                              double temperature, uint64_t seed, double top_p, bool use_cache,
                              const std::vector<int64_t>& stop_ids) {
  return generate_text(
      *this, prompt,
      SamplingOptions{n_tokens, top_k, temperature, top_p, seed, use_cache, stop_ids});
}

int32_t Session::snapshot_take(bool with_optimizer) {
  at::NoGradGuard no_grad;
  CategoryScope scope(TF_MEM_TRANSIENT);
  std::map<std::string, at::Tensor> snap;
  for (Param* p : store_.trainable())
    with_resident(*p, [&] { snap["param:" + p->name] = p->value.detach().clone(); });
  if (with_optimizer)
    for (auto& [k, t] : optimizer_->state()) snap["opt:" + k] = t.clone();
  const int32_t id = next_snapshot_++;
  snapshots_[id] = std::move(snap);
  return id;
}

void Session::snapshot_restore(int32_t id) {
  auto it = snapshots_.find(id);
  if (it == snapshots_.end()) throw std::out_of_range("no snapshot " + std::to_string(id));
  at::NoGradGuard no_grad;
  for (auto& [k, t] : it->second) {
    if (k.rfind("param:", 0) == 0) {
      Param& p = store_.get(k.substr(6));
      with_resident(p, [&] { p.value.copy_(t); });
    } else
      optimizer_->state()[k.substr(4)].copy_(t);
  }
}

void Session::snapshot_drop(int32_t id) {
  if (snapshots_.erase(id) == 0) throw std::out_of_range("no snapshot " + std::to_string(id));
}

void Session::perturb_params(uint64_t seed, double scale) {
  at::NoGradGuard no_grad;
  CategoryScope scope(TF_MEM_TRANSIENT);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (Param* p : store_.trainable()) {
    at::Tensor z = at::empty(p->value.sizes(), at::kFloat).normal_(0, 1, gen);
    with_resident(*p,
                  [&] { p->value.add_(z.to(p->value.device(), p->value.scalar_type()), scale); });
  }
}

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
