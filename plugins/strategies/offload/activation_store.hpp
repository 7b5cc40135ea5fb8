// Offloaded activations: the input each checkpointed stage keeps from forward
// to its recompute in backward, held in host memory (pinned on a CUDA run)
// or in files. Files are written behind the forward pass on a background
// task; in backward, unpacking a stage's input starts reading the next one
// back (the next stage down), so reads overlap the recompute.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <future>
#include <map>
#include <string>
#include <vector>

namespace offload {

class ActivationStore {
 public:
  // `track` runs a callable with the host's memory category for activations
  // pushed on the calling thread (the background tasks' allocations count).
  ActivationStore(bool disk, std::string dir, bool cuda,
                  std::function<void(const std::function<void()>&)> track)
      : disk_(disk), dir_(std::move(dir)), cuda_(cuda), track_(std::move(track)) {}
  ~ActivationStore();

  uint64_t pack(int32_t stage, const at::Tensor& x);
  at::Tensor unpack(uint64_t key);
  // Drops everything (a forward whose backward never came).
  void clear();
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    int32_t stage = 0;
    std::vector<int64_t> shape;
    at::ScalarType dtype = at::kFloat;
    at::Device device{at::kCPU};
    at::Tensor host;   // host tier, or the copy being written
    std::string path;  // disk tier
    std::shared_future<void> written;
    std::shared_future<at::Tensor> prefetched;
  };
  struct FileRef {
    std::vector<int64_t> shape;
    at::ScalarType dtype;
    std::string path;
    std::shared_future<void> written;
  };
  at::Tensor read(const FileRef& f) const;
  void prefetch_below(int32_t stage);

  bool disk_;
  std::string dir_;
  bool cuda_;
  std::function<void(const std::function<void()>&)> track_;
  std::map<uint64_t, Entry> entries_;
  uint64_t next_ = 1;
};

}  // namespace offload
