// TRL's precompute_ref_log_probs: the reference model's log-probabilities
// of every preference row, computed once in a pass over all of them (the
// training rows, then the held-out ones) before the first update, and
// looked up by row id afterwards. The reference pass then costs nothing per
// step, and a full fine-tune needs no frozen copy of the model: before the
// first update the policy is its own reference. Checkpoints carry the
// table, so a resumed run looks up the same values, and the key of what it
// was computed from: a hash of every row (row id, tokens and targets, so the
// tokenizer and the truncation keys too) and the model's source. A resume
// whose rows or model differ never looks up the old values: with adapters
// (the reference is the base with them off, which training never changes)
// the table is computed again at the next step, and the log says so; a full
// fine-tune (whose reference was the policy before its first update) is
// refused, naming what changed.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "tightfit/plugin_sdk.hpp"
#include "tightfit/preference/pair_passes.hpp"
#include "tightfit/preference/reference_model.hpp"

namespace tf_preference {

class PrecomputedReference {
 public:
  bool empty() const { return !sums_.defined(); }
  // A table dropped at load (its rows or model changed) that the run may
  // compute again at a later step (a reference with adapters off).
  bool recompute() const { return recompute_; }

  // The key of the rows the table covers and the model it scored them with:
  // FNV-1a over each row's id, tokens and targets up to its last scored
  // target (so the batch's padding width, which depends on the chunk, is
  // not in it), and the model's source folder.
  struct Key {
    int64_t rows = 0, model = 0;
  };
  static Key key_of(const tf_sdk::Host& host, int64_t chunk) {
    return each_batch(host, chunk, [](const tf_sdk::Batch&, int64_t) {});
  }

  // `score(batch)` -> each row's summed log-prob and target count
  // (SequenceLogps over 2 x pairs rows), for every preference row, `chunk`
  // pairs a pass.
  template <class Score>
  void compute(const tf_sdk::Host& host, int64_t chunk, Score&& score) {
    std::vector<at::Tensor> sums, counts;
    int64_t scored = 0;
    host.progress("scoring the reference", 0, 0, "rows");
    const Key key = each_batch(host, chunk, [&](const tf_sdk::Batch& b, int64_t n) {
      const tf_sdk::SequenceLogps s = score(b);
      host.progress("scoring the reference", scored += n, 0, "rows");
      // [2n] rows (first then second of each pair) -> [n, 2]
      sums.push_back(at::stack({s.logps.narrow(0, 0, n), s.logps.narrow(0, n, n)}, 1));
      counts.push_back(at::stack({s.counts.narrow(0, 0, n), s.counts.narrow(0, n, n)}, 1));
    });
    host.end_progress();
    if (sums.empty()) throw std::runtime_error("precompute_ref_log_probs: the data has no rows");
    sums_ = at::cat(sums).to(at::kFloat);
    counts_ = at::cat(counts).to(at::kLong);
    key_ = key;
    recompute_ = false;
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
    host.save_tensor("reference_logps.key", at::tensor({key_.rows, key_.model}, at::kLong));
  }
  // False when the checkpoint holds none. The table is used only when its
  // key is the current data's and model's (`chunk` pairs a batch, as
  // compute); otherwise it is dropped, to be computed again when
  // `can_recompute` (the log says so), or refused naming what changed. A
  // checkpoint from before the key is used as it is, with a warning.
  bool load(const tf_sdk::Host& host, int64_t chunk, bool can_recompute,
            const std::string& schedule) {
    const auto sums = host.find_saved_tensor("reference_logps.sums");
    const auto counts = host.find_saved_tensor("reference_logps.counts");
    if (!sums || !counts) return false;
    const auto saved = host.find_saved_tensor("reference_logps.key");
    const Key now = key_of(host, chunk);
    if (!saved || saved->numel() != 2) {
      host.log(TF_LOG_WARN,
               schedule +
                   ": the checkpoint's precomputed reference log-probs carry no key of "
                   "the rows they were computed from (a checkpoint of an older tightfit): "
                   "used as they are; if the data changed since, start a new run");
    } else {
      const at::Tensor k = saved->to(at::kCPU, at::kLong);
      const bool rows_changed = k[0].item<int64_t>() != now.rows;
      const bool model_changed = k[1].item<int64_t>() != now.model;
      if (rows_changed || model_changed) {
        const std::string what =
            rows_changed && model_changed
                ? "the data's rows and the model"
                : (rows_changed ? "the data's rows (their text, tokenizer or truncation)"
                                : "the model they were scored with ([model] weights)");
        if (!can_recompute)
          throw std::runtime_error(
              schedule + ": the checkpoint's precomputed reference log-probs were computed from " +
              "other " + (rows_changed ? "rows" : "weights") + " than this run's: " + what +
              " changed since it was saved, and a full fine-tune's reference (the model before "
              "its first update) cannot be scored again. Resume with the data and model that "
              "run had, or start a new run");
        host.log(TF_LOG_WARN,
                 schedule + ": " + what + " changed since the checkpoint was saved: its " +
                     "precomputed reference log-probs are dropped and computed again (the "
                     "reference is the base with the adapters off, which training left as it "
                     "was)");
        sums_ = at::Tensor();
        counts_ = at::Tensor();
        recompute_ = true;
        return true;
      }
    }
    sums_ = sums->to(at::kFloat);
    counts_ = counts->to(at::kLong);
    key_ = now;
    return true;
  }

