// Offload: weights and optimizer state kept off the compute device.
//
// Frozen block weights (`params = "disk"`), in whatever format they are
// stored (dense, or int8/NF4 codes when quantize comes first in the recipe):
// each stage's weights are written to files under the run folder as soon as
// the stage exists (stage_params_ready, so a model larger than memory is
// never whole) and replaced by empty placeholders; the parameter's residency
// says "disk". When a stage's event begins (forward, recompute, backward, or
// an access outside a pass) its weights are swapped back into the store, and
// the next `prefetch` stages in the pass's direction are read on a background
// thread so that reading overlaps compute; when the stage ends in forward or
// backward they are swapped out again. At most prefetch + 1 stages' weights
// are resident. The kernel's compact linear fetches such a weight again in
// backward instead of keeping it, so nothing pins it; other strategies
// (quantize's dequantization) see the swapped-in storage as usual.
//
// `optimizer = "disk" | "host"` keeps the optimizer state of trainable
// parameters in that tier and runs their update there (state_tier.hpp): the
// kernel hands each update to optimizer_step_param, which brings the
// parameter and its gradient to the CPU when they are elsewhere, applies the
// run's optimizer with the tier's state (the host's optimizer_update, so the
// maths is the kernel's own) and copies the parameter back. Exact: the same
// weights as the plain run.
//
// `params = "host"` keeps the weights in host memory instead (pinned on a
// CUDA run); on a GPU, prefetched stages are also copied to the device on a
// side stream (device_upload.hpp), and the main stream waits on the copy's
// event before the stage uses them.
//
// `activations = "disk" | "host"` (with checkpoint) moves the input each
// recomputed stage keeps until backward (activation_store.hpp): written
// behind the forward pass, read back one stage ahead in backward.
//
// `trainable = true` moves trained block weights too (ZeRO-Infinity style):
// such a parameter stays the same autograd leaf and only its bytes come and
// go (free_bytes / fill_leaf), so gradients land on it and tensors autograd
// saved in forward see the same, unmodified tensor in backward. Its update
// runs in optimizer_step_param (hence optimizer = "disk" | "host"), bringing
// the bytes in when its stage is not running and writing them back.
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "activation_store.hpp"
#include "device_upload.hpp"
#include "state_tier.hpp"
#include "tightfit/plugin_sdk.hpp"
#include "tightfit/scratch_dir.hpp"
#include "tightfit/storage_bytes.hpp"

namespace {

namespace fs = std::filesystem;

struct Offloaded {
  std::string path;
  std::vector<int64_t> shape;  // of the stored tensor (the codes, for compact formats)
  at::ScalarType dtype;
  tf_param_format format;
  int32_t stage;
  // A trained weight keeps its autograd leaf (gradients land on it); only
  // the leaf's bytes come and go. `version` is the leaf's at swap-in: a
  // change means it was updated in place and goes back to the tier.
  bool trainable = false;
  at::Tensor leaf;
  int64_t version = -1;
  // A frozen expert's weight (TF_PARAM_EXPERT): not brought in with its
  // stage, only when the model fetches it for the tokens routed to it.
  bool on_demand = false;
};

using tf_sdk::allocate_bytes;
using tf_sdk::free_bytes;
using tf_sdk::has_bytes;

struct Offload {
  explicit Offload(tf_sdk::Host h) : host(h) {}
  tf_sdk::Host host;
  // The disk tier's files live in a private folder of this run's inside
  // `dir` (declared first: removed after every store that writes in it).
  tf_sdk::ScratchDir scratch;
  const std::string& files() { return scratch.ensure(dir, "tightfit-offload-"); }
  std::string device;
  bool cuda = false;
  int64_t prefetch = 1;
  bool offload_params = true;
  bool offload_trainable = false;                 // trained block weights too
  bool disk = true;                               // params tier: files, or host memory
  std::map<std::string, at::Tensor> host_copies;  // params = "host": the tier itself
  std::map<int32_t, offload::Upload> uploads;     // CUDA: stages being copied on a side stream
  std::string dir;
  int64_t offloaded_bytes = 0;
  std::map<std::string, Offloaded> weights;
  std::map<int32_t, std::vector<std::string>> by_stage;  // brought in with their stage
  // Experts brought in on demand (want_weight), most recent last: at most
  // kExpertsResident at once, and none after their stage's event; counted
  // per optimizer step and logged.
  static constexpr size_t kExpertsResident = 6;  // two experts' gate, up and down
  std::deque<std::string> experts_in;
  int64_t on_demand_weights = 0, expert_loads = 0, expert_load_bytes = 0;
  std::string optimizer_tier;                             // "none" | "host" | "disk"
  std::unique_ptr<offload::StateTier> state;              // created in params_ready
  std::string activations_tier;                           // "none" | "host" | "disk"
  std::unique_ptr<offload::ActivationStore> activations;  // created in params_ready

