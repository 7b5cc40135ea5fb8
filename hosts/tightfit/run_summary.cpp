#include "run_summary.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "file_util.hpp"
#include "json_input.hpp"

namespace tightfit::host {

const char* const kCategories[] = {"weights",  "grads",     "optimizer", "activations",
                                   "adapters", "transient", "other"};

nlohmann::json summarize(const std::filesystem::path& metrics) {
  using nlohmann::json;
  std::error_code ec;
  if (!std::filesystem::exists(metrics, ec))
    throw std::runtime_error("no metrics at " + metrics.string());
  std::istringstream in(read_file_text(metrics.string()));
  json last, out;
  std::vector<double> losses, evals, eval_steps, elapsed, peak_total;
  std::vector<double> rewards, reward_steps;  // online RL: a schedule's "<name>.reward"
  int64_t tokens = 0, backward = 0, diverged = 0;
  double divergence_metric = 0;
  size_t lineno = 0;
  for (std::string line; std::getline(in, line);) {
    ++lineno;
    json r;
    try {
      r = parse_json(line, metrics.string() + ":" + std::to_string(lineno));
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(e.what());
    }
    if (!r.is_object())
      throw std::runtime_error(metrics.string() + ":" + std::to_string(lineno) +
                               ": not a metrics record");
    const bool finite = r["loss"].is_number() && std::isfinite(r["loss"].get<double>());
    if (!finite) ++diverged;
    losses.push_back(finite ? r["loss"].get<double>() : std::nan(""));
    elapsed.push_back(r.value("elapsed_s", 0.0));
    peak_total.push_back(r.value("peak_total", 0.0));
    tokens += r.value("tokens", int64_t{0});
    backward += r.value("backward_passes", int64_t{0});
    if (r.contains("eval_loss") && r["eval_loss"].is_number()) {
      evals.push_back(r["eval_loss"].get<double>());
      eval_steps.push_back(r["step"].get<double>());
    }
    for (const auto& [k, v] : r.items()) {
      if (!v.is_number()) continue;
      // A schedule's own count (hybrid's rollbacks).
      if (k.size() > 12 && k.compare(k.size() - 12, 12, ".divergences") == 0)
        divergence_metric = std::max(divergence_metric, v.get<double>());
      // The mean reward a schedule that samples logs (TRL's "reward"), not
      // one reward function's ("rewards/NAME/mean").
      if (k.size() > 7 && k.compare(k.size() - 7, 7, ".reward") == 0 &&
          k.find('/') == std::string::npos && r["step"].is_number()) {
        rewards.push_back(v.get<double>());
        reward_steps.push_back(r["step"].get<double>());
      }
    }
    last = r;
  }
  if (last.is_null()) throw std::runtime_error(metrics.string() + " is empty");
  out["steps"] = losses.size();
  out["wall_s"] = last.value("elapsed_s", 0.0);
  out["tokens_per_s"] = out["wall_s"].get<double>() > 0 ? tokens / out["wall_s"].get<double>() : 0;
  out["final_train_loss"] = losses.back();
  out["final_eval_loss"] = evals.empty() ? json(nullptr) : json(evals.back());
  double best = std::nan("");
  for (double e : evals)
    if (!(e >= best)) best = e;
  out["best_eval_loss"] = evals.empty() ? json(nullptr) : json(best);
  out["divergences"] = std::max<double>(static_cast<double>(diverged), divergence_metric);
  out["backward_passes"] = backward;
  out["backward_skipped"] =
      1.0 - static_cast<double>(backward) / static_cast<double>(losses.size());
  json peaks;
  for (const char* c : kCategories) peaks[c] = last.value(std::string("peak_") + c, 0.0);
  peaks["total"] = last.value("peak_total", 0.0);
  out["peak_bytes"] = peaks;
  out["curve"] = {{"loss", losses},          {"elapsed_s", elapsed}, {"peak_total", peak_total},
                  {"eval_step", eval_steps}, {"eval_loss", evals},   {"reward_step", reward_steps},
                  {"reward", rewards}};
  return out;
}

}  // namespace tightfit::host
