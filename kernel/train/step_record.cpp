#include "step_record.hpp"

#include <cmath>

namespace tightfit {

nlohmann::json step_record(const StepRecordInput& in) {
  const tf_step_result& r = *in.result;
  const MemorySnapshot& mem = *in.memory;
  nlohmann::json rec = {{"step", in.step},
                        {"loss", r.loss},
                        {"lr", r.lr},
                        {"tokens", r.n_tokens},
                        {"elapsed_s", in.elapsed_s},
                        {"phase", r.phase ? r.phase : "full"},
                        {"backward_passes", r.backward_passes}};
  for (int c = 0; c < TF_MEM_CATEGORY_COUNT - 1; ++c)
    rec["peak_" + std::string(category_name(static_cast<tf_mem_category>(c)))] = mem.peak[c];
  rec["peak_total"] = mem.total_peak;
  nlohmann::json at_peak = nlohmann::json::object();
  for (int c = 0; c < TF_MEM_CATEGORY_COUNT; ++c)
    at_peak[category_name(static_cast<tf_mem_category>(c))] = mem.at_peak[c];
  rec["at_peak"] = std::move(at_peak);
  if (in.device_is_cuda) rec["peak_device"] = mem.device_peak;
  if (in.process) {
    rec["rss"] = in.process->rss;
    rec["peak_rss"] = in.process->peak_rss;
  }
  if (in.step_metrics)
    for (const auto& [k, v] : *in.step_metrics)
      rec[k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
  return rec;
}

}  // namespace tightfit
