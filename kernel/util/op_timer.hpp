// Time spent inside LibTorch operators: the outermost aten op or autograd
// node on each thread, measured through LibTorch's RecordFunction callbacks.
// A step's wall time less this is the time outside LibTorch — the host's and
// plugins' own overhead, and the Python interpreter's for an eager peer
// (bench/throughput.py measures those the same way with torch.profiler).
// Costs about a microsecond per op while installed, so it is on only when a
// recipe asks ([run] profile_ops = true). One at a time per process.
#pragma once

#include <ATen/record_function.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tightfit {

class OpTimer {
 public:
  OpTimer();
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

  // Seconds during which an outermost operator ran on some thread, since
  // made (overlapping ops on several threads count once, so never more than
  // the wall time).
  double seconds() const;
  // The same split by the operator that began each such interval (aten::mm,
  // autograd::engine::evaluate_function: MmBackward0, ...), largest first;
  // the parts add up to seconds().
  std::vector<std::pair<std::string, double>> by_name() const;

 private:
  at::CallbackHandle handle_;
};

}  // namespace tightfit