  // Loaded weights, by stage; guarded by m.
  std::mutex m;
  std::condition_variable cv;
  std::map<int32_t, std::map<std::string, at::Tensor>> resident;
  std::set<int32_t> loading;
  std::deque<int32_t> queue;
  bool stop = false;
  std::thread worker;

  ~Offload() {
    {
      std::lock_guard<std::mutex> lock(m);
      stop = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
  }

  // A weight from its tier: its file, read into pinned memory on a CUDA run
  // so that the copy to the device can be asynchronous; or the host copy.
  at::Tensor read(const std::string& name, const Offloaded& w) const {
    if (!disk) return host_copies.at(name);
    at::Tensor t = at::empty(w.shape, at::TensorOptions().dtype(w.dtype).pinned_memory(cuda));
    std::ifstream in(w.path, std::ios::binary);
    in.read(static_cast<char*>(t.data_ptr()),
            static_cast<std::streamsize>(t.numel() * t.element_size()));
    if (!in) throw std::runtime_error("offload: cannot read " + w.path);
    return t;
  }

  // Reads a stage's weights (any thread); counted as weights.
  std::map<std::string, at::Tensor> read_stage(int32_t stage) {
    const tf_sdk::MemoryCategory weights_scope(host, TF_MEM_WEIGHTS);
    std::map<std::string, at::Tensor> out;
    for (const auto& name : by_stage[stage]) out[name] = read(name, weights.at(name));
    return out;
  }

  void worker_loop() {
    std::unique_lock<std::mutex> lock(m);
    for (;;) {
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (stop) return;
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

  // Makes `stage` resident, waiting for a prefetch in flight or reading now.
  void ensure(int32_t stage) {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return !loading.count(stage); });
    if (resident.count(stage)) return;
    lock.unlock();
    auto loaded = read_stage(stage);
    lock.lock();
    resident.emplace(stage, std::move(loaded));
  }

  void request(int32_t stage) {
    if (!by_stage.count(stage) || !worker.joinable()) return;
    std::lock_guard<std::mutex> lock(m);
    if (resident.count(stage) || loading.count(stage)) return;
    loading.insert(stage);
    queue.push_back(stage);
    cv.notify_all();
  }

  // Puts the stage's loaded weights into the store (main thread).
  void swap_in(int32_t stage) {
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

  // An on-demand expert into the store until its stage's event ends.
  void bring_in(const std::string& name, const Offloaded& w) {
    at::Tensor t;
    {
      const tf_sdk::MemoryCategory weights_scope(host, TF_MEM_WEIGHTS);
      t = read(name, w);
      if (t.device() != at::Device(device)) t = t.to(at::Device(device));
    }
    // The fetch that asked holds its own reference to what it uses, so the
    // least recent expert can go back to the tier now.
    while (experts_in.size() >= kExpertsResident) put_back(experts_in.front());
    host.set_param_storage(name, t, w.format, tier());
    experts_in.push_back(name);
    ++expert_loads;
    expert_load_bytes += t.numel() * static_cast<int64_t>(t.element_size());
  }

  void put_back(const std::string& name) {
    const Offloaded& w = weights.at(name);
    host.set_param_storage(name, at::empty({0}, at::TensorOptions().dtype(w.dtype)), w.format,
                           tier());
    experts_in.erase(std::find(experts_in.begin(), experts_in.end(), name));
  }

  // Empty placeholders back into the store; the loaded copies go.
  void swap_out(int32_t stage) {
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

  // Writes the frozen block weights of `stage` (all stages when < 0) that
  // are still in memory to files, leaving placeholders.
  void offload_stage(int32_t stage) {
    const std::vector<std::string> names = host.param_names();
    for (size_t i = 0; i < names.size(); ++i) {
      const tf_param_info info = host.param_info(names[i]);
      if ((info.trainable && (!offload_trainable || info.format != TF_FORMAT_DENSE)) ||
          info.stage < 0 || (stage >= 0 && info.stage != stage) ||
          info.residency != TF_TIER_DEVICE || info.stored_bytes == 0 ||
          host.stage_info(info.stage).kind != TF_STAGE_BLOCK)
        continue;
      const at::Tensor w = host.param_storage(names[i]).detach().contiguous().cpu();
      Offloaded o{
          disk ? (fs::path(files()) / (std::to_string(i) + ".bin")).string() : std::string(),
          w.sizes().vec(), w.scalar_type(), info.format, info.stage};
      if (disk) {
        std::ofstream out(o.path, std::ios::binary | std::ios::trunc);
        out.write(static_cast<const char*>(w.data_ptr()),
                  static_cast<std::streamsize>(w.numel() * w.element_size()));
        if (!out)
          throw std::runtime_error("offload: cannot write " + o.path +
                                   " (disk full? set offload.dir)");
      } else {
        // The host tier: pinned on a CUDA run (asynchronous copies), counted as weights.
        const tf_sdk::MemoryCategory as_weights(host, TF_MEM_WEIGHTS);
        host_copies[names[i]] = cuda ? w.pin_memory() : w.clone();
      }
      offloaded_bytes += w.numel() * static_cast<int64_t>(w.element_size());
      std::vector<std::string>& with_stage = by_stage[info.stage];  // the stage is handled
      o.on_demand = (info.flags & TF_PARAM_EXPERT) != 0 && !info.trainable;
      if (o.on_demand)
        ++on_demand_weights;
      else
        with_stage.push_back(names[i]);
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

  tf_residency tier() const { return disk ? TF_TIER_DISK : TF_TIER_HOST; }

  // Gives a trained weight's leaf its bytes again from `src` (its tier's
  // copy), without touching its autograd version: tensors autograd saved in
  // forward are the same tensor and must still count as unmodified.
  void fill_leaf(Offloaded& w, const at::Tensor& src) {
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

  // Writes an updated trained weight back to its tier; stale read-ahead
  // copies of its stage are dropped.
  void store_back(const std::string& name, const Offloaded& w) {
    const at::Tensor value = w.leaf.detach().cpu().contiguous();
    if (disk) {
      std::ofstream out(w.path, std::ios::binary | std::ios::trunc);
      out.write(static_cast<const char*>(value.data_ptr()),
                static_cast<std::streamsize>(value.numel() * value.element_size()));
      if (!out)
        throw std::runtime_error("offload: cannot write " + w.path +
                                 " (disk full? set offload.dir)");
    } else {
      host_copies.at(name).copy_(value);
    }
    std::lock_guard<std::mutex> lock(m);
    resident.erase(w.stage);
  }
};

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Offload>(tf_sdk::Host(api, ctx));
    s->device = s->host.run_info().device;
    s->cuda = s->device.rfind("cuda", 0) == 0;
    const std::string params = s->host.get_string("params");
    s->offload_params = params != "none";
    s->offload_trainable = s->offload_params && s->host.get_bool("trainable");
    if (s->offload_trainable && s->host.get_string("optimizer") == "none")
      throw std::invalid_argument(
          "offload: trainable = true needs optimizer = \"disk\" or \"host\": a trained weight kept "
          "in a tier "
          "is updated where it is brought in, with its optimizer state");
    s->disk = params == "disk";
    if (params == "host" && !s->cuda)
      s->host.log(
          TF_LOG_WARN,
          "offload: params = \"host\" on a CPU run keeps the weights in the same memory (no "
          "saving); params = \"disk\" is the saving here");
    s->optimizer_tier = s->host.get_string("optimizer");
    s->activations_tier = s->host.get_string("activations");
    if (!s->offload_params && s->optimizer_tier == "none" && s->activations_tier == "none")
      throw std::invalid_argument(
          "offload: params, optimizer and activations are all \"none\": nothing to offload");
    s->prefetch = s->host.get_int("prefetch");
    s->dir = s->host.get_string("dir");
    if (s->dir.empty()) s->dir = (fs::path(s->host.run_info().run_dir) / "offload").string();
    *out = s.release();
    return TF_OK;
  });
}

// Streaming setup: a stage's frozen weights leave memory as soon as they exist.
tf_status stage_params_ready(void* state, tf_host_context* ctx, int32_t stage) {
  auto* s = static_cast<Offload*>(state);
  if (!s->offload_params || stage < 0) return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->offload_stage(stage);
    return TF_OK;
  });
}

tf_status params_ready(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Offload*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    if (s->optimizer_tier != "none") {
      if (s->optimizer_tier == "host" && !s->cuda)
        s->host.log(TF_LOG_WARN,
                    "offload: optimizer = \"host\" on a CPU run keeps the state in the same memory "
                    "(no saving); optimizer = \"disk\" is the saving here");
      s->state = std::make_unique<offload::StateTier>(
          s->optimizer_tier == "disk" ? offload::StateTier::Kind::disk
                                      : offload::StateTier::Kind::host,
          s->optimizer_tier == "disk" ? s->files() : "", s->cuda);
    }
    if (s->activations_tier != "none") {
      bool recomputed = false;
      for (int32_t i = 0; i < s->host.stage_count(); ++i)
        recomputed |= s->host.stage_info(i).recompute != 0;
      if (!recomputed)
        throw std::invalid_argument(
            "offload: activations = \"" + s->activations_tier +
            "\" moves the inputs that checkpointed stages keep for their recompute, and no "
            "stage is checkpointed; add [[strategy]] plugin = \"checkpoint\"");
      if (s->activations_tier == "host" && !s->cuda)
        s->host.log(
            TF_LOG_WARN,
            "offload: activations = \"host\" on a CPU run keeps them in the same memory (no "
            "saving); activations = \"disk\" is the saving here");
      const tf_host_api* api = s->host.api();
      s->activations = std::make_unique<offload::ActivationStore>(
          s->activations_tier == "disk", s->activations_tier == "disk" ? s->files() : std::string(),
          // Raw calls, unchecked: this runs on the store's own thread too,
          // where a refused category costs only the attribution.
          s->cuda, [api, ctx](const std::function<void()>& f) {
            api->memory_push_category(ctx, TF_MEM_ACTIVATIONS);
            try {
              f();
            } catch (...) {
              api->memory_pop_category(ctx);
              throw;
            }
            api->memory_pop_category(ctx);
          });
    }
    if (s->offload_params) s->offload_stage(-1);
    if (s->offload_params && s->weights.empty() && !s->state && !s->activations)
      throw std::invalid_argument(
          "offload: no frozen block weights to offload (trainable weights stay in memory in "
          "this version: combine with lora, freeze stages, or offload the optimizer state "
          "with optimizer = \"disk\")");
    if (!s->weights.empty()) {
      s->worker = std::thread([s] { s->worker_loop(); });
      s->host.log(
          TF_LOG_INFO,
          std::string(s->disk ? "disk" : "host") + " tier: " + std::to_string(s->weights.size()) +
              " weights, " + std::to_string(s->offloaded_bytes >> 20) + " MiB" +
              (s->disk ? " in " + s->dir : std::string()) +
              (s->on_demand_weights > 0 ? "; " + std::to_string(s->on_demand_weights) +
                                              " expert weights brought in only when a batch is "
                                              "routed to them"
                                        : std::string()));
    }
    return TF_OK;
  });
}