 private:
  static constexpr uint64_t kFnvOffset = 1469598103934665603ull;
  static uint64_t fnv(const void* data, size_t bytes, uint64_t h) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
  }
  static uint64_t fnv(const std::string& s, uint64_t h) { return fnv(s.data(), s.size(), h); }
  // Every preference row, `chunk` pairs a batch, given to `on_batch(batch,
  // pairs)`; the key of the rows seen and of the model's source.
  template <class OnBatch>
  static Key each_batch(const tf_sdk::Host& host, int64_t chunk, OnBatch&& on_batch) {
    uint64_t h = kFnvOffset;
    for (int64_t first = 0;;) {
      const tf_sdk::Batch b(host, first, chunk);
      const int64_t n = b.pairs();
      if (n == 0) break;
      mix_rows(b, h);
      on_batch(b, n);
      first += n;
    }
    const char* source = host.run_info().model_source;
    return {static_cast<int64_t>(h), static_cast<int64_t>(fnv(source ? source : "", kFnvOffset))};
  }
  // Each row of a preference batch: its id, then its tokens and targets up
  // to its last scored target.
  static void mix_rows(const tf_sdk::Batch& b, uint64_t& h) {
    const at::Tensor tokens = b.tokens().to(at::kCPU, at::kLong).contiguous();
    const at::Tensor targets = b.targets().to(at::kCPU, at::kLong).contiguous();
    const at::Tensor ids = b.row_ids().to(at::kCPU, at::kLong).contiguous();
    const int64_t pairs = b.pairs(), rows = tokens.size(0), width = tokens.size(1);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t* tok = tokens.data_ptr<int64_t>() + r * width;
      const int64_t* tgt = targets.data_ptr<int64_t>() + r * width;
      int64_t len = width;
      while (len > 0 && tgt[len - 1] == kIgnoreIndex) --len;
      const int64_t head[2] = {ids.data_ptr<int64_t>()[r % pairs], len};
      h = fnv(head, sizeof head, h);
      h = fnv(tok, static_cast<size_t>(len) * sizeof(int64_t), h);
      h = fnv(tgt, static_cast<size_t>(len) * sizeof(int64_t), h);
    }
  }

  at::Tensor sums_, counts_;  // [rows, 2] each: a pair's two sequences
  Key key_;
  bool recompute_ = false;
};

// Pairs a precomputing pass scores: half a training batch's rows.
inline int64_t precompute_chunk(const tf_sdk::Host& host) {
  return std::max<int64_t>(1, host.run_info().batch_size / 2);
}

// A checkpoint's table read back (load_state), checked against this run's
// rows and model; false when the checkpoint holds none.
inline bool load_reference_table(const tf_sdk::Host& host, ReferenceModel& model,
                                 PrecomputedReference& table, const std::string& schedule) {
  return table.load(host, precompute_chunk(host), model.adapters(host), schedule);
}

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
  if (step > 0 && !table->recompute())
    throw std::logic_error(schedule + ": no precomputed reference log-probs at step " +
                           std::to_string(step));
  const int64_t chunk = precompute_chunk(host);
  table->compute(host, chunk, [&](const tf_sdk::Batch& b) {
    auto scored = [&](const tf_sdk::PassWeights& w) {
      return PairPasses::whole_batch_reference_logps(b, w);
    };
    return model.adapters(host) ? model.run(host, scored) : scored({});
  });
}

}  // namespace tf_preference
