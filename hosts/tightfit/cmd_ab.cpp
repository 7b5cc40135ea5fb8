// `tightfit ab`: runs recipes — or one recipe with a key varied — on the same
// seeds (so the same initial weights and data order) for the same number of
// steps, one after another, each in its own process (its own memory peaks),
// and compares them: memory by category, speed, held-out loss and its gap to
// the first variant with a 95% interval over seeds, divergences and backward
// passes skipped. Writes the table, ab.json, report.html (ab_report.hpp) and
// each run's folder under --out.
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ab_report.hpp"
#include "ab_stats.hpp"
#include "commands.hpp"
#include "file_util.hpp"
#include "json_output.hpp"
#include "launch.hpp"
#include "recipe.hpp"
#include "run_summary.hpp"

namespace tightfit::host {
namespace po = boost::program_options;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Variant {
  std::string name;    // in the table and the run folders
  std::string recipe;  // path
  std::vector<std::string> sets;
  std::string add_strategy;  // --vary strategy=NAME
};

std::string stem(const std::string& path) {
  return fs::path(path).stem().string();
}

// Bytes as MiB, with a decimal for small ones.
std::string mib(double bytes) {
  const double m = bytes / (1024.0 * 1024.0);
  return fixed(m, m < 10 ? 1 : 0);
}

// The numbers at `pointer` (e.g. "/peak_bytes/weights") of the runs that finished.
std::vector<double> values(const json& runs, const std::string& pointer) {
  const json::json_pointer ptr(pointer);
  std::vector<double> v;
  for (const auto& r : runs)
    if (!r.contains("failed") && r.contains(ptr) && r.at(ptr).is_number())
      v.push_back(r.at(ptr).get<double>());
  return v;
}

// Each variant's means over seeds, and the gap of its held-out loss to the
// first variant's, paired by seed, with a 95% interval.
void add_means(json& report) {
  const json& base = report["variants"][0]["runs"];
  for (auto& jv : report["variants"]) {
    json m;
    for (const char* key : {"wall_s", "tokens_per_s", "final_eval_loss", "best_eval_loss",
                            "divergences", "backward_skipped", "final_train_loss"})
      m[key] = mean(values(jv["runs"], std::string("/") + key));
    for (const char* c : kCategories)
      m["peak_bytes"][c] = mean(values(jv["runs"], std::string("/peak_bytes/") + c));
    m["peak_bytes"]["total"] = mean(values(jv["runs"], "/peak_bytes/total"));
    std::vector<double> gaps;
    for (size_t k = 0; k < jv["runs"].size(); ++k) {
      const json& r = jv["runs"][k];
      if (r.contains("failed") || base[k].contains("failed") || !r["final_eval_loss"].is_number() ||
          !base[k]["final_eval_loss"].is_number())
        continue;
      gaps.push_back(r["final_eval_loss"].get<double>() - base[k]["final_eval_loss"].get<double>());
    }
    m["eval_gap"] = mean(gaps);
    m["eval_gap_ci95"] = ci95(gaps);
    jv["mean"] = m;
  }
}

// --vary strategy=a,b: each value is a [[strategy]] appended to the recipe
// (tightfit run --add-strategy; "none": none);
// --vary KEY=a,b: each value is --set KEY=value.
std::vector<Variant> varied(const std::string& recipe, const std::string& spec) {
  const auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
    throw std::invalid_argument("--vary wants KEY=V1,V2,... (e.g. strategy=none,checkpoint)");
  const std::string key = spec.substr(0, eq);
  std::vector<std::string> values;
  std::stringstream ss(spec.substr(eq + 1));
  for (std::string v; std::getline(ss, v, ',');)
    if (!v.empty()) values.push_back(v);
  std::vector<Variant> out_variants;
  for (const auto& v : values) {
    Variant var{key + "=" + v, recipe, {}};
    if (key == "strategy") {
      if (v != "none") var.add_strategy = v;
    } else {
      var.sets.push_back(key + "=" + v);
    }
    out_variants.push_back(var);
  }
  if (out_variants.size() < 2)
    throw std::invalid_argument("--vary needs at least two values to compare");
  return out_variants;
}

}  // namespace

