// `tightfit fit recipe.toml --budget 8GiB [--objective speed|quality]`: finds
// the stacks of installed strategies (and their key values) whose planned
// peak fits the budget, ranks them by the step time the cost model predicts
// from this machine's measured rates (or by how little they change the
// maths, then time), prints the best and writes the winner as a recipe.
// `--verify` runs a few steps of the top stacks and compares.
#include <ATen/Parallel.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "commands.hpp"
#include "file_util.hpp"
#include "fit_search.hpp"
#include "json_input.hpp"
#include "json_output.hpp"
#include "launch.hpp"
#include "logging.hpp"
#include "machine_rates.hpp"
#include "memory_plan.hpp"
#include "plugin_loader.hpp"
#include "recipe.hpp"
#include "run_summary.hpp"
#include "session.hpp"
#include "step_cost.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using nlohmann::json;

namespace tightfit::host {

namespace {

struct Planned {
  FitChoice choice;
  Recipe recipe;
  MemoryPlan plan;
  StepCost cost;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

// What the cost model needs that the plan does not show, from the recipe.
CostOptions cost_options(const Recipe& r) {
  CostOptions o;
  if (const toml::table* p = r.strategy_table("precision"))
    o.low_precision_compute = (*p)["mode"].value_or(std::string("autocast")) == "autocast";
  if (const toml::table* off = r.strategy_table("offload"))
    o.prefetch = static_cast<int>((*off)["prefetch"].value_or(int64_t{1}));
  if (const toml::table* sh = r.strategy_table("shard")) {
    const std::string mode = (*sh)["mode"].value_or(std::string("data"));
    if (mode == "data") o.zero_stage = 0;
    if (mode == "zero") o.zero_stage = static_cast<int>((*sh)["stage"].value_or(int64_t{1}));
  }
  const toml::table* sched = r.table("schedule");
  if (sched && (*sched)["plugin"].value_or(std::string()) == "accumulate")
    o.micro_batches = (*sched)["micro_batches"].value_or(int64_t{4});
  return o;
}

// Plans `recipe` as a dry run for `ranks` ranks.
Planned plan_recipe(const Recipe& recipe, const PluginRegistry& registry, int ranks,
                    const MachineRates& rates, const FitChoice& choice) {
  SessionOptions so;
  so.dry_run = true;
  so.plan_world_size = ranks;
  Session session(recipe, registry, so);
  Planned p{choice, recipe, plan_memory(session), {}};
  p.cost = predict_step_cost(session, p.plan, rates, cost_options(recipe));
  return p;
}

// Spearman's rank correlation (average ranks for ties).
double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  auto ranks = [](const std::vector<double>& v) {
    std::vector<size_t> idx(v.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return v[x] < v[y]; });
    std::vector<double> r(v.size());
    for (size_t i = 0; i < idx.size();) {
      size_t j = i;
      while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
      for (size_t k = i; k <= j; ++k) r[idx[k]] = (static_cast<double>(i + j) / 2) + 1;
      i = j + 1;
    }
    return r;
  };
  const auto ra = ranks(a), rb = ranks(b);
  const double n = static_cast<double>(a.size());
  double ma = 0, mb = 0;
  for (size_t i = 0; i < a.size(); ++i) ma += ra[i] / n, mb += rb[i] / n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : std::nan("");
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.3f" : "%.1f", s);
  return buf;
}

std::string quality_text(const FitChoice& c) {
  const auto a = c.approximations();
  if (a.empty()) return "exact";
  std::string out = a[0];
  for (size_t i = 1; i < a.size(); ++i) out += ", " + a[i];
  return out;
}

// A run's measured peak (data left out, as `run` compares it) and median
// seconds per step after the first.
std::pair<int64_t, double> measured(const fs::path& metrics) {
  const json r = summarize(metrics);
  const int64_t peak = static_cast<int64_t>(r["peak_bytes"]["total"].get<double>() -
                                            r["peak_bytes"]["other"].get<double>());
  const auto elapsed = r["curve"]["elapsed_s"].get<std::vector<double>>();
  std::vector<double> steps;
  for (size_t i = 1; i < elapsed.size(); ++i) steps.push_back(elapsed[i] - elapsed[i - 1]);
  if (steps.empty()) return {peak, std::nan("")};
  std::sort(steps.begin(), steps.end());
  return {peak, steps[steps.size() / 2]};
}

json rates_json(const MachineRates& r) {
  json j = {{"device", r.device},
            {"threads", r.threads},
            {"memory_bytes_per_s", r.memory_bytes_per_s},
            {"activation_fp32_bytes_per_s", r.activation_fp32_bytes_per_s},
            {"activation_bf16_bytes_per_s", r.activation_bf16_bytes_per_s},
            {"host_link_bytes_per_s", r.host_link_bytes_per_s},
            {"disk_read_warm", r.disk_read_warm},
            {"disk_read_cold", r.disk_read_cold},
            {"disk_write", r.disk_write},
            {"dequant_values_per_s", r.dequant_values_per_s}};
  for (const auto& [rows, f] : r.fp32_flops) j["fp32_flops"][std::to_string(rows)] = f;
  for (const auto& [rows, f] : r.bf16_flops) j["bf16_flops"][std::to_string(rows)] = f;
  return j;
}

MachineRates rates_from_json(const json& j) {
  MachineRates r;
  r.device = j.at("device").get<std::string>();
  r.threads = j.at("threads").get<int>();
  r.memory_bytes_per_s = j.at("memory_bytes_per_s").get<double>();
  r.activation_fp32_bytes_per_s = j.at("activation_fp32_bytes_per_s").get<double>();
  r.activation_bf16_bytes_per_s = j.at("activation_bf16_bytes_per_s").get<double>();
  r.host_link_bytes_per_s = j.at("host_link_bytes_per_s").get<double>();
  r.disk_read_warm = j.at("disk_read_warm").get<double>();
  r.disk_read_cold = j.at("disk_read_cold").get<double>();
  r.disk_write = j.at("disk_write").get<double>();
  r.dequant_values_per_s = j.at("dequant_values_per_s").get<double>();
  for (const auto& [rows, f] : j.at("fp32_flops").items()) r.fp32_flops[std::stoll(rows)] = f;
  for (const auto& [rows, f] : j.at("bf16_flops").items()) r.bf16_flops[std::stoll(rows)] = f;
  return r;
}

// Where measured rates are kept between calls: $TIGHTFIT_CACHE_DIR, else
// $XDG_CACHE_HOME/tightfit, else ~/.cache/tightfit ("" when none is known).
fs::path rates_cache_file() {
  if (const char* d = std::getenv("TIGHTFIT_CACHE_DIR"); d && *d) return fs::path(d) / "rates.json";
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d)
    return fs::path(d) / "tightfit" / "rates.json";
  if (const char* h = std::getenv("HOME"); h && *h)
    return fs::path(h) / ".cache" / "tightfit" / "rates.json";
  return {};
}