tf_status stage_event(void* state, tf_host_context* ctx, const tf_stage_event* ev) {
  auto* s = static_cast<Offload*>(state);
  // A new forward: activations of a pass whose backward never came are stale.
  if (s->activations && ev->phase == TF_PHASE_FORWARD && ev->begin && ev->stage == 0 &&
      s->activations->size())
    s->activations->clear();
  if (!s->by_stage.count(ev->stage)) {
    // Nothing of this stage is offloaded; still read ahead for the next ones.
    if (ev->begin && ev->phase != TF_PHASE_ACCESS) {
      const int32_t dir = ev->phase == TF_PHASE_FORWARD ? 1 : -1;
      for (int32_t k = 1; k <= s->prefetch; ++k) s->request(ev->stage + dir * k);
    }
    return TF_OK;
  }
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const int32_t dir = ev->phase == TF_PHASE_FORWARD ? 1 : -1;
    if (ev->begin) {
      s->swap_in(ev->stage);
      if (ev->phase != TF_PHASE_ACCESS)
        for (int32_t k = 1; k <= s->prefetch; ++k) s->request(ev->stage + dir * k);
    } else if (ev->phase != TF_PHASE_RECOMPUTE) {  // backward of a recomputed stage still needs it
      s->swap_out(ev->stage);
    }
    return TF_OK;
  });
}

