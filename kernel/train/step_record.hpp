// One line of metrics.jsonl: what a training step did (loss, rate, phase),
// the memory peaks by category and what was held at the peak, and the
// metrics the kernel and plugins reported during the step.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "memory_accounting.hpp"
#include "process_memory.hpp"
#include "tightfit/plugin_api.h"

namespace tightfit {

struct StepRecordInput {
  int64_t step = 0;  // 1-based: the steps done after this one
  const tf_step_result* result = nullptr;
  double elapsed_s = 0;
  const MemorySnapshot* memory = nullptr;
  bool device_is_cuda = false;
  const std::map<std::string, double>* step_metrics = nullptr;  // non-finite values become null
  const ProcessMemory* process = nullptr;  // the RSS now and its peak; none when unknown
};

nlohmann::json step_record(const StepRecordInput& in);

}  // namespace tightfit
