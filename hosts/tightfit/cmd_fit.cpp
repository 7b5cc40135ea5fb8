// `tightfit fit recipe.toml --budget 8GiB [--objective speed|quality]`: finds
// the stacks of installed strategies (and their key values) whose planned
// peak fits the budget, ranks them by the step time the cost model predicts
// from this machine's measured rates (or by how little they change the
// maths, then time), prints the best and writes the winner as a recipe.
// `--verify` runs a few steps of the top stacks and compares.
//
// fit_command reads as its steps: read the options, probe the model's
// shapes, measure (or recall) the machine, search the stacks, rank them,
// write the winner, show them, verify.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "commands.hpp"
#include "file_util.hpp"
#include "fit_planned.hpp"
#include "fit_rank.hpp"
#include "fit_rates.hpp"
#include "fit_search.hpp"
#include "fit_stacks.hpp"
#include "fit_verify.hpp"
#include "input_files.hpp"
#include "json_output.hpp"
#include "logging.hpp"
#include "longest_length.hpp"
#include "session.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using nlohmann::json;

namespace tightfit::host {

namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

po::options_description fit_options() {
  po::options_description opts("tightfit fit recipe.toml --budget SIZE [options]");
  opts.add_options()("help,h", "show this help")(
      "budget", po::value<std::string>(), "the memory the stack must fit, e.g. 8GiB (required)")(
      "objective", po::value<std::string>()->default_value("speed"),
      "speed: the fastest stack that fits; quality: the one that changes the maths least, then "
      "the fastest")("out,o", po::value<std::string>(),
                     "where to write the winning recipe (default: <recipe>.fit.toml here)")(
      "top", po::value<int>()->default_value(5), "stacks to list")(
      "ranks", po::value<int>()->default_value(0),
      "plan per rank for this many ranks (default: the launch environment's)")(
      "keep", po::value<std::string>()->default_value(""),
      "comma list of plugins whose recipe tables stay as they are (not searched)")(
      "without", po::value<std::string>()->default_value(""), "comma list of plugins never to use")(
      "lora-ranks", po::value<std::string>()->default_value(""),
      "LoRA ranks to try beside the recipe's own (default: the recipe's rank alone; 8,16,64 "
      "when a recipe training all weights turns to LoRA; --without lora keeps all weights "
      "training)")("change", po::value<std::string>()->default_value(""),
                   "comma list of plugins whose choice in the recipe fit may change (quantize: "
                   "the format of a quantized base)")(
      "set", po::value<std::vector<std::string>>()->composing(),
      "override a recipe key before the search")("json", "print the result as JSON")(
      "measure", "measure this machine's rates again instead of using the cached ones")(
      "longest-context",
      "the longest data.seq_len (to 256 tokens) some stack fits, the feed-forward whole or in "
      "tiles (run.mlp_tile_tokens) where the model tiles; the stacks that fit it ranked as "
      "--objective says, the winner written with that length")(
      "verify", "run the top stacks for a few steps and compare predicted with measured")(
      "verify-top", po::value<int>()->default_value(3), "stacks --verify runs")(
      "verify-spread",
      "verify stacks spread over the whole ranking, not the top ones (tests the cost model's "
      "order)")("verify-steps", po::value<int>()->default_value(4), "steps of each --verify run");
  return opts;
}

// The command line's values, checked (a typing error exits 2 naming it).
struct FitOptions {
  int64_t budget = 0;
  std::string objective;
  std::vector<int> lora_ranks;
  int ranks = 0;
};

std::optional<FitOptions> read_fit_options(const po::variables_map& vm) {
  FitOptions o;
  o.objective = vm["objective"].as<std::string>();
  if (o.objective != "speed" && o.objective != "quality") {
    std::cerr << "tightfit fit: --objective is speed or quality, not \"" << o.objective << "\"\n";
    return std::nullopt;
  }
  try {
    o.budget = parse_byte_size(vm["budget"].as<std::string>());
  } catch (const std::invalid_argument& e) {
    std::cerr << "tightfit fit: --budget: " << e.what() << "\n";
    return std::nullopt;
  }
  for (const auto& s : split_list(vm["lora-ranks"].as<std::string>())) {
    try {
      o.lora_ranks.push_back(std::stoi(s));
    } catch (const std::exception&) {
      o.lora_ranks.push_back(0);
    }
    if (o.lora_ranks.back() < 1) {
      std::cerr << "tightfit fit: --lora-ranks: \"" << s << "\" is not a rank (1, 2, ...)\n";
      return std::nullopt;
    }
  }
  o.ranks = vm["ranks"].as<int>();
  return o;
}

// The shapes the machine's rates are measured at: the largest block matrix
// (k x n) and the tokens of a batch, on the recipe's device.
struct ModelShape {
  int64_t k = 512, n = 2048, tokens = 1;
  std::string device = "cpu";
};

ModelShape probe_model_shape(const Recipe& recipe, const PluginRegistry& registry, int ranks) {
  SessionOptions so;
  so.dry_run = true;
  so.plan_world_size = ranks;
  Session probe(recipe, registry, so);
  ModelShape m;
  m.tokens = probe.env().run_info.batch_size * probe.env().run_info.seq_len;
  int64_t largest = 0;
  for (const Param& p : probe.store().all())
    if (p.stage >= 0 &&
        probe.executor().stages()[static_cast<size_t>(p.stage)].kind == TF_STAGE_BLOCK &&
        p.shape.size() == 2 && p.numel() > largest) {
      largest = p.numel();
      m.n = p.shape[0];
      m.k = p.shape[1];
    }
  m.device = probe.env().device.str();
  return m;
}

// Whether the plugin has a key whose recipe value is the user's choice
// (TF_SEARCH_KEY_RECIPES_CHOICE), one `--change` may name.
bool holds_recipes_choice(const PluginInfo* p) {
  if (!p) return false;
  return std::any_of(p->keys.begin(), p->keys.end(), [](const KeySpec& k) {
    return k.search && (k.search->flags & TF_SEARCH_KEY_RECIPES_CHOICE) &&
           !(k.search->flags & TF_SEARCH_KEY_RANK);
  });
}

std::string recipes_choice_plugins(const PluginRegistry& registry) {
  std::string out;
  for (const PluginInfo* p : registry.all())
    if (holds_recipes_choice(p)) out += (out.empty() ? "" : ", ") + p->name;
  return out.empty() ? "none installed" : out;
}

// The winner as a recipe, whole or not at all (a planted link is replaced).
void write_winner(const std::string& out, const Planned& best, double plain_s,
                  const std::string& recipe_path, const std::string& budget_text,
                  const std::string& objective, bool longest, const std::string& device) {
  std::ostringstream text;
  text << "# Written by `tightfit fit " << recipe_path << " --budget " << budget_text
       << " --objective " << objective << (longest ? " --longest-context" : "") << "`:\n# "
       << best.choice.describe() << "; planned peak " << format_bytes(best.plan.tracked_peak)
       << ", predicted " << seconds(best.cost.total()) << " s/step (x"
       << seconds(best.cost.total() / plain_s) << " of the plain recipe) on " << device << ".\n\n"
       << best.recipe.to_toml() << "\n";
  write_file_synced(out, text.str());
}

// A TOML value as the recipe writes it (strings quoted).
std::string toml_text(const toml::node& n) {
  std::ostringstream os;
  if (const auto* t = n.as_table())
    os << toml::toml_formatter(*t);
  else if (const auto* a = n.as_array())
    os << toml::toml_formatter(*a);
  else
    n.visit([&](const auto& v) { os << toml::toml_formatter(v); });
  return os.str();
}

// What the written recipe changes in the user's, one line each with why: the
// strategies fit added, dropped or set otherwise, and the batch it split.
std::vector<std::string> recipe_changes(const Recipe& from, const Recipe& to, int64_t budget) {
  std::vector<std::string> out;
  auto by_plugin = [](const Recipe& r) {
    std::map<std::string, const toml::table*> m;
    for (const toml::table* t : r.array_tables("strategy"))
      m.emplace((*t)["plugin"].value_or(std::string()), t);
    return m;
  };
  const auto before = by_plugin(from), after = by_plugin(to);
  const std::string why = "to fit " + format_bytes(budget) + " with the fastest stack that does";
  for (const auto& [plugin, t] : after) {
    const auto was = before.find(plugin);
    if (was == before.end()) {
      std::string keys;
      for (const auto& [k, v] : *t)
        if (k != "plugin")
          keys += (keys.empty() ? "" : ", ") + std::string(k.str()) + " = " + toml_text(v);
      out.push_back("+ " + plugin + (keys.empty() ? "" : " (" + keys + ")") + ": " + why);
      continue;
    }
    for (const auto& [k, v] : *t) {
      const toml::node* old = was->second->get(k.str());
      if (!old || toml_text(*old) != toml_text(v))
        out.push_back("~ " + plugin + "." + std::string(k.str()) + " = " + toml_text(v) +
                      (old ? " (was " + toml_text(*old) + ")" : "") + ": " + why);
    }
  }
  for (const auto& [plugin, t] : before)
    if (!after.count(plugin)) out.push_back("- " + plugin + ": the stack written does without it");
  // A schedule fit stood in for the recipe's, and the batch it split; the
  // length and tiles --longest-context chose.
  const std::string split = "the same batch in micro-batches (a smaller one at a time, one update)";
  std::vector<std::pair<std::string, std::string>> keys = {
      {"data.batch_size", split},
      {"data.seq_len", "the longest row a stack fits in " + format_bytes(budget)},
      {"run.mlp_tile_tokens", "the feed-forward a tile of tokens at a time, for that length"}};
  if (const toml::table* s = to.table("schedule"))
    for (const auto& [k, v] : *s) keys.emplace_back("schedule." + std::string(k.str()), split);
  for (const auto& [k, why_key] : keys) {
    const std::string table = k.substr(0, k.find('.')), name = k.substr(k.find('.') + 1);
    const toml::table* a = from.table(table);
    const toml::table* b = to.table(table);
    const toml::node* x = a ? a->get(name) : nullptr;
    const toml::node* y = b ? b->get(name) : nullptr;
    if (y && (!x || toml_text(*x) != toml_text(*y)))
      out.push_back("~ " + k + " = " + toml_text(*y) + (x ? " (was " + toml_text(*x) + ")" : "") +
                    ": " + why_key);
  }
  return out;
}

// What --longest-context found, shown before the stacks that fit it.
std::string longest_context_text(const LongestContextFit& c, const Recipe& best, int64_t budget) {
  std::string tiles;
  for (int64_t t : c.tiles)
    tiles += (tiles.empty() ? "" : ", ") + (t ? std::to_string(t) : "whole");
  const toml::table* data = best.table("data");
  const int64_t batch = data ? (*data)["batch_size"].value_or(int64_t{1}) : 1;
  std::ostringstream os;
  os << "longest       " << c.tokens << " tokens a row (batch " << batch << ") within "
     << format_bytes(budget) << ", to " << kContextStep << " tokens; the feed-forward tried "
     << tiles << "\n";
  if (!c.refused.empty()) os << "refused       a longer row: " << c.refused << "\n";
  return os.str();
}

void print_stacks(const std::string& recipe_path, int64_t budget, const std::string& objective,
                  const ModelShape& shape, const MachineRates& rates,
                  const std::string& rates_source, const Planned& plain, const FitSpace& space,
                  const std::vector<Planned>& fitting, int top, const std::string& out,
                  const Recipe& base, const std::string& found) {
  const double plain_s = plain.cost.total();
  char line[512];
  std::cout << "== fit: " << recipe_path << ", budget " << format_bytes(budget) << ", objective "
            << objective << " ==\n";
  std::snprintf(
      line, sizeof line,
      "machine       %.0f GFLOP/s fp32, %.0f bf16 (matmul %lldx%lldx%lld), memory "
      "%.1f GB/s, disk %.1f GB/s warm, %.2f cold\n",
      rates.matmul_flops(shape.tokens, false) / 1e9, rates.matmul_flops(shape.tokens, true) / 1e9,
      static_cast<long long>(std::min<int64_t>(shape.tokens, 2048)),
      static_cast<long long>(shape.k), static_cast<long long>(shape.n),
      rates.memory_bytes_per_s / 1e9, rates.disk_read_warm / 1e9, rates.disk_read_cold / 1e9);
  std::cout << line;
  std::cout << "              (" << rates_source << ")\n";
  std::cout << "plain         " << plain.choice.describe() << ": "
            << format_bytes(plain.plan.tracked_peak) << " planned, " << seconds(plain_s)
            << " s/step predicted"
            << (plain.plan.budget_need() <= budget ? " (fits)" : " (does not fit)") << "\n";
  for (const auto& note : space.notes) std::cout << "note          " << note << "\n";
  std::cout << found;
  std::snprintf(line, sizeof line, "\n  %-3s %-62s %10s %9s %7s  %s\n", "#", "stack", "peak",
                "s/step", "x plain", "changes to the maths");
  std::cout << line;
  for (size_t i = 0; i < fitting.size() && i < static_cast<size_t>(top); ++i) {
    const Planned& p = fitting[i];
    std::snprintf(line, sizeof line, "  %-3zu %-62s %10s %9s %7s  %s\n", i + 1,
                  p.choice.describe().substr(0, 62).c_str(),
                  format_bytes(p.plan.tracked_peak).c_str(), seconds(p.cost.total()).c_str(),
                  ("x" + seconds(p.cost.total() / plain_s)).c_str(),
                  quality_text(p.choice).c_str());
    std::cout << line;
  }
  const Planned& best = fitting.front();
  std::cout << "\nwritten       " << out << " (" << best.choice.describe() << ")\n";
  const std::vector<std::string> changes = recipe_changes(base, best.recipe, budget);
  if (changes.empty()) std::cout << "changes       none: the recipe as it is fits\n";
  for (size_t i = 0; i < changes.size(); ++i)
    std::cout << (i ? "              " : "changes       ") << changes[i] << "\n";
  if (best.plan.safe_budget() > budget)
    std::cout << "tight         its plan fits, but within the plan's margin of error: its "
                 "safe budget is "
              << format_bytes(best.plan.safe_budget()) << " (`tightfit plan`); a run at "
              << format_bytes(budget) << " may stop out of budget\n";
}

json result_json(const std::string& recipe_path, int64_t budget, const std::string& objective,
                 const ModelShape& shape, const SearchResult& search, const std::string& out,
                 const Planned& plain, const MachineRates& rates, int top) {
  const double plain_s = plain.cost.total();
  json result = {{"recipe", recipe_path},
                 {"budget", budget},
                 {"objective", objective},
                 {"device", shape.device},
                 {"stacks", search.stacks},
                 {"planned", search.planned},
                 {"pruned", search.pruned},
                 {"refused", search.refused},
                 {"refusals", search.refusals},
                 {"written", out},
                 {"plain", choice_json(plain, plain_s)},
                 {"rates",
                  {{"fp32_flops", rates.fp32_flops.begin()->second},
                   {"bf16_flops", rates.bf16_flops.begin()->second},
                   {"memory_bytes_per_s", rates.memory_bytes_per_s},
                   {"disk_read_warm", rates.disk_read_warm},
                   {"disk_read_cold", rates.disk_read_cold},
                   {"dequant_values_per_s", rates.dequant_values_per_s}}}};
  for (size_t i = 0; i < search.fitting.size() && i < static_cast<size_t>(top); ++i)
    result["best"].push_back(choice_json(search.fitting[i], plain_s));
  return result;
}

}  // namespace

