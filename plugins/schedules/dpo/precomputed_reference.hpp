// TRL's precompute_ref_log_probs: the reference model's log-probabilities
// of every preference row, computed once in a pass over all of them (the
// training rows, then the held-out ones) before the first update, and
// looked up by row id afterwards. The reference pass then costs nothing per
// step, and a full fine-tune needs no frozen copy of the model: before the
// first update the policy is its own reference. Checkpoints carry the
// table, so a resumed run looks up the same values.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "pair_passes.hpp"
#include "reference_model.hpp"
#include "tightfit/plugin_sdk.hpp"

namespace tf_preference {

class PrecomputedReference {
 public:
  bool empty() const { return !sums_.defined(); }

  // `score(batch)` -> each row's summed log-prob and target count
  // (SequenceLogps over 2 x pairs rows), for every preference row, `chunk`
  // pairs a pass.
  template <class Score>
  void compute(const tf_sdk::Host& host, int64_t chunk, Score&& score) {
    std::vector<at::Tensor> sums, counts;
    for (int64_t first = 0;;) {
      const tf_sdk::Batch b(host, first, chunk);
      const int64_t n = b.pairs();
      if (n == 0) break;
      const tf_sdk::SequenceLogps s = score(b);
      // [2n] rows (first then second of each pair) -> [n, 2]
      sums.push_back(at::stack({s.logps.narrow(0, 0, n), s.logps.narrow(0, n, n)}, 1));
      counts.push_back(at::stack({s.counts.narrow(0, 0, n), s.counts.narrow(0, n, n)}, 1));
      first += n;
    }
    if (sums.empty()) throw std::runtime_error("precompute_ref_log_probs: the data has no rows");
    sums_ = at::cat(sums).to(at::kFloat);
    counts_ = at::cat(counts).to(at::kLong);
  }

  // The batch's rows as sequence_logps lays them out: [2 x pairs].
  tf_sdk::SequenceLogps of(const tf_sdk::Batch& b) const {
    const at::Tensor ids = b.row_ids();
    if (!ids.defined())
      throw std::logic_error("precompute_ref_log_probs: the batch carries no row ids");
    if (ids.numel() > 0 && ids.max().item<int64_t>() >= sums_.size(0))
      throw std::runtime_error(
          "precompute_ref_log_probs: a row past the " + std::to_string(sums_.size(0)) +
          " the checkpoint's reference log-probabilities cover (the data changed since): resume "
          "with the data that run had, or start a new run");
    const at::Tensor s = sums_.index_select(0, ids), c = counts_.index_select(0, ids);
    return {at::cat({s.select(1, 0), s.select(1, 1)}), at::cat({c.select(1, 0), c.select(1, 1)})};
  }

  void save(const tf_sdk::Host& host) const {
    if (empty()) return;
    host.save_tensor("reference_logps.sums", sums_);
    host.save_tensor("reference_logps.counts", counts_);
  }
  // False when the checkpoint holds none.
  bool load(const tf_sdk::Host& host) {
    const auto sums = host.find_saved_tensor("reference_logps.sums");
    const auto counts = host.find_saved_tensor("reference_logps.counts");
    if (!sums || !counts) return false;
    sums_ = sums->to(at::kFloat);
    counts_ = counts->to(at::kLong);
    return true;
  }

 private:
  at::Tensor sums_, counts_;  // [rows, 2] each: a pair's two sequences
};

// Before a pass at `step` (-1: an evaluation), the reference ready: without
// a table, the model's (a full fine-tune's copy taken before the first
// update); with one (precompute_ref_log_probs), every row scored once before
// the first update by the base with adapters off, or by the policy itself,
// which has not moved yet. A resumed run read either from its checkpoint.
inline void prepare_reference(const tf_sdk::Host& host, ReferenceModel& model,
                              PrecomputedReference* table, int64_t step,
                              const std::string& schedule) {
  if (table == nullptr) {
    model.keep(host, step);
    return;
  }
  if (!table->empty()) return;
  if (step > 0)
    throw std::logic_error(schedule + ": no precomputed reference log-probs at step " +
                           std::to_string(step));
  const int64_t chunk = std::max<int64_t>(1, host.run_info().batch_size / 2);
  table->compute(host, chunk, [&](const tf_sdk::Batch& b) {
    auto scored = [&](const tf_sdk::PassWeights& w) {
      return PairPasses::whole_batch_reference_logps(b, w);
    };
    return model.adapters(host) ? model.run(host, scored) : scored({});
  });
}

}  // namespace tf_preference