int ab_command(const std::vector<std::string>& args) {
  po::options_description opts(
      "tightfit ab A.toml B.toml [...] | tightfit ab BASE.toml --vary KEY=V1,V2,...");
  opts.add_options()("help,h", "show this help")("seeds", po::value<int>()->default_value(1),
                                                 "seeds per variant (run.seed, +1, ...)")(
      "steps", po::value<int64_t>(), "steps per run (default: the first recipe's run.steps)")(
      "eval-interval", po::value<int64_t>(),
      "steps between held-out losses (default: a tenth of the steps)")(
      "vary", po::value<std::string>(),
      "one recipe, one key varied: strategy=none,checkpoint,... appends each strategy; any other "
      "KEY=V1,V2 sets it")("out,o", po::value<std::string>()->default_value("runs/ab"),
                           "folder for the runs, ab.json and the logs")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a key in every variant")(
      "no-html", "skip report.html (the table, notes and plots)")(
      "nproc", po::value<int>(), "run every variant on N local ranks (tightfit run --nproc N)");
  po::options_description hidden;
  hidden.add_options()("recipes", po::value<std::vector<std::string>>());
  po::positional_options_description pos;
  pos.add("recipes", -1);
  po::options_description all;
  all.add(opts).add(hidden);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "tightfit ab: " << e.what() << "\n\n" << opts;
    return kUsage;
  }
  const auto recipes = vm.count("recipes") ? vm["recipes"].as<std::vector<std::string>>()
                                           : std::vector<std::string>{};
  if (vm.count("help") || recipes.empty()) {
    return print_usage(
        vm, opts,
        "\nRuns every variant on the same seeds and step count, one after another, and prints "
        "peak memory by category, tokens/s, wall time, final and best held-out loss, the gap "
        "to the first variant (mean and 95% interval over seeds), divergences and backward "
        "passes skipped. ab.json in --out has every run's curves.\n");
  }
  try {
    const fs::path out = vm["out"].as<std::string>();
    fs::create_directories(out / "logs");
    std::vector<Variant> variants;
    if (vm.count("vary")) {
      if (recipes.size() != 1) {
        std::cerr << "tightfit ab: --vary takes one recipe\n";
        return kUsage;
      }
      variants = varied(recipes[0], vm["vary"].as<std::string>());
    } else {
      if (recipes.size() < 2) {
        std::cerr << "tightfit ab: give two recipes or more, or one with --vary\n";
        return kUsage;
      }
      for (const auto& r : recipes) variants.push_back({stem(r), r, {}});
    }
    for (const auto& var : variants) Recipe::load(var.recipe);  // a missing or broken one: now
    const auto user_sets =
        vm.count("set") ? vm["set"].as<std::vector<std::string>>() : std::vector<std::string>{};
    // The seeds are ab's to choose: each run's run.seed is set after every other --set, so the
    // seeds the report lists are the ones the runs used. A --set run.seed=S moves the first;
    // a --vary of the seed would compare seeds, not recipes.
    for (const auto& var : variants)
      for (const auto& s : var.sets)
        if (s.rfind("run.seed=", 0) == 0)
          throw std::invalid_argument(
              "--vary run.seed: ab runs every variant on the same seeds; "
              "give --seeds N (and --set run.seed=S for the first)");
    Recipe first = Recipe::load(recipes[0]);
    for (const auto& s : user_sets) first.apply_override(s);
    const toml::table* run = first.table("run");
    const int64_t steps = vm.count("steps") ? vm["steps"].as<int64_t>()
                                            : (run ? (*run)["steps"].value_or(int64_t{200}) : 200);
    const int64_t seed0 = run ? (*run)["seed"].value_or(int64_t{1234}) : 1234;
    const int seeds = vm["seeds"].as<int>();
    const int64_t eval_interval = vm.count("eval-interval") ? vm["eval-interval"].as<int64_t>()
                                                            : std::max<int64_t>(1, steps / 10);
    if (steps < 1 || seeds < 1 || eval_interval < 1) {
      std::cerr << "tightfit ab: --steps, --seeds and --eval-interval must be at least 1\n";
      return kUsage;
    }

    json report = {{"steps", steps}, {"seeds", json::array()}, {"variants", json::array()}};
    for (int k = 0; k < seeds; ++k) report["seeds"].push_back(seed0 + k);
    for (size_t v = 0; v < variants.size(); ++v) {
      const Variant& var = variants[v];
      json jv = {{"name", var.name}, {"recipe", var.recipe}, {"runs", json::array()}};
      for (int k = 0; k < seeds; ++k) {
        const std::string name = "v" + std::to_string(v) + "-seed" + std::to_string(seed0 + k);
        std::vector<std::string> a = {"run", var.recipe, "-q"};
        if (vm.count("nproc"))
          a.insert(a.end(), {"--nproc", std::to_string(vm["nproc"].as<int>())});
        if (!var.add_strategy.empty()) a.insert(a.end(), {"--add-strategy", var.add_strategy});
        for (const std::string& s :
             {"run.steps=" + std::to_string(steps), "run.out_dir=" + (out / "runs").string(),
              "run.name=" + name, std::string("run.sample_tokens=0"),
              "run.eval_interval=" + std::to_string(eval_interval), std::string("save.every=0"),
              std::string("save.final=false")}) {
          a.push_back("--set");
          a.push_back(s);
        }
        for (const auto& s : user_sets) a.insert(a.end(), {"--set", s});
        for (const auto& s : var.sets) a.insert(a.end(), {"--set", s});
        a.insert(a.end(), {"--set", "run.seed=" + std::to_string(seed0 + k)});  // last: it holds
        const fs::path run_dir = out / "runs" / name;
        remove_tree(run_dir.string());  // an earlier ab's run of the same name
        const std::string log = (out / "logs" / (name + ".log")).string();
        std::cerr << "ab: " << var.name << ", seed " << seed0 + k << " ..." << std::flush;
        const int rc = run_self(a, log);
        json r;
        if (rc != 0) {
          std::cerr << " failed (exit " << rc << "; " << log << ")\n";
          r = {{"failed", true}, {"exit_code", rc}, {"log", log}};
        } else {
          r = summarize(run_dir / "metrics.jsonl");
          std::cerr << " " << fixed(r["wall_s"].get<double>(), 1) << " s\n";
        }
        r["seed"] = seed0 + k;
        r["run_dir"] = run_dir.string();
        jv["runs"].push_back(r);
      }
      report["variants"].push_back(jv);
    }

    add_means(report);
    write_file_synced((out / "ab.json").string(), dump_json(report, 2));

    // The table.
    std::ostringstream t;
    t << "\n== tightfit ab: " << variants.size() << " variants, " << seeds << " seed(s), " << steps
      << " steps each ==\n";
    char line[512];
    std::snprintf(line, sizeof line, "%-28s %9s %8s %7s %7s %7s %9s %8s %8s %8s %17s %5s %6s\n",
                  "variant", "peak MiB", "weights", "grads", "optim", "activ", "tok/s", "wall s",
                  "eval", "best", "gap (95% CI)", "div", "bwd-");
    t << line;
    for (const auto& jv : report["variants"]) {
      const json& m = jv["mean"];
      const json& p = m["peak_bytes"];
      auto num = [](const json& j) { return j.is_number() ? j.get<double>() : std::nan(""); };
      std::string gap = fixed(num(m["eval_gap"]), 4);
      if (std::isfinite(num(m["eval_gap_ci95"]))) gap += " ±" + fixed(num(m["eval_gap_ci95"]), 4);
      std::snprintf(line, sizeof line, "%-28s %9s %8s %7s %7s %7s %9s %8s %8s %8s %17s %5s %6s\n",
                    jv["name"].get<std::string>().substr(0, 28).c_str(),
                    mib(num(p["total"])).c_str(), mib(num(p["weights"])).c_str(),
                    mib(num(p["grads"])).c_str(), mib(num(p["optimizer"])).c_str(),
                    mib(num(p["activations"])).c_str(), fixed(num(m["tokens_per_s"]), 0).c_str(),
                    fixed(num(m["wall_s"]), 1).c_str(), fixed(num(m["final_eval_loss"]), 4).c_str(),
                    fixed(num(m["best_eval_loss"]), 4).c_str(), gap.c_str(),
                    fixed(num(m["divergences"]), 0).c_str(),
                    (fixed(100 * num(m["backward_skipped"]), 0) + "%").c_str());
      t << line;
    }
    t << "(means over seeds; gap: held-out loss minus the first variant's, paired by seed; div: "
         "divergences; bwd-: backward passes skipped)\n"
      << "runs, logs and ab.json: " << out.string() << "\n";
    std::cout << t.str();
    write_file_synced((out / "ab.txt").string(), t.str());
    if (!vm.count("no-html")) {
      write_file_synced((out / "report.html").string(), ab_report_html(report));
      std::cout << "report        " << (out / "report.html").string() << "\n";
    }
    for (const auto& jv : report["variants"])
      for (const auto& r : jv["runs"])
        if (r.contains("failed")) return kFailure;
    return kOk;
  } catch (const RecipeError& e) {
    std::cerr << "tightfit ab: recipe error: " << e.what() << "\n";
    return kUsage;
  } catch (const std::exception& e) {
    std::cerr << "tightfit ab: " << e.what() << "\n";
    return kUsage;
  }
}

}  // namespace tightfit::host
