#include "training_data.hpp"

namespace tightfit {

Batcher::Batch TrainingData::next_batch() {
  Batcher::Batch b = batcher().next();
  const tf_run_info& info = env_.run_info;
  if (info.world_size > 1) {
    const int64_t rows = b.tokens.size(0) / info.world_size;
    b.tokens = b.tokens.narrow(0, info.rank * rows, rows).contiguous();
    b.targets = b.targets.narrow(0, info.rank * rows, rows).contiguous();
    if (b.positions.defined())
      b.positions = b.positions.narrow(0, info.rank * rows, rows).contiguous();
  }
  return b;
}

}  // namespace tightfit
