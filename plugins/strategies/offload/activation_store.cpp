#include "activation_store.hpp"

#include <cstdio>
#include <stdexcept>

#include "tier_file.hpp"

namespace offload {

ActivationStore::~ActivationStore() {
  clear();
}

uint64_t ActivationStore::pack(int32_t stage, const at::Tensor& x) {
  const uint64_t key = next_++;
  Entry e;
  e.stage = stage;
  e.shape = x.sizes().vec();
  e.dtype = x.scalar_type();
  e.device = x.device();
  // A host copy (pinned on a GPU run); on a CPU run under the disk tier the
  // tensor itself is held only until its file is written.
  at::Tensor host_copy;
  track_([&] {
    host_copy = x.device().is_cpu()
                    ? (disk_ ? x.detach().contiguous() : x.detach().clone())
                    : x.detach().to(at::TensorOptions().device(at::kCPU).pinned_memory(true));
  });
  if (!disk_) {
    e.host = host_copy;
  } else {
    // At most one write in flight: the previous stage's input is on disk
    // before this one's goes, so memory holds at most one pending input.
    if (!entries_.empty() && entries_.rbegin()->second.written.valid())
      entries_.rbegin()->second.written.wait();
    e.path = dir_ + "/activation-" + std::to_string(key) + ".bin";
    const std::string path = e.path;
    // The task drops its reference once written, so the memory goes then.
    e.written =
        std::async(std::launch::async, [path, t = host_copy]() mutable {
          write_tier_file(path, t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size(),
                          TierIo::kBuffered);  // read back within the step
          t = at::Tensor();
        }).share();
  }
  entries_.emplace(key, std::move(e));
  return key;
}

at::Tensor ActivationStore::read(const FileRef& f) const {
  if (f.written.valid()) f.written.get();  // rethrows a failed write
  at::Tensor t;
  track_([&] { t = at::empty(f.shape, at::TensorOptions().dtype(f.dtype).pinned_memory(cuda_)); });
  read_tier_file(f.path, t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  return t;
}

void ActivationStore::prefetch_below(int32_t stage) {
  // Backward unpacks stages in descending order: the next is the highest below.
  Entry* next = nullptr;
  for (auto& [k, e] : entries_)
    if (e.stage < stage && (!next || e.stage > next->stage)) next = &e;
  if (!next || !disk_ || next->prefetched.valid()) return;
  // The task gets its own copy of what it reads: the entry may go first.
  next->prefetched = std::async(std::launch::async, [this, f = FileRef{next->shape, next->dtype,
                                                                       next->path, next->written}] {
                       return read(f);
                     }).share();
}

at::Tensor ActivationStore::unpack(uint64_t key) {
  auto it = entries_.find(key);
  if (it == entries_.end())
    throw std::runtime_error("offload: no activation under key " + std::to_string(key));
  Entry e = std::move(it->second);
  entries_.erase(it);
  at::Tensor host;
  if (!disk_)
    host = e.host;
  else if (e.prefetched.valid())
    host = e.prefetched.get();
  else
    host = read(FileRef{e.shape, e.dtype, e.path, e.written});
  if (disk_) std::remove(e.path.c_str());
  prefetch_below(e.stage);
  at::Tensor out;
  track_([&] { out = e.device.is_cpu() ? host : host.to(e.device, /*non_blocking=*/true); });
  return out;
}

void ActivationStore::clear() {
  for (auto& [k, e] : entries_) {
    if (e.written.valid()) e.written.wait();
    if (e.prefetched.valid()) e.prefetched.wait();
    if (disk_) std::remove(e.path.c_str());
  }
  entries_.clear();
}

}  // namespace offload
