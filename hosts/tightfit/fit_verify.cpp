#include "fit_verify.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "file_util.hpp"
#include "launch.hpp"
#include "memory_accounting.hpp"
#include "run_summary.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace tightfit::host {
namespace {

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

}  // namespace

void verify_stacks(const std::vector<Planned>& fitting, double plain_s, const VerifyOptions& o,
                   json& result) {
  const int n_verify = std::min<int>(o.top, static_cast<int>(fitting.size()));
  const int steps = std::max(2, o.steps);
  const fs::path dir = fs::path(o.out_dir) / "fit-verify";
  fs::create_directories(dir);
  std::vector<double> predicted_s, measured_s;
  json verified = json::array();
  if (!o.json) std::cout << "\nverify: " << steps << " steps of each\n";
  char line[512];
  if (!o.json) {
    std::snprintf(line, sizeof line, "  %-3s %-44s %10s %10s %7s %9s %9s %7s\n", "#", "stack",
                  "planned", "measured", "error", "pred s", "meas s", "error");
    std::cout << line;
  }
  std::vector<size_t> picks;
  for (int i = 0; i < n_verify; ++i)
    picks.push_back(!o.spread || n_verify < 2
                        ? static_cast<size_t>(i)
                        : static_cast<size_t>(std::llround(static_cast<double>(i) *
                                                           static_cast<double>(fitting.size() - 1) /
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
         {"run.steps=" + std::to_string(steps), "run.out_dir=" + dir.string(), "run.name=" + name,
          std::string("run.sample_tokens=0"), std::string("run.eval_interval=0"),
          std::string("save.every=0"), std::string("save.final=false"),
          std::string("run.memory_budget=0")})
      a.insert(a.end(), {"--set", s});
    const std::string log = (dir / (name + ".log")).string();
    const int rc = run_self(a, log);
    json v = choice_json(p, plain_s);
    if (rc != 0) {
      v["failed"] = true;
      v["log"] = log;
      if (!o.json)
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
    if (!o.json) {
      std::snprintf(line, sizeof line, "  %-3zu %-44s %10s %10s %+6.1f%% %9s %9s %+6.0f%%\n", i + 1,
                    p.choice.describe().substr(0, 44).c_str(),
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
    if (!o.json)
      std::cout << "rank correlation of predicted and measured step time (Spearman): "
                << seconds(rho) << " over " << predicted_s.size() << " stacks\n";
  }
}

}  // namespace tightfit::host
