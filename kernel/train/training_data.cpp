#include "training_data.hpp"

namespace tightfit {

Batcher::Batch TrainingData::next_batch() {
  Batcher::Batch b = batcher().next();
  const tf_run_info& info = env_.run_info;
  if (info.world_size <= 1) return b;
  // This rank's rows: a share of the batch, or of the chosen rows and the
  // same share of the rejected ones, so that pairs stay together.
  auto mine = [&](const at::Tensor& t) {
    if (!t.defined()) return t;
    if (b.pairs == 0) {
      const int64_t rows = t.size(0) / info.world_size;
      return t.narrow(0, info.rank * rows, rows).contiguous();
    }
    const int64_t rows = b.pairs / info.world_size;
    return at::cat(
               {t.narrow(0, info.rank * rows, rows), t.narrow(0, b.pairs + info.rank * rows, rows)})
        .contiguous();
  };
  b.tokens = mine(b.tokens);
  b.targets = mine(b.targets);
  b.positions = mine(b.positions);
  b.attention_mask = mine(b.attention_mask);
  b.answer_first = mine(b.answer_first);
  // Per pair, or per prompt (a batch of prompts is one row each).
  const int64_t units = b.pairs > 0 ? b.pairs : b.prompts;
  for (at::Tensor* per_pair : {&b.desirable, &b.row_ids})
    if (per_pair->defined()) {
      const int64_t rows = units / info.world_size;
      *per_pair = per_pair->narrow(0, info.rank * rows, rows).contiguous();
    }
  if (b.pairs > 0) b.pairs /= info.world_size;
  if (b.prompts > 0) b.prompts /= info.world_size;
  return b;
}

}  // namespace tightfit
