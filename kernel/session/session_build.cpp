// Building a session: the kernel's tables read, the device and ranks, the
// data and the run folder set up, the plugins made (session_plugins.cpp),
// then parameters created stage by stage.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <filesystem>
#include <limits>
#include <optional>

#include "byte_size.hpp"
#include "checked_size.hpp"
#include "cpu_block_cache.hpp"
#include "cuda_memory.hpp"
#include "data_setup.hpp"
#include "device_spec.hpp"
#include "hf_weights.hpp"
#include "input_files.hpp"
#include "kernel_config.hpp"
#include "kernel_keys.hpp"
#include "logging.hpp"
#include "memory_budget.hpp"
#include "plugin_hooks.hpp"
#include "process_memory.hpp"
#include "progress.hpp"
#include "recipe_paths.hpp"
#include "session.hpp"
#include "strategy_chain.hpp"

namespace tightfit {
namespace fs = std::filesystem;

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
  create_rewards();
  if (options_.on_composed) options_.on_composed(*this);
  if (options_.dry_run) return;
  // Set-up makes a stage's dense values, converts them and frees them, and
  // the next stage asks for the same sizes: the cache keeps them however
  // large (a 7B layer's 0.8 GB of fp32), still within the most the live
  // blocks have needed, so the pages are not faulted in and zeroed again for
  // every layer (a tenth of a 7B QLoRA set-up's CPU time).
  if (!options_.guest) cpu_block_cache().set_limit(std::numeric_limits<int64_t>::max());
  materialize_params();
  // What set-up read and converted stage by stage is freed; the heap keeps
  // those pages unless asked to give them back (set-up's sizes are not the
  // training's, so the block cache lets go of them too).
  if (!options_.guest) {
    cpu_block_cache().release_all();
    cpu_block_cache().set_limit(env_.config.run.cpu_block_cache);
    release_free_heap();
  }

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
  if (env_.config.optimizer.fused && env_.config.optimizer.name != "adamw")
    throw RecipeError(recipe_.source() + ": [optimizer] fused = true is AdamW's fused kernel; " +
                      env_.config.optimizer.name +
                      " has none here: set name = \"adamw\" or fused = false");
  executor_.inject_nan_at(env_.config.run.debug_nan_at_steps);
  executor_.set_fused_loss(env_.config.run.fused_loss, env_.config.run.loss_chunk_tokens);
  executor_.set_mlp_tile_tokens(env_.config.run.mlp_tile_tokens);
  // A fixed count does not follow the load: asking for both is refused, not
  // half done.
  if (env_.config.run.adapt_threads && env_.config.run.threads > 0)
    throw RecipeError(recipe_.source() +
                      ": [run] adapt_threads = true follows the machine's load "
                      "from one thread per usable CPU, and threads = " +
                      std::to_string(env_.config.run.threads) +
                      " fixes the count: set threads = 0 to adapt, or adapt_threads = false");
  if (options_.guest) return;  // the host run's threads and cache stand
  cpu_threads_.emplace(env_.config.run.threads, env_.config.run.adapt_threads,
                       [this](tf_log_level l, const std::string& m) { log(l, m); });
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
  if ((!env_.budget.on_gpu() || options_.dry_run) && !options_.guest)
    apply_memory_budget(env_.budget, 0);
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
    if (!options_.guest) dist = dist_env_from_environment();
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
  if (env_.budget.on_gpu() && !options_.dry_run && !options_.guest) {
    apply_memory_budget(env_.budget, env_.device.has_index() ? env_.device.index() : 0);
    cuda_set_deterministic(env_.config.run.deterministic);
  }

  return dist;
}

