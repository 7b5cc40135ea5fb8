// `tightfit plan recipe.toml [--budget 16GiB] [--json]`: the memory a
// recipe's training step will hold, by category and tier, before anything is
// allocated (the recipe is composed as `run --dry-run` does).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.hpp"
#include "gpu_table.hpp"
#include "logging.hpp"
#include "longest_length.hpp"
#include "machine_rates.hpp"
#include "memory_plan.hpp"
#include "plugin_loader.hpp"
#include "recipe.hpp"
#include "session.hpp"

namespace po = boost::program_options;

namespace tightfit::host {

namespace {

constexpr tf_mem_category kOrder[] = {TF_MEM_WEIGHTS,     TF_MEM_GRADS,    TF_MEM_OPTIMIZER,
                                      TF_MEM_ACTIVATIONS, TF_MEM_ADAPTERS, TF_MEM_TRANSIENT};
constexpr const char* kTierNames[] = {"device", "host", "disk", "sharded"};

nlohmann::json plan_json(const MemoryPlan& p) {
  nlohmann::json j;
  j["device_peak"] = p.device_peak;
  j["tracked_peak"] = p.tracked_peak;
  j["peak_moment"] = p.peak_moment;
  j["host_bytes"] = p.host_bytes;
  j["disk_bytes"] = p.disk_bytes;
  j["time_factor"] = p.time_factor;
  j["host_overhead"] = p.host_overhead;
  j["block_cache"] = p.block_cache;
  j["safe_budget"] = p.safe_budget();
  j["n_params"] = p.n_params;
  j["n_trainable"] = p.n_trainable;
  for (int t = 0; t < TF_TIER_COUNT; ++t)
    for (tf_mem_category c : kOrder)
      j["at_peak"][kTierNames[t]][category_name(c)] = p.at_peak[static_cast<size_t>(t)][c];
  for (tf_mem_category c : kOrder)
    j["category_peaks"][category_name(c)] = p.device_peak_by_category[c];
  j["unestimated"] = p.unestimated;
  if (p.generation.rows > 0)
    j["generation"] = {{"rows", p.generation.rows},
                       {"prompt_tokens", p.generation.prompt_tokens},
                       {"new_tokens", p.generation.new_tokens},
                       {"prefill_rows", p.generation.prefill_rows},
                       {"incremental", p.generation.incremental},
                       {"cache", p.generation.cache},
                       {"workspace", p.generation.workspace}};
  if (p.routed.any())
    j["routed_reads"] = {{"weights", p.routed.weights},
                         {"bytes", p.routed.bytes},
                         {"used_per_pass", p.routed.used_per_pass},
                         {"most_used_per_pass", p.routed.most_used_per_pass},
                         {"reads_per_pass", p.routed.reads_per_pass},
                         {"bytes_per_pass", p.routed.bytes_per_pass}};
  j["activation_share_at_peak"] = p.activation_share_at_peak;
  for (const auto& c : p.contributions) {
    nlohmann::json e{
        {"plugin", c.plugin}, {"estimated", c.estimated}, {"time_factor", c.time_factor}};
    if (c.update_bytes > 0) e["update_bytes"] = c.update_bytes;
    if (c.recompute_inputs_tier != TF_TIER_DEVICE)
      e["recompute_inputs_tier"] = kTierNames[c.recompute_inputs_tier];
    for (int t = 0; t < TF_TIER_COUNT; ++t)
      for (tf_mem_category k : kOrder)
        if (c.delta[static_cast<size_t>(t)][k] != 0)
          e["delta"][kTierNames[t]][category_name(k)] = c.delta[static_cast<size_t>(t)][k];
    j["contributions"].push_back(e);
  }
  return j;
}

// Which precision is fast on this CPU, measured now at the recipe's rows:
// some CPUs compute bf16 natively (AVX-512 BF16, AMX) and some emulate it at
// several times fp32's time, which decides whether a 16-bit stack saves time
// as well as memory (`tightfit fit` prices stacks from the same rates).
void print_cpu_precision_speed(int64_t rows) {
  const int64_t m = std::max<int64_t>(rows, 1);
  const MatmulRates r = measure_matmul_rates(at::Device(at::kCPU), {m}, 1024, 1024);
  const double fp32 = r.fp32_flops.at(m), bf16 = r.bf16_flops.at(m);
  if (!(fp32 > 0) || !(bf16 > 0)) return;
  // Rounded as printed, so that the figure and the verdict agree.
  const double time_ratio = std::round(fp32 / bf16 * 100) / 100;
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.2f", time_ratio);
  std::cout << "precision     a bf16 matmul takes " << ratio
            << "x the time of an fp32 one on this CPU (" << std::min<int64_t>(m, 2048)
            << " x 1024 x 1024, measured now): "
            << (time_ratio <= 0.9   ? "16-bit compute (precision) saves time here as well as memory"
                : time_ratio <= 1.5 ? "16-bit compute saves memory here, not time"
                                    : "this CPU emulates bf16: 16-bit compute saves memory and "
                                      "costs time here")
            << "\n";
}

// `budget_from`: "--budget" or "run.memory_budget", named beside the verdict.
void print_plan(const std::string& source, const MemoryPlan& p, int64_t budget,
                const char* budget_from) {
  std::cout << "== plan: " << source << " ==\n";
  std::cout << "model         " << p.n_params << " parameters (" << p.n_trainable
            << " trainable), batch " << p.batch_size << " x " << p.seq_len << " tokens\n";
  std::cout << "device peak   " << format_bytes(p.device_peak) << " (in the " << p.peak_moment
            << "; the corpus and batches are not in it)\n";
  std::cout << "by category   " << describe_device_peak(p) << "\n";
  if (const GenerationPlan& g = p.generation; g.rows > 0)
    std::cout << "generation    " << g.rows << " rows x (" << g.prompt_tokens << " prompt + "
              << g.new_tokens << " new tokens)"
              << (g.prefill_rows < g.rows
                      ? (g.prefill_rows == 1 ? std::string(" (one prompt, prefilled once)")
                                             : " (" + std::to_string(g.prefill_rows) +
                                                   " prompts, each prefilled once)")
                      : std::string())
              << ": "
              << (g.incremental ? "decode cache " + format_bytes(g.cache) + ", workspace "
                                : std::string("no decode cache (each token recomputes the "
                                              "context), workspace "))
              << format_bytes(g.workspace) << ", beside the weights and optimizer state\n";
  if (p.host_bytes > 0) std::cout << "host tier     " << format_bytes(p.host_bytes) << "\n";
  if (p.disk_bytes > 0) std::cout << "disk tier     " << format_bytes(p.disk_bytes) << "\n";
  if (p.routed.any()) {
    // Read when routed to, not with their stage: what a pass costs the tier.
    char used[64], most[64], reads[64];
    std::snprintf(used, sizeof used, "%.1f", p.routed.used_per_pass);
    std::snprintf(most, sizeof most, "%.0f", p.routed.most_used_per_pass);
    std::snprintf(reads, sizeof reads, "%.1f", p.routed.reads_per_pass);
    std::cout << "experts read  " << used << " of the " << p.routed.weights
              << " expert weights in a tier (" << format_bytes(p.routed.bytes)
              << ") used by a pass of " << p.batch_size * p.seq_len << " tokens (at most " << most
              << "), " << reads << " reads a pass ("
              << format_bytes(static_cast<int64_t>(p.routed.bytes_per_pass))
              << ": forward, backward and a recompute each read), if the router chooses each "
                 "token's experts evenly and independently\n";
  }
  for (const auto& c : p.contributions) {
    if (!c.estimated) continue;
    std::ostringstream os;
    for (int t = 0; t < TF_TIER_COUNT; ++t)
      for (tf_mem_category k : kOrder) {
        const int64_t v = c.delta[static_cast<size_t>(t)][k];
        if (v == 0) continue;
        os << " " << category_name(k) << (t == 0 ? "" : std::string("@") + kTierNames[t]) << " "
           << (v > 0 ? "+" : "-") << format_bytes(v > 0 ? v : -v);
        // Against every stage's activations: where stages are recomputed,
        // the peak holds only its share (the rest is inside their reruns).
        if (t == TF_TIER_DEVICE && k == TF_MEM_ACTIVATIONS && p.activation_share_at_peak < 0.995)
          os << " (" << (v > 0 ? "+" : "-")
             << format_bytes(static_cast<int64_t>(std::abs(static_cast<double>(v)) *
                                                  p.activation_share_at_peak))
             << " at the peak; the rest is in recomputed stages' working sets)";
      }
    if (c.update_bytes > 0) os << " during the update +" << format_bytes(c.update_bytes);
    if (c.recompute_inputs_tier != TF_TIER_DEVICE)
      os << " recomputed stages' inputs@" << kTierNames[c.recompute_inputs_tier];
    if (c.time_factor > 0) os << " time x" << c.time_factor;
    std::cout << "  " << c.plugin << ":" << (os.str().empty() ? " no change" : os.str()) << "\n";
  }
  for (const auto& name : p.unestimated)
    std::cout << "  " << name
              << ": has no estimate_memory hook; its effect is NOT in this plan (ask its author)\n";
  if (p.time_factor != 1)
    std::cout << "step time     x" << p.time_factor << " of the plain recipe\n";
  if (p.host_overhead > 0)
    std::cout << "host process  + about " << format_bytes(p.host_overhead)
              << " resident beyond the tracked bytes: libraries and runtime (this process now, "
                 "composed, nothing allocated)"
              << (p.disk_bytes > 0 ? ", plus the page cache of disk-tier reads" : "")
              << (p.block_cache > 0 ? ", plus up to " + format_bytes(p.block_cache) +
                                          " of freed blocks kept for reuse (run.cpu_block_cache)"
                                    : "")
              << (p.process_scope ? "; counted in the budget (memory_budget_scope = \"process\")"
                                  : "")
              << ". `tightfit run` reports the measured split\n";
  std::cout << "safe budget   " << format_bytes(p.safe_budget())
            << ": no step should pass it (the plan + "
            << static_cast<int>(MemoryPlan::kPlanMargin * 100)
            << "%, its largest measured miss rounded up; the corpus's tokens come on top)\n";
  if (budget > 0) {
    const int64_t room = budget - p.budget_need();
    std::cout << "budget        " << format_bytes(budget) << " (" << budget_from << "): "
              << (budget >= p.safe_budget() ? "fits, " + format_bytes(room) + " to spare"
                  : room >= 0               ? "tight: the plan fits with " + format_bytes(room) +
                                    " to spare, but within its margin of error; a run may stop "
                                    "out of budget (the safe budget is " +
                                    format_bytes(p.safe_budget()) + ")"
                              : "does NOT fit, " + format_bytes(-room) + " over")
              << "\n";
  }
}

// --gpus NAMES: the named models (all for "all"); false, with the known
// names printed, for a name it does not know.
bool select_gpus(const std::string& list, std::vector<GpuModel>& out) {
  if (list == "all") {
    out = gpu_models();
    return true;
  }
  std::stringstream ss(list);
  for (std::string name; std::getline(ss, name, ',');) {
    bool found = false;
    for (const GpuModel& g : gpu_models())
      if (name == g.name) {
        out.push_back(g);
        found = true;
      }
    if (!found) {
      std::cerr << "tightfit plan: --gpus: unknown GPU \"" << name << "\"; known:";
      for (const GpuModel& g : gpu_models()) std::cerr << " " << g.name;
      std::cerr << " (or all)\n";
      return false;
    }
  }
  return true;
}

// The device peak with one key of the recipe set to `value` (data.batch_size,
// data.seq_len): the recipe planned again.
int64_t peak_with(const Recipe& base, const PluginRegistry& registry, const std::string& key,
                  int64_t value) {
  Recipe r = base;
  r.apply_override(key + "=" + std::to_string(value));
  SessionOptions so;
  so.dry_run = true;
  Session session(r, registry, so);
  return plan_memory(session.parts()).device_peak;
}

// What a token of context costs: the peak is about fixed + per_token x
// seq_len, the slope taken against the plan at half the recipe's length
// (attention's and the tiles' parts are not all linear, so it is the slope
// there, not everywhere).
void print_context_cost(const Recipe& recipe, const PluginRegistry& registry, const MemoryPlan& p) {
  if (p.pass_rows > 0 || p.seq_len < 2) return;  // a schedule's own pass shape: not data.seq_len
  const int64_t half = p.seq_len / 2;
  int64_t at_half = 0;
  try {
    at_half = peak_with(recipe, registry, "data.seq_len", half);
  } catch (const RecipeError&) {
    return;  // the recipe has no shorter form (a preference schedule's prompt length)
  }
  const int64_t per_token = (p.device_peak - at_half) / std::max<int64_t>(p.seq_len - half, 1);
  const int64_t fixed = p.device_peak - per_token * p.seq_len;
  std::cout << "per token     " << format_bytes(per_token) << " a token of seq_len (batch "
            << p.batch_size << "; the slope from " << half << " to " << p.seq_len
            << " tokens), fixed " << format_bytes(fixed) << "\n";
}

// The longest data.seq_len whose plan fits `bytes`, to a multiple of 256
// tokens past 256 (0: not even 256 does), and what stopped the search
// beyond it when the recipe refused a length (the model's positions).
struct LongestContext {
  int64_t tokens = 0;
  std::string refused;
};
LongestContext longest_context(const Recipe& recipe, const PluginRegistry& registry,
                               int64_t bytes) {
  LongestContext out;
  auto fits = [&](int64_t tokens) {
    try {
      return peak_with(recipe, registry, "data.seq_len", tokens) <= bytes;
    } catch (const RecipeError& e) {
      out.refused = e.what();
      return false;
    }
  };
  out.tokens = longest_length(fits, kContextStep, kLongestContext);
  return out;
}

// The largest batch size whose plan fits `bytes` (0 when not even 1 does):
// doubling, then bisection, planning the recipe again at each size.
int64_t largest_batch(const Recipe& recipe, const PluginRegistry& registry, int64_t bytes) {
  if (peak_with(recipe, registry, "data.batch_size", 1) > bytes) return 0;
  int64_t fits = 1, fails = 2;
  while (fails <= (1 << 16) && peak_with(recipe, registry, "data.batch_size", fails) <= bytes) {
    fits = fails;
    fails *= 2;
  }
  if (fails > (1 << 16)) return fits;
  while (fails - fits > 1) {
    const int64_t mid = (fits + fails) / 2;
    (peak_with(recipe, registry, "data.batch_size", mid) <= bytes ? fits : fails) = mid;
  }
  return fits;
}

void print_gpu_table(const Recipe& recipe, const PluginRegistry& registry, const MemoryPlan& plan,
                     const std::vector<GpuModel>& gpus) {
  std::cout << "\nGPU fit (device tier; usable = memory less 5% and 0.5 GiB for the CUDA context "
               "and allocator):\n";
  char line[160];
  std::snprintf(line, sizeof line, "  %-15s %10s %6s %12s %12s\n", "GPU", "usable", "fits",
                "headroom", "max batch");
  std::cout << line;
  for (const GpuModel& g : gpus) {
    const int64_t usable = usable_bytes(g);
    const int64_t room = usable - plan.device_peak;
    const int64_t batch = largest_batch(recipe, registry, usable);
    const std::string headroom = (room >= 0 ? "+" : "-") + format_bytes(room >= 0 ? room : -room);
    const std::string max_batch = batch > 0 ? std::to_string(batch) : "none";
    std::snprintf(line, sizeof line, "  %-15s %10s %6s %12s %12s\n", g.label,
                  format_bytes(usable).c_str(), room >= 0 ? "yes" : "no", headroom.c_str(),
                  max_batch.c_str());
    std::cout << line;
  }
}

}  // namespace

int plan_command(const std::vector<std::string>& args) {
  po::options_description opts("tightfit plan recipe.toml [options]");
  opts.add_options()("help,h", "show this help")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a recipe key")(
      "add-strategy", po::value<std::vector<std::string>>()->composing(),
      "append a [[strategy]] with this plugin, as tightfit run does (before --set, which can then "
      "set its keys as strategy.NAME.key)")("budget", po::value<std::string>(),
                                            "a memory budget to check the plan against, e.g. 8GiB")(
      "json", "print the plan as JSON")(
      "longest-context",
      "the longest data.seq_len whose plan fits the budget (--budget, else run.memory_budget), "
      "to 256 tokens, planned again at each length")(
      "ranks", po::value<int>()->default_value(0),
      "plan one rank of this many (default: the launch environment's world size)")(
      "gpus", po::value<std::string>()->implicit_value("all"),
      "the fit table for GPUs: all, or a comma list of 3060, 3070, 3080, 4070, 4080, 4090, 5080, "
      "a100-40, a100-80, h100 (fits, headroom, largest batch that fits)");
  po::variables_map vm;
  if (!parse_command_line(args, opts, "recipe", "plan", vm)) return kUsage;
  if (vm.count("help") || !vm.count("recipe")) {
    std::cout << opts;
    return vm.count("help") ? kOk : kUsage;
  }
  set_log_level("warn");
  try {
    Recipe recipe = Recipe::load(vm["recipe"].as<std::string>());
    if (vm.count("add-strategy"))
      for (const auto& p : vm["add-strategy"].as<std::vector<std::string>>())
        recipe.add_strategy(p);
    if (vm.count("set"))
      for (const auto& s : vm["set"].as<std::vector<std::string>>()) recipe.apply_override(s);
    int64_t budget = 0;
    if (vm.count("budget")) {
      try {
        budget = parse_byte_size(vm["budget"].as<std::string>());
      } catch (const std::invalid_argument& e) {
        std::cerr << "tightfit plan: --budget: " << e.what() << "\n";
        return kUsage;
      }
    }
    PluginRegistry registry = PluginRegistry::discover();
    SessionOptions so;
    so.dry_run = true;
    so.plan_world_size = vm["ranks"].as<int>();
    Session session(recipe, registry, so);
    const MemoryPlan plan = plan_memory(session.parts());
    // Without --budget, the verdict is against the recipe's own budget.
    const char* budget_from = "--budget";
    if (!vm.count("budget")) {
      budget = session.env().budget.bytes;
      budget_from = "run.memory_budget";
    }
    if (vm.count("gpus")) {
      std::vector<GpuModel> gpus;
      if (!select_gpus(vm["gpus"].as<std::string>(), gpus)) return kUsage;
      print_plan(recipe.source(), plan, budget, budget_from);
      print_gpu_table(recipe, registry, plan, gpus);
      return kOk;
    }
    if (vm.count("longest-context")) {
      if (budget <= 0) {
        std::cerr << "tightfit plan: --longest-context needs a budget: --budget 16GiB, or "
                     "run.memory_budget in the recipe\n";
        return kUsage;
      }
      const LongestContext longest = longest_context(recipe, registry, budget);
      std::cout << "longest context  " << longest.tokens << " tokens a row (batch "
                << plan.batch_size << ") within " << format_bytes(budget) << " (" << budget_from
                << "), to 256 tokens";
      if (longest.tokens == 0) std::cout << ": not even 256 fit";
      if (!longest.refused.empty()) std::cout << "; longer was refused: " << longest.refused;
      std::cout << "\n";
      return longest.tokens > 0 ? kOk : kOutOfBudget;
    }
    if (vm.count("json")) {
      std::cout << plan_json(plan).dump(2) << "\n";
    } else {
      print_plan(recipe.source(), plan, budget, budget_from);
      print_context_cost(recipe, registry, plan);
      if (session.env().device.is_cpu())
        print_cpu_precision_speed(session.env().run_info.batch_size *
                                  session.env().run_info.seq_len);
    }
    return budget > 0 && plan.budget_need() > budget ? kOutOfBudget : kOk;
  } catch (const std::exception&) {
    return report_current_error();
  }
}

}  // namespace tightfit::host