// An expert the model fetches for the tokens routed to it (ABI 1.15).
tf_status want_weight(void* state, tf_host_context* ctx, const char* name) {
  auto* s = static_cast<Offload*>(state);
  const auto it = s->weights.find(name);
  if (it == s->weights.end() || !it->second.on_demand) return TF_NOT_HANDLED;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->bring_in(it->first, it->second);
    return TF_OK;
  });
}

// The experts brought in during the step (forward, recompute and backward
// each count), as metrics: how much of the expert weights the batches used.
tf_status step_begin(void* state, tf_host_context*, int64_t) {
  auto* s = static_cast<Offload*>(state);
  s->expert_loads = s->expert_load_bytes = 0;  // reads outside a step are not its own
  return TF_OK;
}

tf_status step_end(void* state, tf_host_context* ctx, int64_t, double) {
  auto* s = static_cast<Offload*>(state);
  if (s->on_demand_weights == 0) return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->host.log_metric("expert_loads", static_cast<double>(s->expert_loads));
    s->host.log_metric("expert_mib", static_cast<double>(s->expert_load_bytes) / (1 << 20));
    s->expert_loads = s->expert_load_bytes = 0;
    return TF_OK;
  });
}

tf_status pack_activation(void* state, tf_host_context* ctx, int32_t stage, tf_tensor x,
                          uint64_t* key) {
  auto* s = static_cast<Offload*>(state);
  if (!s->activations) return TF_NOT_HANDLED;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    *key = s->activations->pack(stage, tf_sdk::borrow(x));
    return TF_OK;
  });
}

