// JSONL metrics: one JSON object per line, flushed as written so a crashed run
// keeps every completed step.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace tightfit {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // Appends to `path` (a resumed run continues the same file).
  explicit MetricsWriter(const std::string& path);
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace tightfit
