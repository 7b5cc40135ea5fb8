#include "fit_rank.hpp"

#include <algorithm>
#include <cmath>

namespace tightfit::host {

// ("fits" must not be followed by an out-of-budget stop: a 30B QLoRA at
// 4 GiB, plan 3.8 GiB, stopped in its second step when the fastest tight
// stack was picked.)
void rank_stacks(std::vector<Planned>& fitting, int64_t budget, const std::string& objective) {
  auto tight = [&](const Planned& p) { return p.plan.safe_budget() > budget; };
  auto penalty = [](const Planned& p) { return std::round(p.choice.quality_penalty() * 100); };
  const bool quality = objective == "quality";
  // Those inside their margin first, (by the maths they change first with
  // --objective quality), each class fastest first.
  std::stable_sort(fitting.begin(), fitting.end(), [&](const Planned& a, const Planned& b) {
    if (tight(a) != tight(b)) return !tight(a);
    if (quality && penalty(a) != penalty(b)) return penalty(a) < penalty(b);
    return a.cost.total() < b.cost.total();
  });
  // Times within 2% of the fastest left tie: among them the stack that
  // changes the maths least, then the one with fewer strategies, then the
  // smaller (an exact stack 0.4% slower than a lossy one wins).
  for (size_t i = 0; i < fitting.size();) {
    size_t j = i + 1;
    while (j < fitting.size() && tight(fitting[j]) == tight(fitting[i]) &&
           (!quality || penalty(fitting[j]) == penalty(fitting[i])) &&
           fitting[j].cost.total() <= fitting[i].cost.total() * 1.02)
      ++j;
    std::stable_sort(fitting.begin() + static_cast<std::ptrdiff_t>(i),
                     fitting.begin() + static_cast<std::ptrdiff_t>(j),
                     [&](const Planned& a, const Planned& b) {
                       if (penalty(a) != penalty(b)) return penalty(a) < penalty(b);
                       if (a.choice.strategies() != b.choice.strategies())
                         return a.choice.strategies() < b.choice.strategies();
                       return a.plan.tracked_peak < b.plan.tracked_peak;
                     });
    i = j;
  }
}

void drop_settings_that_do_nothing(std::vector<Planned>& fitting) {
  auto same_effect = [](const Planned& a, const Planned& b) {
    return a.plan.tracked_peak == b.plan.tracked_peak && a.cost.total() == b.cost.total() &&
           a.choice.approximations() == b.choice.approximations();
  };
  std::vector<Planned> kept;
  for (const Planned& p : fitting)
    if (std::none_of(fitting.begin(), fitting.end(), [&](const Planned& q) {
          return same_effect(p, q) && q.choice.settings < p.choice.settings;
        }))
      kept.push_back(p);
  fitting = std::move(kept);
}

}  // namespace tightfit::host