tf_status unpack_activation(void* state, tf_host_context* ctx, int32_t, uint64_t key,
                            tf_tensor* out) {
  auto* s = static_cast<Offload*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    if (!s->activations)
      throw std::logic_error("offload: unpack_activation without an activation tier");
    *out = tf_sdk::give(s->activations->unpack(key));
    return TF_OK;
  });
}

int32_t state_slots(const Offload& s) {
  return s.host.optimizer_info().n_state;
}

// The update of a trainable parameter where its optimizer state lives.
tf_status optimizer_step_param(void* state, tf_host_context* ctx, const char* name,
                               tf_tensor param_h, tf_tensor grad_h, double) {
  auto* s = static_cast<Offload*>(state);
  if (!s->state) return TF_NOT_HANDLED;
  const tf_host_api* api = s->host.api();
  return tf_sdk::guard(api, ctx, [&] {
    const int32_t n = state_slots(*s);
    if (n == 0) return TF_NOT_HANDLED;  // plain SGD keeps no state
    at::NoGradGuard no_grad;
    const at::Tensor& param = tf_sdk::borrow(param_h);
    const at::Tensor& grad = tf_sdk::borrow(grad_h);
    // A trained weight in the tier whose stage is not running: bring its
    // bytes in for the update, then write it back and free them again.
    Offloaded* away = nullptr;
    if (auto w = s->weights.find(name);
        w != s->weights.end() && w->second.trainable && !has_bytes(w->second.leaf)) {
      away = &w->second;
      s->fill_leaf(*away, s->read(name, *away));
    }
    const bool here = param.device().is_cpu();
    const tf_sdk::MemoryCategory transient(s->host, TF_MEM_TRANSIENT);
    // On an accelerator, the update runs on host copies (CPU Adam, as ZeRO-Offload does).
    at::Tensor p = here ? param.detach() : param.detach().to(at::kCPU);
    at::Tensor g = here ? grad : grad.to(at::kCPU);
    s->state->with_state(name, param.sizes(), n, [&](std::vector<at::Tensor>& slots) {
      s->host.optimizer_update(name, p, g, slots);
    });
    if (!here) param.detach().copy_(p);
    if (away) {  // (after a failure the run stops; the bytes may stay until then)
      s->store_back(name, *away);
      free_bytes(away->leaf);
    }
    return TF_OK;
  });
}

