// The params tier of the offload strategy (offload_state.hpp): weights
// written to files or host copies, read back a stage at a time (ahead, on a
// worker thread), trained weights' bytes freed and refilled in place
// (experts, brought in one by one: expert_reads.cpp).
#include <algorithm>
#include <cstring>
#include <exception>
#include <filesystem>
#include <stdexcept>

#include "offload_state.hpp"
#include "tier_file.hpp"
#include "tightfit/storage_bytes.hpp"

namespace offload {

namespace fs = std::filesystem;
using tf_sdk::allocate_bytes;
using tf_sdk::free_bytes;
using tf_sdk::has_bytes;

Offload::~Offload() {
  {
    std::lock_guard<std::mutex> lock(m);
    stop = true;
  }
  cv.notify_all();
  if (worker.joinable()) worker.join();
}

at::Tensor Offload::read(const std::string& name, const Offloaded& w) const {
  if (!disk) return host_copies.at(name);
  at::Tensor t = at::empty(w.shape, at::TensorOptions().dtype(w.dtype).pinned_memory(cuda));
  read_tier_file(w.path, t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  return t;
}

std::map<std::string, at::Tensor> Offload::read_stage(int32_t stage) {
  const tf_sdk::MemoryCategory weights_scope(host, TF_MEM_WEIGHTS);
  std::map<std::string, at::Tensor> out;
  for (const auto& name : by_stage[stage]) out[name] = read(name, weights.at(name));
  return out;
}

void Offload::worker_loop() {
  std::unique_lock<std::mutex> lock(m);
  for (;;) {
    cv.wait(lock, [&] { return stop || !queue.empty() || !expert_queue.empty(); });
    if (stop) return;
    if (!expert_queue.empty()) {  // needed sooner: inside the running stage
      read_one_expert(lock);
      continue;
    }
    const int32_t stage = queue.front();
    queue.pop_front();
    lock.unlock();
    std::map<std::string, at::Tensor> loaded;
    offload::Upload upload;
    try {
      loaded = read_stage(stage);
      // On a GPU the copy to the device overlaps compute too (side stream).
      if (cuda && !loaded.empty()) {
        upload = offload::upload_async(loaded, at::Device(device));
        loaded = upload.tensors;
      }
    } catch (const std::exception& e) {
      host.log(TF_LOG_ERROR, e.what());
    }
    lock.lock();
    loading.erase(stage);
    if (!loaded.empty() && !resident.count(stage)) {
      resident[stage] = std::move(loaded);
      if (upload.done) uploads[stage] = std::move(upload);
    }
    cv.notify_all();
  }
}

void Offload::ensure(int32_t stage) {
  std::unique_lock<std::mutex> lock(m);
  cv.wait(lock, [&] { return !loading.count(stage); });
  if (resident.count(stage)) return;
  lock.unlock();
  auto loaded = read_stage(stage);
  lock.lock();
  resident.emplace(stage, std::move(loaded));
}

void Offload::request(int32_t stage) {
  if (!by_stage.count(stage) || !worker.joinable()) return;
  std::lock_guard<std::mutex> lock(m);
  if (resident.count(stage) || loading.count(stage)) return;
  loading.insert(stage);
  queue.push_back(stage);
  cv.notify_all();
}

void Offload::swap_in(int32_t stage) {
  ensure(stage);
  std::map<std::string, at::Tensor> loaded;
  offload::Upload upload;
  {
    std::lock_guard<std::mutex> lock(m);
    loaded = resident.at(stage);
    if (auto u = uploads.find(stage); u != uploads.end()) {
      upload = std::move(u->second);
      uploads.erase(u);
    }
  }
  if (upload.done) offload::use_on_current_stream(upload, at::Device(device));
  for (const auto& name : by_stage[stage]) {
    Offloaded& w = weights.at(name);
    at::Tensor t = loaded.at(name);
    if (w.trainable) {
      if (!has_bytes(w.leaf)) fill_leaf(w, t);
      continue;
    }
    if (t.device() != at::Device(device)) t = t.to(at::Device(device), /*non_blocking=*/cuda);
    host.set_param_storage(name, t, w.format, tier());
  }
}

void Offload::swap_out(int32_t stage) {
  drop_ahead(stage);
  for (size_t i = experts_in.size(); i-- > 0;)
    if (weights.at(experts_in[i]).stage == stage) put_back(experts_in[i]);
  for (const auto& name : by_stage[stage]) {
    Offloaded& w = weights.at(name);
    if (w.trainable) {
      if (has_bytes(w.leaf)) {
        if (w.leaf._version() != w.version) store_back(name, w);
        free_bytes(w.leaf);
      }
      continue;
    }
    at::Tensor placeholder = at::empty({0}, at::TensorOptions().dtype(w.dtype));
    host.set_param_storage(name, placeholder, w.format, tier());
  }
  std::lock_guard<std::mutex> lock(m);
  resident.erase(stage);
  uploads.erase(stage);
}

void Offload::offload_stage(int32_t stage) {
  const std::vector<std::string> names = host.param_names();
  for (size_t i = 0; i < names.size(); ++i) {
    const tf_param_info info = host.param_info(names[i]);
    if ((info.trainable && (!offload_trainable || info.format != TF_FORMAT_DENSE)) ||
        info.stage < 0 || (stage >= 0 && info.stage != stage) || info.residency != TF_TIER_DEVICE ||
        info.stored_bytes == 0 || host.stage_info(info.stage).kind != TF_STAGE_BLOCK)
      continue;
    const at::Tensor w = host.param_storage(names[i]).detach().contiguous().cpu();
    Offloaded o{disk ? (fs::path(files()) / (std::to_string(i) + ".bin")).string() : std::string(),
                w.sizes().vec(), w.scalar_type(), info.format, info.stage};
    if (disk) {
      tier_io = write_tier_file(o.path, w.data_ptr(),
                                static_cast<size_t>(w.numel()) * w.element_size(), TierIo::kDirect);
    } else {
      // The host tier: pinned on a CUDA run (asynchronous copies), counted as weights.
      const tf_sdk::MemoryCategory as_weights(host, TF_MEM_WEIGHTS);
      host_copies[names[i]] = cuda ? w.pin_memory() : w.clone();
    }
    offloaded_bytes += w.numel() * static_cast<int64_t>(w.element_size());
    std::vector<std::string>& with_stage = by_stage[info.stage];  // the stage is handled
    o.on_demand = read_on_demand(info);
    o.copy = (info.flags & TF_PARAM_COPY) != 0;
    if (o.on_demand) {
      ++on_demand_weights;
      if (!o.copy) ++expert_weights;
    } else {
      with_stage.push_back(names[i]);
    }
    if (info.trainable) {
      // The parameter stays the same tensor; it is marked as living in the
      // tier and its bytes are freed until its stage runs.
      host.set_param_storage(names[i], host.param_storage(names[i]), TF_FORMAT_DENSE, tier());
      o.trainable = true;
      o.leaf = host.param_storage(names[i]);
      free_bytes(o.leaf);
      weights[names[i]] = std::move(o);
      continue;
    }
    weights[names[i]] = std::move(o);
    at::Tensor placeholder = at::empty({0}, at::TensorOptions().dtype(w.scalar_type()));
    host.set_param_storage(names[i], placeholder, info.format, tier());
  }
}

void Offload::fill_leaf(Offloaded& w, const at::Tensor& src) {
  {
    const tf_sdk::MemoryCategory weights_scope(host, TF_MEM_WEIGHTS);
    allocate_bytes(w.leaf);
  }
  if (w.leaf.device().is_cpu())
    std::memcpy(w.leaf.data_ptr(), src.data_ptr(),
                static_cast<size_t>(src.numel()) * src.element_size());
  else
    w.leaf.variable_data().copy_(src, /*non_blocking=*/cuda);
  w.version = w.leaf._version();
}

void Offload::store_back(const std::string& name, const Offloaded& w) {
  const at::Tensor value = w.leaf.detach().cpu().contiguous();
  if (disk) {
    // Through the page cache: read back at the next step.
    write_tier_file(w.path, value.data_ptr(),
                    static_cast<size_t>(value.numel()) * value.element_size(), TierIo::kBuffered);
  } else {
    host_copies.at(name).copy_(value);
  }
  std::lock_guard<std::mutex> lock(m);
  resident.erase(w.stage);
}

}  // namespace offload
