// How many LibTorch operators run: every aten op dispatched on any thread,
// counted by name through LibTorch's RecordFunction callbacks, and how many
// of them were outermost on their thread (the ops a caller dispatched, not
// those an aten op ran inside itself; autograd's own records are not ops). A step's count is what a
// GPU launches at most (tests/test_step_ops.cpp pins it); `aten::_local_scalar_dense` is
// Tensor::item(), a read by the host (host_reads.hpp). Costs about a
// microsecond per op while installed. One at a time per process.
#pragma once

#include <ATen/record_function.h>

#include <cstdint>
#include <map>
#include <string>

namespace tightfit {

class OpCounter {
 public:
  OpCounter();
  ~OpCounter();
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;

  struct Counts {
    int64_t all = 0;                         // every op, nested ones included
    int64_t outermost = 0;                   // ops not run inside another op on their thread
    std::map<std::string, int64_t> by_name;  // every op, by name
    std::map<std::string, int64_t> outermost_by_name;  // the outermost ones, by name
    int64_t of(const std::string& name) const {
      const auto it = by_name.find(name);
      return it == by_name.end() ? 0 : it->second;
    }
  };
  // The counts since made.
  Counts counts() const;

 private:
  at::CallbackHandle handle_;
};

// b - a, name by name (names absent from b count 0).
OpCounter::Counts operator-(const OpCounter::Counts& b, const OpCounter::Counts& a);

}  // namespace tightfit