// The tier's state goes into checkpoints like the kernel's own.
tf_status save_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Offload*>(state);
  if (!s->state) return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const int32_t n = state_slots(*s);
    for (const auto& name : s->state->names()) {
      const tf_param_info info = s->host.param_info(name);
      s->state->with_state(name, at::IntArrayRef(info.shape, info.ndim), n,
                           [&](std::vector<at::Tensor>& slots) {
                             for (int32_t i = 0; i < n; ++i)
                               s->host.save_tensor(name + ".state" + std::to_string(i), slots[i]);
                           });
    }
    return TF_OK;
  });
}

tf_status load_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Offload*>(state);
  if (!s->state) return TF_OK;
  const tf_host_api* api = s->host.api();
  return tf_sdk::guard(api, ctx, [&] {
    const int32_t n = state_slots(*s);
    for (const auto& name : s->host.param_names()) {
      const tf_param_info info = s->host.param_info(name);
      if (!info.trainable || n == 0) continue;
      std::vector<at::Tensor> saved;
      for (int32_t i = 0; i < n; ++i) {
        std::optional<at::Tensor> slot =
            s->host.find_saved_tensor(name + ".state" + std::to_string(i));
        if (!slot) break;
        saved.push_back(std::move(*slot));
      }
      if (saved.empty()) continue;  // never updated before the checkpoint
      if (static_cast<int32_t>(saved.size()) != n)
        throw std::runtime_error("offload: the checkpoint has " + std::to_string(saved.size()) +
                                 " of " + std::to_string(n) + " optimizer state tensors for " +
                                 name);
      s->state->with_state(name, at::IntArrayRef(info.shape, info.ndim), n,
                           [&](std::vector<at::Tensor>& slots) {
                             for (int32_t i = 0; i < n; ++i) slots[i].copy_(saved[i]);
                           });
    }
    return TF_OK;
  });
}

