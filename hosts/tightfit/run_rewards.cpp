#include "run_rewards.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

namespace tightfit::host {

std::optional<std::string> reward_before_after(const std::filesystem::path& metrics,
                                               const std::string& schedule) {
  const std::string key = schedule + ".reward";
  std::ifstream in(metrics);
  std::vector<std::pair<int64_t, double>> rewards;  // (step, reward)
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains(key) || !j[key].is_number() || !j.contains("step") ||
        !j["step"].is_number_integer())
      continue;
    rewards.emplace_back(j["step"].get<int64_t>(), j[key].get<double>());
  }
  if (rewards.empty()) return std::nullopt;
  // Ten steps at each end, or half the run when it is shorter.
  const size_t k = std::max<size_t>(1, std::min<size_t>(10, rewards.size() / 2));
  auto mean_of = [&](size_t from) {
    double sum = 0;
    for (size_t i = from; i < from + k; ++i) sum += rewards[i].second;
    return sum / static_cast<double>(k);
  };
  auto span = [&](size_t from) {
    const int64_t a = rewards[from].first, b = rewards[from + k - 1].first;
    return a == b ? "step " + std::to_string(a)
                  : "steps " + std::to_string(a) + "-" + std::to_string(b);
  };
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", mean_of(0));
  std::string out = std::string(buf) + " over " + span(0);
  if (rewards.size() >= 2) {
    std::snprintf(buf, sizeof buf, "%.3f", mean_of(rewards.size() - k));
    out += " -> " + std::string(buf) + " over " + span(rewards.size() - k);
  }
  return out + " (" + key + ", the mean reward of a step's completions)";
}

}  // namespace tightfit::host
