#include "given_completions.hpp"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

GivenCompletions::GivenCompletions(const std::string& file, int64_t num_generations,
                                   int64_t max_length)
    : file_(file), num_generations_(num_generations) {
  std::ifstream in(file);
  if (!in) throw std::runtime_error("grpo: completions_file " + file + " cannot be read");
  int64_t line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = file + ":" + std::to_string(line_number);
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("row") || !j["row"].is_number_integer() ||
        !j.contains("completion_ids") || !j["completion_ids"].is_array() ||
        static_cast<int64_t>(j["completion_ids"].size()) != num_generations)
      throw std::runtime_error(where + ": expected {\"row\": N, \"completion_ids\": [...]} with " +
                               std::to_string(num_generations) + " lists of ids (num_generations)");
    std::vector<std::vector<int64_t>> group;
    for (const auto& c : j["completion_ids"]) {
      if (!c.is_array() || c.empty() || static_cast<int64_t>(c.size()) > max_length)
        throw std::runtime_error(where + ": each completion holds 1 to max_completion_length ids");
      std::vector<int64_t> ids;
      for (const auto& id : c) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0)
          throw std::runtime_error(where + ": ids are non-negative integers");
        ids.push_back(id.get<int64_t>());
      }
      group.push_back(std::move(ids));
    }
    by_row_[j["row"].get<int64_t>()] = std::move(group);
  }
}

tf_rl::Sampled GivenCompletions::of_row(int64_t row) const {
  const auto it = by_row_.find(row);
  if (it == by_row_.end())
    throw std::runtime_error("grpo: completions_file " + file_ + " has no line for prompt row " +
                             std::to_string(row));
  int64_t width = 1;
  for (const auto& c : it->second) width = std::max<int64_t>(width, static_cast<int64_t>(c.size()));
  tf_rl::Sampled out;
  out.ids = at::zeros({num_generations_, width}, at::kLong);
  out.lengths = at::zeros({num_generations_}, at::kLong);
  for (int64_t i = 0; i < num_generations_; ++i) {
    const auto& c = it->second[static_cast<size_t>(i)];
    out.ids[i].narrow(0, 0, static_cast<int64_t>(c.size())).copy_(at::tensor(c, at::kLong));
    out.lengths[i] = static_cast<int64_t>(c.size());
  }
  return out;
}