// This machine's rates for these shapes: from the cache when measured
// before (the same device, threads, shapes and disk), else measured now and
// kept — the same numbers for every fit, so rankings do not move with
// timing noise. `remeasure` measures again.
MachineRates machine_rates(const std::string& device, const std::vector<int64_t>& rows, int64_t k,
                           int64_t n, const std::string& scratch, bool remeasure,
                           std::string& source) {
  struct stat st {};
  ::stat(scratch.c_str(), &st);
  std::ostringstream key;
  key << device << "|threads " << at::get_num_threads() << "|k " << k << "|n " << n << "|disk "
      << st.st_dev << "|rows";
  for (int64_t r : rows) key << " " << r;
  const fs::path file = rates_cache_file();
  json cache = json::object();
  if (!file.empty() && fs::exists(file)) {
    try {
      cache = read_json_file(file.string(), size_t{64} << 20);
    } catch (const std::exception&) {
      cache = json::object();  // a damaged cache is measured again and rewritten
    }
  }
  if (!remeasure && cache.contains(key.str())) {
    try {
      MachineRates r = rates_from_json(cache[key.str()]["rates"]);
      r.ram_available = available_ram();
      source = "measured " + cache[key.str()].value("when", std::string("earlier")) + ", " +
               file.string() + "; --measure to redo";
      return r;
    } catch (const std::exception&) {
    }
  }
  std::cerr << "fit: measuring this machine (matmul, memory, disk) ..." << std::flush;
  MachineRates r;
  try {
    r = measure_machine_rates(at::Device(device), rows, k, n, scratch);
  } catch (const std::exception&) {
    std::cerr << " failed\n";
    throw;
  }
  std::cerr << " done\n";
  source = "measured now";
  if (!file.empty()) {
    char when[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M", std::localtime(&now));
    cache[key.str()] = {{"when", when}, {"rates", rates_json(r)}};
    try {
      fs::create_directories(file.parent_path());
      const std::string tmp = file.string() + ".tmp";
      write_file_synced(tmp, dump_json(cache, 2));
      fs::rename(tmp, file);
      source += ", kept in " + file.string();
    } catch (const std::exception&) {
      source += " (the cache " + file.string() + " could not be written)";
    }
  }
  return r;
}

json choice_json(const Planned& p, double plain_s) {
  return {{"stack", p.choice.describe()},
          {"planned_peak", p.plan.tracked_peak},
          {"predicted_step_s", p.cost.total()},
          {"slowdown", plain_s > 0 ? p.cost.total() / plain_s : 0},
          {"quality", quality_text(p.choice)},
          {"quality_penalty", p.choice.quality_penalty()},
          {"cost",
           {{"matmul", p.cost.matmul},
            {"recompute", p.cost.recompute},
            {"memory", p.cost.memory},
            {"dequant", p.cost.dequant},
            {"transfer", p.cost.transfer},
            {"update", p.cost.update}}}};
}

}  // namespace

