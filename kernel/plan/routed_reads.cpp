#include "routed_reads.hpp"

#include <algorithm>
#include <cmath>

#include "kernel_parts.hpp"

namespace tightfit {

double routed_use_probability(double share, double tokens) {
  if (share <= 0 || share >= 1) return 1;
  return -std::expm1(tokens * std::log1p(-share));  // 1 - (1 - s)^T without cancellation
}

bool read_when_routed(const Param& p) {
  return (p.flags & TF_PARAM_EXPERT) != 0 && !p.trainable;
}

RoutedReads plan_routed_reads(const KernelParts& s, const std::vector<StageFlow>& stages) {
  RoutedReads r;
  const tf_run_info& run = s.env->run_info;
  const double tokens = static_cast<double>(run.batch_size) * static_cast<double>(run.seq_len);
  r.stage_host_bytes.assign(stages.size(), 0);
  r.stage_disk_bytes.assign(stages.size(), 0);
  const auto& table = s.plan->params;
  const auto& declared = s.executor->stages();
  for (const Param& p : s.store->all()) {
    const auto it = table.find(p.name);
    if (it == table.end() || !read_when_routed(p) || p.stage < 0 ||
        static_cast<size_t>(p.stage) >= stages.size())
      continue;
    const tf_param_plan& planned = it->second;
    if (planned.tier != TF_TIER_HOST && planned.tier != TF_TIER_DISK) continue;
    const size_t st = static_cast<size_t>(p.stage);
    if (declared[st].skip) continue;
    const StageFlow& f = stages[st];
    const double bytes = static_cast<double>(planned.bytes);
    const double used = routed_use_probability(p.routed_share, tokens);
    const double uses = 1 + (f.recomputed ? 1 : 0) + (f.backward ? 1 : 0);
    ++r.weights;
    r.bytes += planned.bytes;
    r.used_per_pass += used;
    r.most_used_per_pass += p.routed_share > 0 ? std::min(1.0, tokens * p.routed_share) : 1.0;
    r.reads_per_pass += used * uses;
    r.bytes_per_pass += used * uses * bytes;
    (planned.tier == TF_TIER_HOST ? r.stage_host_bytes : r.stage_disk_bytes)[st] += used * bytes;
  }
  return r;
}

}  // namespace tightfit
