// Optimizer state kept off the compute device (ZeRO-Offload style): per
// parameter, the optimizer's state tensors live in a host or disk tier and the
// update runs there, on the CPU, where the state is.
//
//   disk: one file per parameter under the offload folder, holding the state
//         tensors back to back (fp32). It is memory-mapped only for the
//         parameter being updated and unmapped after, so at most one
//         parameter's state is resident; the files start as zeros (ftruncate).
//   host: tensors in host memory — pinned on a CUDA run so copies overlap;
//         on a CPU run the host is the compute device (no saving).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace offload {

class StateTier {
 public:
  enum class Kind { host, disk };
  StateTier(Kind kind, std::string dir, bool pinned)
      : kind_(kind), dir_(std::move(dir)), pinned_(pinned) {}

  // Calls fn with the parameter's n_state fp32 CPU tensors shaped `shape`
  // (zero before the first use), writable in place.
  void with_state(const std::string& name, at::IntArrayRef shape, int32_t n_state,
                  const std::function<void(std::vector<at::Tensor>&)>& fn);

  // Parameters that have state in this tier.
  std::vector<std::string> names() const;
  // Bytes held in the tier (files or host tensors).
  int64_t bytes() const { return bytes_; }
  Kind kind() const { return kind_; }

 private:
  struct Entry {
    std::vector<int64_t> shape;
    int32_t n_state = 0;
    std::string path;  // disk
    at::Tensor host;   // host: [n_state, *shape]
  };
  Entry& entry(const std::string& name, at::IntArrayRef shape, int32_t n_state);

  Kind kind_;
  std::string dir_;
  bool pinned_;
  std::map<std::string, Entry> entries_;
  int64_t bytes_ = 0;
};

}  // namespace offload
