// The plugins of a recipe made into instances: the registry with the
// recipe's own paths, a plugin found (and its pinned hash checked), its
// table validated, and the model, strategies and schedule created.
#include <cctype>
#include <filesystem>
#include <optional>

#include "gguf_folder.hpp"
#include "gguf_model.hpp"
#include "json_input.hpp"
#include "logging.hpp"
#include "plugin_hooks.hpp"
#include "recipe_paths.hpp"
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

// `plugin = "auto"`: the model plugin that declares the model_type of the
// config.json that [model] config names (a model folder, or a GGUF file read
// as the folder converted from its metadata), as transformers' AutoModel
// picks a class, so one recipe fine-tunes any family.
std::string model_plugin_for_config(const Recipe& recipe, const toml::table& model,
                                    const PluginRegistry& registry, const std::string& base_dir) {
  const std::string where = recipe.where(*model.get("plugin"));
  const toml::node* config = model.get("config");
  const std::optional<std::string> spec = config ? config->value<std::string>() : std::nullopt;
  if (!spec || spec->empty())
    throw RecipeError(where +
                      ": plugin = \"auto\" takes the model plugin from the model_type in the "
                      "config.json that [model] config names; give config (a model folder or a "
                      "GGUF file), or name the plugin (`tightfit plugins list`)");
  std::string folder = resolve_recipe_path(*spec, base_dir).string();
  std::error_code ec;
  if (!fs::exists(folder, ec))
    throw RecipeError(recipe.where(*config) + ": config = \"" + *spec +
                      "\" is not there (looked in the working directory and beside the "
                      "recipe): give your model folder or GGUF file, as --set model.config=PATH "
                      "--set model.weights=PATH");
  try {
    if (!fs::is_directory(folder) && gguf::looks_like_gguf(folder))
      folder = gguf::model_folder(folder).path;
  } catch (const std::runtime_error& e) {
    throw RecipeError(recipe.where(*config) + ": " + e.what());
  }
  const std::string file = (fs::path(folder) / "config.json").string();
  nlohmann::json cfg;
  try {
    cfg = read_json_file(file, size_t{16} << 20);
  } catch (const std::exception& e) {
    throw RecipeError(recipe.where(*config) + ": plugin = \"auto\" reads the model_type of " +
                      file + ": " + e.what());
  }
  const auto type = cfg.is_object() ? cfg.find("model_type") : cfg.end();
  const std::string model_type =
      cfg.is_object() && type != cfg.end() && type->is_string() ? type->get<std::string>() : "";
  if (const PluginInfo* p = registry.find_hf_model_type(model_type)) return p->name;
  std::string known;
  for (const PluginInfo* p : registry.all())
    for (const auto& t : p->hf_model_types) known += (known.empty() ? "" : ", ") + t;
  throw RecipeError(
      where + ": plugin = \"auto\": " + file +
      (model_type.empty() ? " has no model_type" : " has model_type \"" + model_type + "\"") +
      ", which no installed model plugin computes (installed: " + known +
      "); name the plugin, or convert the model to one of those");
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
  inst.ctx->config = recipe_.validate(
      table, "[" + role + "] (plugin " + plugin.name + ")", plugin.keys,
      role == "model" ? std::vector<std::string>{"plugin", "weights", "sha256"}
      : role == "reward"
          ? std::vector<std::string>{"plugin", "sha256", "weight", "name", "time_limit"}
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

// The recipe's schedule's TF_SCHEDULE_FEATURE_* bits (ABI 1.25), read
// before it is made, as its preference_tokenization is; 0 when the registry
// cannot give it (reported when it is made).
uintptr_t Session::schedule_features() const {
  try {
    const LoadedPlugin& p = plugins_.registry.find(schedule_name(), TF_PLUGIN_SCHEDULE,
                                                   pinned_sha256(recipe_.table("schedule")));
    if (TF_VERSION_MINOR(p.abi_version) < 25 || !p.schedule()) return 0;
    return p.schedule()->features;
  } catch (const std::exception&) {
    return 0;
  }
}

// The model, declared.
void Session::create_model(const std::string& base_dir) {
  const toml::table* model_table = recipe_.table("model");
  std::string model_name = recipe_.required_string(model_table, "model", "plugin");
  if (model_name == "auto") {
    model_name = model_plugin_for_config(recipe_, *model_table, plugins_.registry, base_dir);
    log(TF_LOG_INFO, "[model] plugin = \"auto\": " + model_name);
  }
  plugins_.model = make_instance(model_name, TF_PLUGIN_MODEL, model_table, "model",
                                 recipe_.where(*model_table->get("plugin")));
  if (env_.config.data.packing &&
      !(plugins_.model.plugin->model_features & TF_MODEL_FEATURE_POSITIONS))
    throw RecipeError(recipe_.source() + ": [data] packing = true: model plugin \"" + model_name +
                      "\" does not read per-token positions (TF_MODEL_FEATURE_POSITIONS), so its "
                      "attention would cross from one example to the next in a packed row; set "
                      "packing = false");
  if (env_.config.run.mlp_tile_tokens > 0 &&
      !(plugins_.model.plugin->model_features & TF_MODEL_FEATURE_TILED_MLP))
    throw RecipeError(recipe_.source() + ": [run] mlp_tile_tokens = " +
                      std::to_string(env_.config.run.mlp_tile_tokens) + ": model plugin \"" +
                      model_name +
                      "\" does not compute its feed-forward in tiles "
                      "(TF_MODEL_FEATURE_TILED_MLP); set mlp_tile_tokens = 0");
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
  const ScopedAssign<bool> copies_allowed(plugins_.declaring_copies, true);
  check_plugin_status(plugin_call(schedule, "create",
                                  [&] {
                                    return schedule.plugin->schedule()->create(
                                        host_api(), schedule.ctx.get(), &schedule.state);
                                  }),
                      schedule, "create");
}

}  // namespace tightfit