namespace {

// What this run reads, so that no output of it replaces one
// (input_files.hpp): the recipe, the weights, the data and the tokenizer.
void note_inputs(const void* owner, const std::string& recipe, const DataRequest& req) {
  auto resolve = [&](const std::string& spec) { return resolve_recipe_path(spec, req.base_dir); };
  std::error_code ec;
  note_input(owner, recipe, "the recipe", InputKind::kOtherFile);
  if (!req.weights.empty()) {
    const fs::path w = resolve(req.weights);
    if (fs::is_directory(w, ec))
      note_input_folder(owner, w.string(), "the base weights");
    else
      note_input(owner, w.string(), "the base weights", InputKind::kModelFile);
  }
  if (!req.corpus.empty() && req.corpus.rfind("builtin:", 0) != 0)
    note_input(owner, resolve(req.corpus).string(), "the data", InputKind::kOtherFile);
  if (!req.tokenizer.empty() && req.tokenizer != "byte" && req.tokenizer != "auto") {
    const fs::path t = resolve(req.tokenizer);
    if (fs::is_directory(t, ec))
      note_input_folder(owner, t.string(), "the tokenizer");
    else
      note_input(owner, t.string(), "the tokenizer", InputKind::kModelFile);
  }
}

}  // namespace

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
      fs::path w = resolve_recipe_path(req.weights, base_dir);
      std::error_code ec;
      if (!fs::is_directory(w, ec)) w = w.parent_path();
      env_.model_source = fs::absolute(w, ec).lexically_normal().string();
      if (!env_.model_source.empty() && env_.model_source.back() == '/')
        env_.model_source.pop_back();
    }
    note_inputs(this, recipe_.source(), req);
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
    req.prompts = (schedule_features() & TF_SCHEDULE_FEATURE_PROMPTS) != 0;
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
  env_.run_info.mlp_tile_tokens = env_.config.run.mlp_tile_tokens;
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
  // What set-up was doing when an allocation failed: the parameter, its size
  // and where its values come from, never LibTorch's allocator text alone.
  const Param* building = nullptr;
  const char* doing = "allocating";
  auto out_of_memory = [&](const std::string& allocator) {
    std::string what = "building the model";
    if (building) {
      const int64_t bytes = checked_product(
          {building->numel(), static_cast<int64_t>(c10::elementSize(building->dtype))},
          "parameter " + building->name);
      what = std::string(doing) + " parameter " + building->name + " (" +
             c10::toString(building->dtype) + " " + c10::str(at::IntArrayRef(building->shape)) +
             ", " + format_bytes(bytes) + ", " +
             (weights && !(building->flags & TF_PARAM_ADAPTER) ? "values from " + weights->source()
                                                               : std::string("initial values")) +
             ")";
    }
    return OutOfBudgetError(allocator + " — while " + what +
                            ". The model does not fit this machine as the recipe builds it: "
                            "`tightfit plan` shows where its memory goes, `tightfit fit` finds "
                            "strategies that fit a budget");
  };
  int64_t stages = 0;  // the groups materialize hands over, for the progress line
  for (size_t i = 0, n = store_.plugins_see(); i < n; ++i)
    stages += i + 1 == n || store_.all()[i + 1].stage != store_.all()[i].stage;
  Progress progress("building the model", stages, "stages");
  int64_t stages_done = 0;
  try {
    store_.materialize(
        env_.run_info.seed,
        [&](const Param& p) {
          building = &p;
          doing = "allocating";
          return place(p);
        },
        [&](size_t first, size_t last) {
          auto& params = store_.all();
          if (weights) {
            try {
              for (size_t k = first; k < last; ++k)
                if (!(params[k].flags & TF_PARAM_ADAPTER) && !params[k].absent) {
                  building = &params[k];
                  doing = "reading";
                  weights->load(params[k]);  // adapters load on their own
                }
            } catch (const std::runtime_error& e) {
              weights_error(e);
            }
          }
          building = nullptr;
          doing = "converting a stage of";
          progress.set(++stages_done);
          const int32_t stage = params[first].stage;
          if (params[first].absent) return;  // a skipped stage: nothing to convert
          StrategyChain(plugins_.strategies)
              .each_with(
                  TF_STRATEGY_HOOK(stage_params_ready),
                  [&](size_t i, tf_status st) {
                    check_strategy_setup(i, st, "stage_params_ready");
                  },
                  stage);
          // The stage's initial values are converted and freed; the heap's free
          // pages go back before the next stage, so set-up's resident peak is one
          // stage and not the fragments left between the ones kept (scales, codes).
          release_free_heap();
        },
        [&](const Param& p) {
          // What the weights file gives is read, not drawn first (a 7B model's
          // draws were 22 s of its set-up); no other parameter's numbers change.
          return weights == nullptr || (p.flags & TF_PARAM_ADAPTER);
        });
  } catch (const c10::Error& e) {
    // The budget's refusal or a device's, or the CPU allocator's own (the
    // machine's memory: a plain c10::Error from its enforce).
    if (std::optional<std::string> refusal = budget_refusal(e)) throw out_of_memory(*refusal);
    const std::string text = e.what_without_backtrace();
    const size_t at = text.find("DefaultCPUAllocator");
    if (at != std::string::npos && text.find("allocate memory", at) != std::string::npos)
      throw out_of_memory(text.substr(at));
    throw;
  } catch (const std::bad_alloc&) {
    throw out_of_memory("this machine ran out of memory");
  }
  StrategyChain(plugins_.strategies)
      .each_with(TF_STRATEGY_HOOK(params_ready),
                 [&](size_t i, tf_status st) { check_strategy_setup(i, st, "params_ready"); });

  executor_.prepare_recompute();
}

}  // namespace tightfit