int fit_command(const std::vector<std::string>& args) {
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
      "lora-ranks", po::value<std::string>()->default_value("8,16,64"),
      "LoRA ranks to try (LoRA trains an adapter instead of the weights; --without lora to keep "
      "training all weights)")("set", po::value<std::vector<std::string>>()->composing(),
                               "override a recipe key before the search")(
      "json", "print the result as JSON")(
      "measure", "measure this machine's rates again instead of using the cached ones")(
      "verify", "run the top stacks for a few steps and compare predicted with measured")(
      "verify-top", po::value<int>()->default_value(3), "stacks --verify runs")(
      "verify-spread",
      "verify stacks spread over the whole ranking, not the top ones (tests the cost model's "
      "order)")("verify-steps", po::value<int>()->default_value(4), "steps of each --verify run");
  po::variables_map vm;
  if (!parse_command_line(args, opts, "recipe", "fit", vm)) return kUsage;
  if (vm.count("help") || !vm.count("recipe") || !vm.count("budget")) {
    if (!vm.count("help") && vm.count("recipe"))
      std::cerr << "tightfit fit: --budget is required\n";
    return print_usage(vm, opts);
  }
  const std::string objective = vm["objective"].as<std::string>();
  if (objective != "speed" && objective != "quality") {
    std::cerr << "tightfit fit: --objective is speed or quality, not \"" << objective << "\"\n";
    return kUsage;
  }
  int64_t budget = 0;
  try {
    budget = parse_byte_size(vm["budget"].as<std::string>());
  } catch (const std::invalid_argument& e) {
    std::cerr << "tightfit fit: --budget: " << e.what() << "\n";
    return kUsage;
  }
  std::vector<int> lora_ranks;
  for (const auto& s : split_list(vm["lora-ranks"].as<std::string>())) {
    try {
      lora_ranks.push_back(std::stoi(s));
    } catch (const std::exception&) {
      lora_ranks.push_back(0);
    }
    if (lora_ranks.back() < 1) {
      std::cerr << "tightfit fit: --lora-ranks: \"" << s << "\" is not a rank (1, 2, ...)\n";
      return kUsage;
    }
  }
  const int ranks = vm["ranks"].as<int>();
  set_log_level("error");  // the plugins' configure messages, once per stack, are noise here
  try {
    const std::string recipe_path = vm["recipe"].as<std::string>();
    Recipe base = Recipe::load(recipe_path);
    if (vm.count("set"))
      for (const auto& s : vm["set"].as<std::vector<std::string>>()) base.apply_override(s);
    PluginRegistry registry = PluginRegistry::discover();
    const auto keep = split_list(vm["keep"].as<std::string>());
    auto without = split_list(vm["without"].as<std::string>());
    for (const auto& name : keep)
      if (!registry.find_any(name)) {
        std::cerr << "tightfit fit: --keep: no plugin named \"" << name << "\" is installed\n";
        return kUsage;
      }
    FitSpace space = fit_space(base, registry, keep, without, lora_ranks, false, ranks);
    Recipe stripped = base;
    stripped.remove_strategies(without);

    // The machine's rates at the model's shapes: the largest block matrix
    // and the tokens of each micro-batch size searched.
    SessionOptions so;
    so.dry_run = true;
    so.plan_world_size = ranks;
    int64_t k = 512, n = 2048, tokens = 1;
    std::string device = "cpu";
    {
      Session probe(stripped, registry, so);
      tokens = probe.env().run_info.batch_size * probe.env().run_info.seq_len;
      int64_t largest = 0;
      for (const Param& p : probe.store().all())
        if (p.stage >= 0 &&
            probe.executor().stages()[static_cast<size_t>(p.stage)].kind == TF_STAGE_BLOCK &&
            p.shape.size() == 2 && p.numel() > largest) {
          largest = p.numel();
          n = p.shape[0];
          k = p.shape[1];
        }
      device = probe.env().device.str();
    }
    std::vector<int64_t> rows;
    for (int m : {1, 2, 4, 8}) rows.push_back(std::max<int64_t>(1, tokens / m));
    const toml::table* run = base.table("run");
    const std::string out_dir = run ? (*run)["out_dir"].value_or(std::string("runs")) : "runs";
    fs::create_directories(out_dir);
    std::string rates_source;
    const MachineRates rates =
        machine_rates(device, rows, k, n, out_dir, vm.count("measure") > 0, rates_source);

    // The search: the most memory-saving stacks first, so that one that does
    // not fit rules out every stack saving no more on any knob.
    std::vector<Planned> fitting;
    std::optional<Planned> smallest;
    size_t n_choices = 0;
    int pruned = 0, invalid = 0, planned = 0;
    auto search = [&](const FitSpace& sp) {
      const std::vector<FitChoice> choices = enumerate_choices(sp);
      n_choices += choices.size();
      std::vector<FitChoice> too_big;
      for (const FitChoice& c : choices) {
        if (std::any_of(too_big.begin(), too_big.end(),
                        [&](const FitChoice& f) { return c.saves_no_more_than(f); })) {
          ++pruned;
          continue;
        }
        std::optional<Planned> p;
        try {
          p = plan_recipe(apply_choice(stripped, sp, c), registry, ranks, rates, c);
        } catch (const std::exception&) {  // a combination the plugins refuse
          ++invalid;
          continue;
        }
        ++planned;
        if (!smallest || p->plan.tracked_peak < smallest->plan.tracked_peak) smallest = *p;
        if (p->plan.budget_need() > budget)
          too_big.push_back(c);
        else
          fitting.push_back(std::move(*p));
      }
    };
    search(space);
    const bool searchable_lora =
        std::find(space.searched.begin(), space.searched.end(), "lora") != space.searched.end();
    if (fitting.empty() && space.allow_full && searchable_lora) {
      space = fit_space(base, registry, keep, without, lora_ranks, true, ranks);
      search(space);
    }
    std::cerr << "fit: " << n_choices << " stacks: " << planned << " planned, " << pruned
              << " ruled out by a larger saving that did not fit, " << invalid
              << " refused by the plugins; " << fitting.size() << " fit " << format_bytes(budget)
              << "\n";
    if (fitting.empty()) {
      std::cerr << "tightfit fit: no stack of the installed strategies fits "
                << format_bytes(budget);
      if (smallest)
        std::cerr << "; the smallest is " << smallest->choice.describe() << " at "
                  << format_bytes(smallest->plan.tracked_peak)
                  << ". Lower data.batch_size or data.seq_len, or raise the budget";
      std::cerr << "\n";
      return kOutOfBudget;
    }
    // A stack whose safe budget (plan + margin of error) fits comes before
    // any that fits only by its plan: "fits" must not be followed by an
    // out-of-budget stop (a 30B QLoRA at 4 GiB, plan 3.8 GiB, stopped in its
    // second step when the fastest tight stack was picked). Times within 2%
    // are a tie (the model is not finer than that): the simpler stack wins,
    // then the more exact, then the smaller.
    auto time_bucket = [](const Planned& p) {
      return std::llround(std::log(std::max(p.cost.total(), 1e-9)) / std::log(1.02));
    };
    auto tight = [&](const Planned& p) { return p.plan.safe_budget() > budget; };
    std::stable_sort(fitting.begin(), fitting.end(), [&](const Planned& a, const Planned& b) {
      if (tight(a) != tight(b)) return !tight(a);
      const double qa = std::round(a.choice.quality_penalty() * 100),
                   qb = std::round(b.choice.quality_penalty() * 100);
      if (objective == "quality" && qa != qb) return qa < qb;
      if (time_bucket(a) != time_bucket(b)) return time_bucket(a) < time_bucket(b);
      if (a.choice.strategies() != b.choice.strategies())
        return a.choice.strategies() < b.choice.strategies();
      if (qa != qb) return qa < qb;
      return a.plan.tracked_peak < b.plan.tracked_peak;
    });
    // The slowdown's base: the winner's training target with no strategy.
    const FitChoice plain_choice = fitting.front().choice.plain();
    const Planned plain = plan_recipe(apply_choice(stripped, space, plain_choice), registry, ranks,
                                      rates, plain_choice);
    const double plain_s = plain.cost.total();

    const std::string out = vm.count("out") ? vm["out"].as<std::string>()
                                            : fs::path(recipe_path).stem().string() + ".fit.toml";
    const Planned& best = fitting.front();
    {
      std::ostringstream text;
      text << "# Written by `tightfit fit " << recipe_path << " --budget "
           << vm["budget"].as<std::string>() << " --objective " << objective << "`:\n# "
           << best.choice.describe() << "; planned peak " << format_bytes(best.plan.tracked_peak)
           << ", predicted " << seconds(best.cost.total()) << " s/step (x"
           << seconds(best.cost.total() / plain_s) << " of the plain recipe) on " << device
           << ".\n\n"
           << best.recipe.to_toml() << "\n";
      write_file_synced(out, text.str());  // whole or not at all; a planted link is replaced
    }

    json result = {{"recipe", recipe_path},
                   {"budget", budget},
                   {"objective", objective},
                   {"device", device},
                   {"stacks", n_choices},
                   {"planned", planned},
                   {"pruned", pruned},
                   {"refused", invalid},
                   {"written", out},
                   {"plain", choice_json(plain, plain_s)},
                   {"rates",
                    {{"fp32_flops", rates.fp32_flops.begin()->second},
                     {"bf16_flops", rates.bf16_flops.begin()->second},
                     {"memory_bytes_per_s", rates.memory_bytes_per_s},
                     {"disk_read_warm", rates.disk_read_warm},
                     {"disk_read_cold", rates.disk_read_cold},
                     {"dequant_values_per_s", rates.dequant_values_per_s}}}};
    const int top = std::max(1, vm["top"].as<int>());
    for (size_t i = 0; i < fitting.size() && i < static_cast<size_t>(top); ++i)
      result["best"].push_back(choice_json(fitting[i], plain_s));

    if (!vm.count("json")) {
      char line[512];
      std::cout << "== fit: " << recipe_path << ", budget " << format_bytes(budget)
                << ", objective " << objective << " ==\n";
      std::snprintf(line, sizeof line,
                    "machine       %.0f GFLOP/s fp32, %.0f bf16 (matmul %lldx%lldx%lld), memory "
                    "%.1f GB/s, disk %.1f GB/s warm, %.2f cold\n",
                    rates.matmul_flops(tokens, false) / 1e9, rates.matmul_flops(tokens, true) / 1e9,
                    static_cast<long long>(std::min<int64_t>(tokens, 2048)),
                    static_cast<long long>(k), static_cast<long long>(n),
                    rates.memory_bytes_per_s / 1e9, rates.disk_read_warm / 1e9,
                    rates.disk_read_cold / 1e9);
      std::cout << line;
      std::cout << "              (" << rates_source << ")\n";
      std::cout << "plain         " << plain_choice.describe() << ": "
                << format_bytes(plain.plan.tracked_peak) << " planned, " << seconds(plain_s)
                << " s/step predicted"
                << (plain.plan.budget_need() <= budget ? " (fits)" : " (does not fit)") << "\n";
      for (const auto& note : space.notes) std::cout << "note          " << note << "\n";
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
      std::cout << "\nwritten       " << out << " (" << best.choice.describe() << ")\n";
      if (best.plan.safe_budget() > budget)
        std::cout << "tight         its plan fits, but within the plan's margin of error: its "
                     "safe budget is "
                  << format_bytes(best.plan.safe_budget()) << " (`tightfit plan`); a run at "
                  << format_bytes(budget) << " may stop out of budget\n";
    }

    if (vm.count("verify")) {
      const int n_verify =
          std::min<int>(vm["verify-top"].as<int>(), static_cast<int>(fitting.size()));
      const int steps = std::max(2, vm["verify-steps"].as<int>());
      const fs::path dir = fs::path(out_dir) / "fit-verify";
      fs::create_directories(dir);
      std::vector<double> predicted_s, measured_s;
      json verified = json::array();
      if (!vm.count("json")) std::cout << "\nverify: " << steps << " steps of each\n";
      char line[512];
      if (!vm.count("json")) {
        std::snprintf(line, sizeof line, "  %-3s %-44s %10s %10s %7s %9s %9s %7s\n", "#", "stack",
                      "planned", "measured", "error", "pred s", "meas s", "error");
        std::cout << line;
      }
      std::vector<size_t> picks;
      for (int i = 0; i < n_verify; ++i)
        picks.push_back(!vm.count("verify-spread") || n_verify < 2
                            ? static_cast<size_t>(i)
                            : static_cast<size_t>(std::llround(
                                  static_cast<double>(i) * static_cast<double>(fitting.size() - 1) /
                                  (n_verify - 1))));
      picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
      for (size_t pi = 0; pi < picks.size(); ++pi) {
        const size_t i = picks[pi];
        const Planned& p = fitting[i];
        const std::string name = "verify-" + std::to_string(i + 1);
        const fs::path recipe_file = dir / (name + ".toml");
        write_file_synced(recipe_file.string(), p.recipe.to_toml());
        std::vector<std::string> a = {"run", recipe_file.string(), "-q"};
        for (const std::string& s :
             {"run.steps=" + std::to_string(steps), "run.out_dir=" + dir.string(),
              "run.name=" + name, std::string("run.sample_tokens=0"),
              std::string("run.eval_interval=0"), std::string("save.every=0"),
              std::string("save.final=false"), std::string("run.memory_budget=0")})
          a.insert(a.end(), {"--set", s});
        const std::string log = (dir / (name + ".log")).string();
        const int rc = run_self(a, log);
        json v = choice_json(p, plain_s);
        if (rc != 0) {
          v["failed"] = true;
          v["log"] = log;
          if (!vm.count("json"))
            std::cout << "  " << i + 1 << "   " << p.choice.describe() << ": the run failed (exit "
                      << rc << "; " << log << ")\n";
          verified.push_back(v);
          continue;
        }
        const auto [peak, step_s] = measured(dir / name / "metrics.jsonl");
        v["measured_peak"] = peak;
        v["measured_step_s"] = step_s;
        predicted_s.push_back(p.cost.total());
        measured_s.push_back(step_s);
        verified.push_back(v);
        if (!vm.count("json")) {
          std::snprintf(line, sizeof line, "  %-3zu %-44s %10s %10s %+6.1f%% %9s %9s %+6.0f%%\n",
                        i + 1, p.choice.describe().substr(0, 44).c_str(),
                        format_bytes(p.plan.tracked_peak).c_str(), format_bytes(peak).c_str(),
                        100.0 * static_cast<double>(p.plan.tracked_peak - peak) /
                            static_cast<double>(std::max<int64_t>(peak, 1)),
                        seconds(p.cost.total()).c_str(), seconds(step_s).c_str(),
                        100.0 * (p.cost.total() - step_s) / step_s);
          std::cout << line;
        }
      }
      result["verify"] = verified;
      if (predicted_s.size() >= 2) {
        const double rho = spearman(predicted_s, measured_s);
        result["verify_rank_correlation"] = rho;
        if (!vm.count("json"))
          std::cout << "rank correlation of predicted and measured step time (Spearman): "
                    << seconds(rho) << " over " << predicted_s.size() << " stacks\n";
      }
    }
    if (vm.count("json")) std::cout << dump_json(result, 2) << "\n";
    return kOk;
  } catch (const std::exception&) {
    return report_current_error();
  }
}

}  // namespace tightfit::host
