// Building a session: the plugins of a recipe made into instances, the
// model declared, strategies configured, parameters created stage by stage,
// the data and the schedule set up.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <optional>

#include "cpu_block_cache.hpp"
#include "cuda_memory.hpp"
#include "data_setup.hpp"
#include "device_spec.hpp"
#include "gguf_folder.hpp"
#include "gguf_model.hpp"
#include "hf_weights.hpp"
#include "kernel_config.hpp"
#include "kernel_keys.hpp"
#include "logging.hpp"
#include "memory_budget.hpp"
#include "plugin_hooks.hpp"
#include "process_memory.hpp"
#include "session.hpp"
#include "strategy_chain.hpp"

namespace tightfit {
namespace fs = std::filesystem;

namespace {

// A head's declared projection names a [V, C] parameter (and a [V] bias) of
// the model's own: the loss will compute with them in place of the head's
// output.
void check_head_projection(const StageState& head, ParamStore& store,
                           const std::string& model_name) {
  if (head.projection_weight.empty()) return;
  auto refuse = [&](const std::string& why) {
    throw PluginCallError("model plugin \"" + model_name + "\" declares head projection \"" +
                          head.projection_weight + "\", which " + why);
  };
  const Param* w = store.find(head.projection_weight);
  if (w == nullptr) refuse("is not one of its parameters");
  if (w->shape.size() != 2) refuse("is not a matrix [vocabulary, width]");
  if (head.projection_bias.empty()) return;
  const Param* b = store.find(head.projection_bias);
  if (b == nullptr || b->shape.size() != 1 || b->shape[0] != w->shape[0])
    refuse("has a bias \"" + head.projection_bias + "\" that is not a parameter of its " +
           std::to_string(w->shape[0]) + " rows");
}

}  // namespace

// "sha256" in any plugin table pins the plugin's file: checked on the
// bytes that are loaded, before any of their code runs in this process.
// Lower-case hex, or "" when the table pins nothing.
std::string Session::pinned_sha256(const toml::table* table) const {
  const toml::node* pin = table ? table->get("sha256") : nullptr;
  if (!pin) return "";
  const std::optional<std::string> want = pin->value<std::string>();
  if (!want || want->size() != 64 ||
      want->find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
    throw RecipeError(recipe_.where(*pin) +
                      ": sha256 must be the 64 hex digits of the plugin file's SHA-256 "
                      "(`tightfit plugins check FILE` prints it)");
  std::string pinned = *want;
  for (char& c : pinned) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return pinned;
}

PluginInstance Session::make_instance(const std::string& name, tf_plugin_kind kind,
                                      const toml::table* table, const std::string& role,
                                      const std::string& where_plugin) {
  const std::string pinned = pinned_sha256(table);
  const toml::node* pin = table ? table->get("sha256") : nullptr;
  const LoadedPlugin* found = nullptr;
  try {
    found = &plugins_.registry.find(name, kind, pinned);
  } catch (const PluginPinMismatch& e) {
    const PluginInfo* info = plugins_.registry.find_any(name);
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
  inst.ctx->kernel = &parts_;
  inst.ctx->plugin_name = plugin.name;
  inst.ctx->role = role;
  if (plugin.strategy() && plugin.strategy()->release_weight)
    log(TF_LOG_WARN, "[" + plugin.name +
                         "] sets release_weight, which no tightfit 1.x host calls (the hook is "
                         "withdrawn and goes in ABI 2.0): evict in stage_event when begin = 0");
  // "weights" in [model] is the kernel's: Hugging Face weights to start from.
  inst.ctx->config =
      recipe_.validate(table, "[" + role + "] (plugin " + plugin.name + ")", plugin.keys,
                       role == "model" ? std::vector<std::string>{"plugin", "weights", "sha256"}
                                       : std::vector<std::string>{"plugin", "sha256"});
  if (role == "model") read_gguf_paths_as_folders(inst.ctx->config);
  return inst;
}

// A model's PATH key naming a GGUF file (config = "model.gguf") reads as
// the Hugging Face folder converted from its metadata (gguf_folder): model
// plugins read config.json, never GGUF.
void Session::read_gguf_paths_as_folders(ConfigTable& config) {
  for (const KeySpec& k : config.keys()) {
    if (k.type != TF_VALUE_PATH) continue;
    const std::string path = config.get_string(k.name);
    if (path.empty() || !gguf::looks_like_gguf(path)) continue;
    try {
      const std::string folder = gguf::model_folder(path).path;
      config.substitute_path(k.name, folder);
      log(TF_LOG_INFO, "[model] " + k.name + " = " + path + ": read as " + folder +
                           " (its config.json, converted from the GGUF metadata)");
    } catch (const std::runtime_error& e) {
      throw RecipeError(config.where() + ": " + k.name + ": " + e.what());
    }
  }
}

// Composition first (everything `tightfit plan` needs, nothing allocated),
// then materialization; a dry run stops between them.
void Session::build(const PluginRegistry& base_registry) {
  read_kernel_tables();
  const std::optional<DistEnv> dist = set_up_device_and_ranks();
  const std::string base_dir = fs::path(recipe_.source()).parent_path().string();
  weights_base_dir_ = base_dir;
  set_up_registry(base_registry, base_dir);
  set_up_data(base_dir, dist ? dist->world_size : 1);
  set_up_run_folder(dist);
  create_model(base_dir);
  create_strategies();
  create_optimizer_and_schedule();
  if (options_.on_composed) options_.on_composed(*this);
  if (options_.dry_run) return;
  materialize_params();
  // What set-up read and converted stage by stage is freed; the heap keeps
  // those pages unless asked to give them back (set-up's sizes are not the
  // training's, so the block cache lets go of them too).
  cpu_block_cache().release_all();
  release_free_heap();

  // Found now rather than after the training: [save] hf needs every weight.
  if (env_.config.save.hf)
    for (const Param& p : store_.all())
      if (p.absent)
        throw RecipeError(recipe_.source() + ": [save] hf = true, but " + p.name +
                          " belongs to a block the recipe skips (sparse middle = \"skip\"), so "
                          "there is no whole model to export; set hf = false (and adapter = true "
                          "for LoRA) or use middle = \"frozen\"");
  if (options_.resume && !load_latest_checkpoint() && !options_.skip_data)
    log(TF_LOG_WARN,
        "--resume: no checkpoint in " + env_.checkpoint_dir() + "; starting from step 0");
  if (env_.pg) env_.pg->barrier();  // every rank composed the same run
}

// The kernel's own tables ([run], [data], [optimizer], [save]) validated
// and read, once, into env_.config.
void Session::read_kernel_tables() {
  recipe_.check_top_level(kernel_top_level_tables());
  env_.config.run = read_run_config(recipe_.validate(recipe_.table("run"), "[run]", run_keys()));
  env_.config.data =
      read_data_config(recipe_.validate(recipe_.table("data"), "[data]", data_keys()));
  env_.config.optimizer = read_optimizer_config(
      recipe_.validate(recipe_.table("optimizer"), "[optimizer]", optimizer_keys()));
  env_.config.save =
      read_save_config(recipe_.validate(recipe_.table("save"), "[save]", save_keys()));
  executor_.inject_nan_at(env_.config.run.debug_nan_at_steps);
  executor_.set_fused_loss(env_.config.run.fused_loss, env_.config.run.loss_chunk_tokens);
  if (const int64_t threads = env_.config.run.threads; threads > 0)
    at::set_num_threads(static_cast<int>(threads));
  cpu_block_cache().set_limit(env_.config.run.cpu_block_cache);
}

// The training device, and the process group when a launcher started ranks.
std::optional<DistEnv> Session::set_up_device_and_ranks() {
  env_.device_str = env_.config.run.device;
  try {
    env_.device = parse_training_device(env_.device_str);
  } catch (const std::invalid_argument& e) {
    throw RecipeError(recipe_.source() + ": [run].device: " + e.what());
  }
  // The run's memory budget, decided once (memory_budget.hpp).
  try {
    env_.budget =
        decide_memory_budget(env_.config.run.memory_budget, env_.config.run.memory_budget_scope,
                             env_.device.is_cuda(), options_.dry_run);
  } catch (const std::invalid_argument& e) {
    throw RecipeError(recipe_.source() + ": " + e.what() + " (device = \"" + env_.device_str +
                      "\")");
  }
  // A GPU run's budget is applied once its index is known (below).
  if (!env_.budget.on_gpu() || options_.dry_run) apply_memory_budget(env_.budget, 0);
  // A dry run plans a GPU recipe on a machine without one (nothing is
  // allocated); a real run needs the device.
  if (env_.device.is_cuda() && !at::hasCUDA() && !options_.dry_run)
    throw RecipeError(recipe_.source() + ": [run].device is \"" + env_.device_str +
                      "\" but no CUDA device is available here; use device = \"cpu\"");
  if (env_.device.is_cuda() && env_.device.has_index() && !options_.dry_run &&
      !cuda_device_usable(env_.device.index()))
    throw RecipeError(recipe_.source() + ": [run].device is \"" + env_.device_str +
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
  if (dist && env_.device.is_cuda() && !env_.device.has_index())
    env_.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(dist->local_rank));
  if (dist && env_.device.is_cuda()) env_.device_str = env_.device.str();
  if (dist && !options_.dry_run) {
    const auto timeout =
        std::chrono::milliseconds(static_cast<int64_t>(env_.config.run.dist_timeout * 1000.0));
    env_.pg = std::make_unique<ProcessGroup>(*dist, env_.device, timeout);
    log(TF_LOG_DEBUG, "rank " + std::to_string(dist->rank) + " of " +
                          std::to_string(dist->world_size) + " joined (" + env_.pg->backend() +
                          ")");
  }
  if (env_.budget.on_gpu() && !options_.dry_run) {
    apply_memory_budget(env_.budget, env_.device.has_index() ? env_.device.index() : 0);
    cuda_set_deterministic(env_.config.run.deterministic);
  }

  return dist;
}

// The tokenizer and the batches (none in a dry run or with skip_data).
void Session::set_up_data(const std::string& base_dir, int64_t world_size) {
  try {
    DataRequest req;
    req.corpus = env_.config.data.corpus;
    req.tokenizer = env_.config.data.tokenizer;
    req.base_dir = base_dir;
    if (const toml::table* mt = recipe_.table("model"); mt && mt->contains("weights"))
      req.weights = (*mt)["weights"].value_or(std::string{});
    if (!req.weights.empty()) {
      // The folder the weights come from (as materialize_params resolves it).
      fs::path w = req.weights;
      std::error_code ec;
      if (w.is_relative() && !fs::exists(w, ec)) w = fs::path(base_dir) / w;
      if (!fs::is_directory(w, ec)) w = w.parent_path();
      env_.model_source = fs::absolute(w, ec).lexically_normal().string();
      if (!env_.model_source.empty() && env_.model_source.back() == '/')
        env_.model_source.pop_back();
    }
    req.chat_template = env_.config.data.chat_template;
    req.train_on = env_.config.data.train_on;
    req.packing = env_.config.data.packing;
    req.preference.max_prompt_length = env_.config.data.max_prompt_length;
    req.preference.max_completion_length = env_.config.data.max_completion_length;
    req.preference.max_length = env_.config.data.max_length;
    req.preference.keep_end = env_.config.data.truncation_mode == "keep_end";
    const std::string tokenization = schedule_preference_tokenization();
    req.preference.joint = tokenization == "joint";
    req.preference.unpaired = tokenization == "kto";
    req.seq_len = env_.config.data.seq_len;
    req.batch_size = env_.config.data.batch_size;
    req.world_size = world_size;
    req.val_fraction = env_.config.data.val_fraction;
    req.seed = static_cast<uint64_t>(env_.config.run.seed);
    req.memory_budget = env_.budget.bytes;
    req.budget_counts_host = env_.budget.counts_host_data();
    req.read_data = !options_.skip_data && !options_.dry_run;
    if (const toml::table* dt = recipe_.table("data"))
      for (const char* key :
           {"max_prompt_length", "max_completion_length", "max_length", "truncation_mode"})
        if (dt->contains(key)) req.preference_keys_set.emplace_back(key);
    data_.set(setup_data(req));
    if (!data_.description().empty()) log(TF_LOG_INFO, "data: " + data_.description());
  } catch (const std::invalid_argument& e) {
    throw RecipeError(recipe_.source() + ": [data]: " + e.what());
  } catch (const OutOfBudgetError&) {
    throw;
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const c10::Error*>(&e)) throw;
    throw RecipeError(recipe_.source() + ": [data]: " + e.what());
  }
}

// The run's folder, and what plugins learn of the run (tf_run_info).
void Session::set_up_run_folder(const std::optional<DistEnv>& dist) {
  // Run folder. A fresh run never writes over another run's checkpoints, and
  // its name never leads out of out_dir (nor a relative [save] dir upwards).
  auto stays_inside = [](const fs::path& p) {
    if (p.empty() || p.is_absolute()) return false;
    for (const auto& part : p)
      if (part == "..") return false;
    return true;
  };
  if (!stays_inside(env_.config.run.name))
    throw RecipeError(recipe_.source() + ": [run].name = \"" + env_.config.run.name +
                      "\" would leave out_dir (an absolute path, or ..): name the run, and set "
                      "out_dir for where its folder goes");
  if (const std::string d = env_.config.save.dir;
      !d.empty() && !fs::path(d).is_absolute() && !stays_inside(d))
    throw RecipeError(recipe_.source() + ": [save].dir = \"" + d +
                      "\" climbs out of the working folder (..): give an absolute path if that "
                      "is where checkpoints go");
  env_.run_dir = (fs::path(env_.config.run.out_dir) / env_.config.run.name).string();
  if (!options_.resume && env_.config.save.dir.empty()) {
    const std::string base = env_.run_dir;
    for (int i = 2; fs::exists(fs::path(env_.run_dir) / "checkpoints" / "manifest.json"); ++i)
      env_.run_dir = base + "." + std::to_string(i);
  }
  if (!options_.skip_data && !options_.dry_run) {
    fs::create_directories(env_.run_dir);
    // One run per folder: a second process training here is refused naming
    // this one's pid (ranks of one run share it through rank 0).
    if (!dist || dist->rank == 0) env_.folder_lock = RunFolderLock::acquire(env_.run_dir);
  }
  env_.run_dir_abs = fs::absolute(env_.run_dir).string();

  env_.run_info = tf_run_info{};
  env_.run_info.struct_size = sizeof env_.run_info;
  env_.run_info.device = env_.device_str.c_str();
  env_.run_info.rank = dist ? dist->rank : 0;
  env_.run_info.world_size = dist ? dist->world_size : 1;
  env_.run_info.dry_run = options_.dry_run ? 1 : 0;
  if (options_.dry_run && options_.plan_world_size > 0)
    env_.run_info.world_size = options_.plan_world_size;
  env_.run_info.local_rank = dist ? dist->local_rank : 0;
  env_.run_info.vocab_size = data_.tokenizer().vocab_size();
  env_.run_info.seq_len = env_.config.data.seq_len;
  // Rows a batch holds: a preference pair is two (chosen, rejected).
  env_.run_info.batch_size = env_.config.data.batch_size * (data_.pairs() ? 2 : 1);
  env_.run_info.total_steps = env_.config.run.steps;
  env_.run_info.seed = static_cast<uint64_t>(env_.config.run.seed);
  env_.run_info.run_dir = env_.run_dir_abs.c_str();
  env_.run_info.model_source = env_.model_source.c_str();
}

// The registry: the recipe's own plugin paths add to the installed ones (a
// name taken twice is a conflict the registry reports when the name is used).
void Session::set_up_registry(const PluginRegistry& base_registry, const std::string& base_dir) {
  plugins_.registry = base_registry;
  PluginRegistry& registry = plugins_.registry;
  for (const auto& p : env_.config.run.plugin_paths) {
    fs::path path = p;
    if (path.is_relative()) path = fs::path(base_dir) / path;
    registry.add_path(path.string(), "recipe");
  }
  for (const auto& prob : registry.problems()) log_message(TF_LOG_DEBUG, prob);
}

// The recipe's schedule as [schedule] plugin names it ("standard" when none).
std::string Session::schedule_name() const {
  const toml::table* sched_table = recipe_.table("schedule");
  return sched_table && sched_table->contains("plugin")
             ? recipe_.required_string(sched_table, "schedule", "plugin")
             : "standard";
}

// How the recipe's schedule tokenizes preference rows (its vtable's
// preference_tokenization: "dpo", "joint" or "kto"), read before the
// schedule is made: the data comes first. A schedule the registry cannot
// give is reported when it is made; until then its rows are read as DPO's.
std::string Session::schedule_preference_tokenization() const {
  const std::string name = schedule_name();
  const tf_schedule_vtable* vt = nullptr;
  try {
    vt = plugins_.registry.find(name, TF_PLUGIN_SCHEDULE, pinned_sha256(recipe_.table("schedule")))
             .schedule();
  } catch (const std::exception&) {
    return "dpo";
  }
  if (!vt || !vt->preference_tokenization) return "dpo";
  const std::string how = vt->preference_tokenization;
  if (how == "joint" || how == "dpo" || how == "kto") return how;
  throw RecipeError(recipe_.source() + ": schedule plugin \"" + name +
                    "\" asks for preference_tokenization \"" + how +
                    "\", which this host does not know (\"dpo\", \"joint\" or \"kto\"): "
                    "update tightfit or the plugin");
}

// The model, declared.
void Session::create_model(const std::string& base_dir) {
  const toml::table* model_table = recipe_.table("model");
  const std::string model_name = recipe_.required_string(model_table, "model", "plugin");
  plugins_.model = make_instance(model_name, TF_PLUGIN_MODEL, model_table, "model",
                                 recipe_.where(*model_table->get("plugin")));
  if (env_.config.data.packing &&
      !(plugins_.model.plugin->model_features & TF_MODEL_FEATURE_POSITIONS))
    throw RecipeError(recipe_.source() + ": [data] packing = true: model plugin \"" + model_name +
                      "\" does not read per-token positions (TF_MODEL_FEATURE_POSITIONS), so its "
                      "attention would cross from one example to the next in a packed row; set "
                      "packing = false");
  plugins_.declaring = true;
  const tf_status model_st = plugin_call(plugins_.model, "create", [&] {
    return plugins_.model.plugin->model()->create(host_api(), plugins_.model.ctx.get(),
                                                  &plugins_.model.state);
  });
  // A model that refuses the recipe's values (seq_len past its positions, a
  // shape that does not divide) is a recipe error at its table, as a strategy's is.
  if (model_st == TF_ERR_INVALID_ARGUMENT)
    throw RecipeError(recipe_.where(*model_table->get("plugin")) + ": " +
                      plugins_.model.ctx->plugin_error);
  check_plugin_status(model_st, plugins_.model, "create");
  if (executor_.stages().empty())
    throw PluginCallError("model plugin \"" + model_name + "\" declared no stages");
  if (executor_.stages().front().kind != TF_STAGE_EMBED ||
      executor_.stages().back().kind != TF_STAGE_HEAD)
    throw PluginCallError("model plugin \"" + model_name +
                          "\" must declare an embed stage first and a head stage last");
  check_head_projection(executor_.stages().back(), store_, model_name);
}

// The [[strategy]] tables in order: created, then configured.
void Session::create_strategies() {
  int idx = 0;
  for (const toml::table* t : recipe_.array_tables("strategy")) {
    ++idx;
    const std::string name = recipe_.required_string(t, "strategy", "plugin");
    const std::string role = "strategy #" + std::to_string(idx);
    plugins_.strategies.push_back(
        make_instance(name, TF_PLUGIN_STRATEGY, t, "[strategy]", recipe_.where(*t->get("plugin"))));
    PluginInstance& s = plugins_.strategies.back();
    s.ctx->role = role;
    const tf_status st = plugin_call(s, "create", [&] {
      return s.plugin->strategy()->create(host_api(), s.ctx.get(), &s.state);
    });
    // A strategy that refuses its keys is a recipe error at its table.
    if (st == TF_ERR_INVALID_ARGUMENT)
      throw RecipeError(recipe_.where(*t->get("plugin")) + ": " + s.ctx->plugin_error);
    check_plugin_status(st, s, "create");
  }
  StrategyChain(plugins_.strategies)
      .each_with(TF_STRATEGY_HOOK(configure),
                 [&](size_t i, tf_status st) { check_strategy_setup(i, st, "configure"); });
  plugins_.declaring = false;
}

// A strategy's status while the run is set up: one that cannot accept the
// recipe (no matching target, a bad combination) is a recipe error at its
// [[strategy]] table.
void Session::check_strategy_setup(size_t i, tf_status st, const char* what) {
  if (st == TF_ERR_INVALID_ARGUMENT) {
    const std::string msg = plugins_.strategies[i].ctx->plugin_error;
    plugins_.strategies[i].ctx->plugin_error.clear();
    throw RecipeError(recipe_.where(*recipe_.array_tables("strategy")[i]->get("plugin")) + ": " +
                      msg);
  }
  check_plugin_status(st, plugins_.strategies[i], what);
}

// The optimizer (it holds no state yet) and the schedule, made before
// materialization so that a dry run (`plan`) can ask for their estimates.
void Session::create_optimizer_and_schedule() {
  update_.create_optimizer(env_.config.optimizer);
  const toml::table* sched_table = recipe_.table("schedule");
  const std::string sched_name = schedule_name();
  plugins_.schedule = make_instance(sched_name, TF_PLUGIN_SCHEDULE, sched_table, "schedule",
                                    sched_table && sched_table->get("plugin")
                                        ? recipe_.where(*sched_table->get("plugin"))
                                        : recipe_.source());
  PluginInstance& schedule = plugins_.schedule;
  check_plugin_status(plugin_call(schedule, "create",
                                  [&] {
                                    return schedule.plugin->schedule()->create(
                                        host_api(), schedule.ctx.get(), &schedule.state);
                                  }),
                      schedule, "create");
}

// Parameters created stage by stage: initialized or read from the weights
// folder, and handed to the strategies before the next stage exists.
void Session::materialize_params() {
  // Dropout and other ops draw from the global generators; seed them per run.
  at::manual_seed(env_.run_info.seed);
  // Stage by stage: initialize, load the stage's weights, let strategies
  // convert them (stage_params_ready); only then allocate the next stage.
  const HfWeightSource* weights = weight_source();
  auto weights_error = [&](const std::exception& e) {
    if (dynamic_cast<const c10::Error*>(&e)) throw;
    throw RecipeError(recipe_.where(*recipe_.table("model")->get("weights")) + ": " + e.what());
  };
  // A parameter lives on its stage's device (shard's layers mode places
  // stages); shared ones (tied embeddings) on the first stage's.
  // Parameters of skipped stages (sparse) are never allocated or loaded.
  auto place = [&](const Param& p) -> std::optional<at::Device> {
    const size_t stage = p.stage >= 0 ? static_cast<size_t>(p.stage) : 0;
    if (stage >= executor_.stages().size()) return env_.device;
    if (p.stage >= 0 && executor_.stages()[stage].skip) return std::nullopt;
    return at::Device(executor_.stages()[stage].device);
  };
  store_.materialize(env_.run_info.seed, place, [&](size_t first, size_t last) {
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
    StrategyChain(plugins_.strategies)
        .each_with(
            TF_STRATEGY_HOOK(stage_params_ready),
            [&](size_t i, tf_status st) { check_strategy_setup(i, st, "stage_params_ready"); },
            stage);
    // The stage's initial values are converted and freed; the heap's free
    // pages go back before the next stage, so set-up's resident peak is one
    // stage and not the fragments left between the ones kept (scales, codes).
    release_free_heap();
  });
  StrategyChain(plugins_.strategies)
      .each_with(TF_STRATEGY_HOOK(params_ready),
                 [&](size_t i, tf_status st) { check_strategy_setup(i, st, "params_ready"); });

  executor_.prepare_recompute();
}

}  // namespace tightfit