int fit_command(const std::vector<std::string>& args) {
  const po::options_description opts = fit_options();
  po::variables_map vm;
  if (!parse_command_line(args, opts, "recipe", "fit", vm)) return kUsage;
  if (vm.count("help") || !vm.count("recipe") || !vm.count("budget")) {
    if (!vm.count("help") && vm.count("recipe"))
      std::cerr << "tightfit fit: --budget is required\n";
    return print_usage(vm, opts);
  }
  const std::optional<FitOptions> o = read_fit_options(vm);
  if (!o) return kUsage;
  set_log_level("error");  // the plugins' configure messages, once per stack, are noise here
  try {
    const std::string recipe_path = vm["recipe"].as<std::string>();
    Recipe base = Recipe::load(recipe_path);
    if (vm.count("set"))
      for (const auto& s : vm["set"].as<std::vector<std::string>>()) base.apply_override(s);
    PluginRegistry registry = PluginRegistry::discover();
    const std::string out = vm.count("out") ? vm["out"].as<std::string>()
                                            : fs::path(recipe_path).stem().string() + ".fit.toml";
    {
      // The fitted recipe never replaces what the recipe reads (itself, its
      // data, weights or tokenizer): refused before the search, not after it.
      SessionOptions dry;
      dry.dry_run = true;
      const Session inputs(base, registry, dry);
      refuse_output_over_inputs(out, /*folder=*/false, "the fitted recipe");
    }
    const auto keep = split_list(vm["keep"].as<std::string>());
    auto without = split_list(vm["without"].as<std::string>());
    for (const auto& name : keep)
      if (!registry.find_any(name)) {
        std::cerr << "tightfit fit: --keep: no plugin named \"" << name << "\" is installed\n";
        return kUsage;
      }
    const auto change = split_list(vm["change"].as<std::string>());
    for (const std::string& c : change)
      if (!holds_recipes_choice(registry.find_any(c))) {
        std::cerr << "tightfit fit: --change: \"" << c
                  << "\" is not a plugin with a choice of the recipe's fit changes ("
                  << recipes_choice_plugins(registry) << "; LoRA ranks: --lora-ranks)\n";
        return kUsage;
      }
    FitSpace space =
        fit_space(base, registry, keep, without, change, o->lora_ranks, false, o->ranks);
    Recipe stripped = base;
    stripped.remove_strategies(without);

    const ModelShape shape = probe_model_shape(stripped, registry, o->ranks);
    std::vector<int64_t> rows;
    for (int m : {1, 2, 4, 8}) rows.push_back(std::max<int64_t>(1, shape.tokens / m));
    const toml::table* run = base.table("run");
    const std::string out_dir = run ? (*run)["out_dir"].value_or(std::string("runs")) : "runs";
    fs::create_directories(out_dir);
    std::string rates_source;
    const MachineRates rates = cached_machine_rates(shape.device, rows, shape.k, shape.n, out_dir,
                                                    vm.count("measure") > 0, rates_source);

    SearchResult search;
    const bool longest = vm.count("longest-context") > 0;
    LongestContextFit context;
    auto search_space = [&] {
      if (longest)
        context =
            search_longest_context(space, stripped, registry, o->ranks, rates, o->budget, search);
      else
        search_stacks(space, stripped, registry, o->ranks, rates, o->budget, search);
    };
    search_space();
    if (search.fitting.empty() && space.trains_all_weights && space.adapters_possible) {
      space = fit_space(base, registry, keep, without, change, o->lora_ranks, true, o->ranks);
      search_space();
    }
    std::cerr << "fit: " << search.stacks << " stacks: " << search.planned << " planned, "
              << search.pruned << " ruled out by a larger saving that did not fit, "
              << search.refused << " refused by the plugins; " << search.fitting.size() << " fit "
              << format_bytes(o->budget) << "\n";
    // Why, so that a plugin's refusal of what fit tried is not a mystery.
    for (const auto& [why, count] : search.refusals)
      std::cerr << "fit: " << count << " refused: " << why << "\n";
    if (search.fitting.empty() && longest) {
      std::cerr << "tightfit fit: no stack of the installed strategies fits a row of "
                << kContextStep << " tokens in " << format_bytes(o->budget)
                << (context.refused.empty() ? "" : " (" + context.refused + ")")
                << "; raise the budget or lower data.batch_size\n";
      return kOutOfBudget;
    }
    if (search.fitting.empty()) {
      std::cerr << "tightfit fit: no stack of the installed strategies fits "
                << format_bytes(o->budget);
      if (search.smallest)
        std::cerr << "; the smallest is " << search.smallest->choice.describe() << " at "
                  << format_bytes(search.smallest->plan.tracked_peak)
                  << ". Lower data.batch_size or data.seq_len, or raise the budget";
      std::cerr << "\n";
      return kOutOfBudget;
    }
    drop_settings_that_do_nothing(search.fitting);
    rank_stacks(search.fitting, o->budget, o->objective);
    // The slowdown's base: the winner's training target with no strategy.
    const FitChoice plain_stack = plain_choice(space, search.fitting.front().choice);
    // (--longest-context: at the length found, the feed-forward whole.)
    const Recipe at_length = longest ? recipe_at_length(stripped, context.tokens, 0) : stripped;
    const Planned plain = plan_recipe(apply_choice(at_length, space, plain_stack), registry,
                                      o->ranks, rates, plain_stack);

    write_winner(out, search.fitting.front(), plain.cost.total(), recipe_path,
                 vm["budget"].as<std::string>(), o->objective, longest, shape.device);
    const int top = std::max(1, vm["top"].as<int>());
    json result =
        result_json(recipe_path, o->budget, o->objective, shape, search, out, plain, rates, top);
    if (longest)
      result["longest_context"] = {{"tokens", context.tokens},
                                   {"tiles_tried", context.tiles},
                                   {"refused_longer", context.refused}};
    if (!vm.count("json"))
      print_stacks(
          recipe_path, o->budget, o->objective, shape, rates, rates_source, plain, space,
          search.fitting, top, out, base,
          longest ? longest_context_text(context, search.fitting.front().recipe, o->budget) : "");
    if (vm.count("verify"))
      verify_stacks(search.fitting, plain.cost.total(),
                    VerifyOptions{vm["verify-top"].as<int>(), vm["verify-steps"].as<int>(),
                                  vm.count("verify-spread") > 0, vm.count("json") > 0, out_dir},
                    result);
    if (vm.count("json")) std::cout << dump_json(result, 2) << "\n";
    return kOk;
  } catch (const std::exception&) {
    return report_current_error();
  }
}

}  // namespace tightfit::host
