// What the host services (host_api_*.cpp) work on: the session's parts by
// name, so that each service reaches only the part it serves. The session
// owns the parts; every plugin instance's context points here.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "executor.hpp"
#include "hf_weights.hpp"
#include "param_store.hpp"
#include "plugin_set.hpp"
#include "run_environment.hpp"
#include "snapshots.hpp"
#include "text_scorer.hpp"
#include "training_data.hpp"
#include "update_step.hpp"

namespace tightfit {

// The planned parameter table `plan` fills and strategies' estimates edit
// (memory_plan.cpp); `planning` while the estimates are asked.
struct ParamPlanTable {
  std::map<std::string, tf_param_plan> params;
  bool planning = false;
};

struct KernelParts {
  const RunEnvironment* env = nullptr;
  PluginSet* plugins = nullptr;
  ParamStore* store = nullptr;
  Executor* executor = nullptr;
  UpdateStep* update = nullptr;
  Snapshots* snapshots = nullptr;
  TrainingData* data = nullptr;
  ParamPlanTable* plan = nullptr;
  // The trainer's record of the current step (plugins' report_metric).
  std::map<std::string, double>* step_metrics = nullptr;
  // The recipe's [model] weights (opened on first use), nullptr when none.
  std::function<const HfWeightSource*()> weights;
  // The sequence classifier in the Hugging Face folder `model`, opened once
  // for the run (composed only when the run is planned); shared, so that a
  // reward call still running keeps it alive. Throws RecipeError.
  std::function<std::shared_ptr<TextScorer>(const std::string& model)> open_scorer;
  // The session's log: kernel and plugin lines, also to the host's on_log.
  std::function<void(tf_log_level, const std::string&)> log;
};

}  // namespace tightfit