// Frozen block weights and/or the optimizer state leave the device tier; a
// stage's weights come back while it computes, with `prefetch` more stages
// on their way. Before the weights are offloaded (a plan made from the
// recipe) the same selection is made from the declarations, at their
// declared (dense) size.
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary* model,
                          tf_memory_estimate* out) {
  auto* s = static_cast<Offload*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    std::map<int32_t, int64_t> stage_bytes;
    int64_t moved_experts = 0, largest_expert = 0;  // on demand, not with their stage
    if (s->offload_params) {
      for (const std::string& name : s->host.param_names()) {
        const tf_param_info info = s->host.param_info(name);
        if ((info.trainable && (!s->offload_trainable || info.format != TF_FORMAT_DENSE)) ||
            info.stage < 0 || s->host.stage_info(info.stage).kind != TF_STAGE_BLOCK ||
            s->host.stage_info(info.stage).skip)
          continue;
        // In a plan: what earlier strategies planned for it (4-bit after
        // quantize), moved to this tier in the table.
        const bool on_demand = (info.flags & TF_PARAM_EXPERT) != 0 && !info.trainable;
        int64_t bytes = info.stored_bytes > 0 ? info.stored_bytes : tf_sdk::dense_bytes(info);
        if (s->host.has_param_plan() && s->offloaded_bytes == 0) {
          const tf_param_plan p = s->host.planned(name);
          if (p.tier != TF_TIER_DEVICE) continue;
          bytes = p.bytes;
          s->host.plan(name, p.bytes, p.format, s->tier());
        }
        if (on_demand) {
          moved_experts += bytes;
          largest_expert = std::max(largest_expert, bytes);
          continue;
        }
        stage_bytes[info.stage] += bytes;
      }
    }
    int64_t moved = s->offloaded_bytes + (s->offloaded_bytes == 0 ? moved_experts : 0), largest = 0;
    for (const auto& [stage, bytes] : stage_bytes) {
      if (s->offloaded_bytes == 0) moved += bytes;
      largest = std::max(largest, bytes);
    }
    if (!s->host.has_param_plan() || s->offloaded_bytes > 0) {  // as a weights delta
      out->delta_bytes[TF_TIER_DEVICE][TF_MEM_WEIGHTS] -= moved;
      out->delta_bytes[s->tier()][TF_MEM_WEIGHTS] += moved;
    }
    // Stages in flight with their weights, and the experts resident at once.
    out->delta_bytes[TF_TIER_DEVICE][TF_MEM_TRANSIENT] +=
        (1 + s->prefetch) * largest +
        static_cast<int64_t>(Offload::kExpertsResident) * largest_expert;
    if (s->optimizer_tier != "none") {
      const int64_t bytes = 4 * state_slots(*s) * model->n_trainable;
      out->delta_bytes[TF_TIER_DEVICE][TF_MEM_OPTIMIZER] -= bytes;
      out->delta_bytes[s->optimizer_tier == "disk" ? TF_TIER_DISK : TF_TIER_HOST]
                      [TF_MEM_OPTIMIZER] += bytes;
    }
    if (s->activations_tier != "none" &&
        TF_SDK_REACHES(out, tf_memory_estimate, recompute_inputs_tier))
      out->recompute_inputs_tier = s->activations_tier == "disk" ? TF_TIER_DISK : TF_TIER_HOST;
    out->time_factor = 0;
    out->time_from_plan = 1;  // tightfit fit prices it from the plan
    return TF_OK;
  });
}

const tf_config_key kKeys[] = {
    tf_sdk::key("params", TF_VALUE_STRING, "\"disk\"",
                "tier for frozen block weights (none: leave them)", 1, 0, "disk|host|none"),
    tf_sdk::key("optimizer", TF_VALUE_STRING, "\"none\"",
                "tier for the optimizer state of trainable weights, updated there (ZeRO-Offload)",
                1, 0, "none|host|disk"),
    tf_sdk::key("activations", TF_VALUE_STRING, "\"none\"",
                "tier for the inputs checkpointed stages keep until backward (needs checkpoint)", 1,
                0, "none|host|disk"),
    tf_sdk::key("trainable", TF_VALUE_BOOL, "false",
                "params tier also for trained block weights (needs optimizer = disk|host)"),
    tf_sdk::key("prefetch", TF_VALUE_INT, "1", "stages read ahead on a background thread", 0, 64),
    tf_sdk::key("dir", TF_VALUE_STRING, "\"\"", "disk tier folder; empty = <run folder>/offload"),
};

const tf_strategy_vtable kVtable = {.struct_size = sizeof(tf_strategy_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<Offload>,
                                    .params_ready = params_ready,
                                    .step_begin = step_begin,
                                    .step_end = step_end,
                                    .stage_event = stage_event,
                                    .optimizer_step_param = optimizer_step_param,
                                    .estimate_memory = estimate_memory,
                                    .save_state = save_state,
                                    .load_state = load_state,
                                    .stage_params_ready = stage_params_ready,
                                    .pack_activation = pack_activation,
                                    .unpack_activation = unpack_activation,
                                    .want_weight = want_weight};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_STRATEGY, "offload", "0.2.0",
    "frozen block weights on a disk tier streamed with prefetch; optimizer state on a host/disk "
    "tier, updated there",
    kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
