// Offload of frozen weights to a disk tier, streamed stage by stage.
//
// params_ready writes every frozen dense weight of a block stage to a file
// under the run folder and drops it from memory. When a stage begins (in
// forward, recompute or backward) its weights are read back, and the next
// `prefetch` stages in the pass's direction are read on a background thread
// so that reading overlaps compute; when a stage ends in forward or backward
// its weights are dropped again. At most prefetch + 1 stages' weights are
// resident. The kernel's compact linear fetches such a weight again in
// backward instead of keeping it, so nothing pins it.
//
// This session's scope: frozen weights (LoRA bases, or a model trained only
// partly); trainable weights and optimizer state stay where they are, and
// `params = "host"` (pinned host memory for a CUDA device) is not built yet.
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tightfit/plugin_sdk.hpp"

namespace {

namespace fs = std::filesystem;

struct Offloaded {
  std::string path;
  std::vector<int64_t> shape;
  at::ScalarType dtype;
  int32_t stage;
};

struct Offload {
  explicit Offload(tf_sdk::Host h) : host(h) {}
  tf_sdk::Host host;
  std::string device;
  int64_t prefetch = 1;
  std::map<std::string, Offloaded> weights;
  std::map<int32_t, std::vector<std::string>> by_stage;

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

  at::Tensor read(const Offloaded& w) const {
    at::Tensor t = at::empty(w.shape, at::TensorOptions().dtype(w.dtype));
    std::ifstream in(w.path, std::ios::binary);
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * t.element_size()));
    if (!in) throw std::runtime_error("offload: cannot read " + w.path);
    return t;
  }

  // Reads a stage's weights (any thread); counted as weights.
  std::map<std::string, at::Tensor> read_stage(int32_t stage) {
    host.api()->memory_push_category(host.ctx(), TF_MEM_WEIGHTS);
    std::map<std::string, at::Tensor> out;
    try {
      for (const auto& name : by_stage[stage]) out[name] = read(weights.at(name));
    } catch (...) {
      host.api()->memory_pop_category(host.ctx());
      throw;
    }
    host.api()->memory_pop_category(host.ctx());
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
      try {
        loaded = read_stage(stage);
      } catch (const std::exception& e) {
        host.log(TF_LOG_ERROR, e.what());
      }
      lock.lock();
      loading.erase(stage);
      if (!loaded.empty() && !resident.count(stage)) resident[stage] = std::move(loaded);
      cv.notify_all();
    }
  }

  // Makes `stage` resident, waiting for a prefetch in flight or reading now.
  void ensure(int32_t stage) {
    if (!by_stage.count(stage)) return;
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return !loading.count(stage); });
    if (resident.count(stage)) return;
    lock.unlock();
    auto loaded = read_stage(stage);
    lock.lock();
    resident.emplace(stage, std::move(loaded));
  }

  void request(int32_t stage) {
    if (!by_stage.count(stage)) return;
    std::lock_guard<std::mutex> lock(m);
    if (resident.count(stage) || loading.count(stage)) return;
    loading.insert(stage);
    queue.push_back(stage);
    cv.notify_all();
  }

  void evict(int32_t stage) {
    std::lock_guard<std::mutex> lock(m);
    resident.erase(stage);
  }
};

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Offload>(tf_sdk::Host(api, ctx));
    s->device = s->host.run_info().device;
    if (s->host.get_string("params") != "disk")
      throw std::invalid_argument("offload: params = \"" + s->host.get_string("params") +
                                  "\" is not built yet; use params = \"disk\"");
    s->prefetch = s->host.get_int("prefetch");
    *out = s.release();
    return TF_OK;
  });
}

void destroy(void* state) { delete static_cast<Offload*>(state); }

tf_status params_ready(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Offload*>(state);
  const tf_host_api* api = s->host.api();
  return tf_sdk::guard(api, ctx, [&] {
    std::string dir = s->host.get_string("dir");
    if (dir.empty()) dir = (fs::path(s->host.run_info().run_dir) / "offload").string();
    fs::create_directories(dir);
    int64_t bytes = 0;
    const std::vector<std::string> names = s->host.param_names();
    for (size_t i = 0; i < names.size(); ++i) {
      const char* name = names[i].c_str();
      const tf_param_info info = s->host.param_info(names[i]);
      if (info.trainable || info.format != TF_FORMAT_DENSE || info.stage < 0 ||
          s->host.stage_info(info.stage).kind != TF_STAGE_BLOCK)
        continue;
      tf_tensor stored = nullptr;
      s->host.check(api->param_storage(ctx, name, &stored));
      const at::Tensor w = tf_sdk::take(stored).detach().contiguous().cpu();
      Offloaded o{(fs::path(dir) / (std::to_string(i) + ".bin")).string(), w.sizes().vec(), w.scalar_type(), info.stage};
      {
        std::ofstream out(o.path, std::ios::binary | std::ios::trunc);
        out.write(static_cast<const char*>(w.data_ptr()), static_cast<std::streamsize>(w.numel() * w.element_size()));
        if (!out) throw std::runtime_error("offload: cannot write " + o.path);
      }
      bytes += w.numel() * static_cast<int64_t>(w.element_size());
      at::Tensor placeholder = at::empty({0}, w.options());
      s->host.check(api->param_set_storage(ctx, name, reinterpret_cast<tf_tensor>(&placeholder), TF_FORMAT_CUSTOM,
                                           TF_TIER_DISK));
      s->by_stage[info.stage].push_back(name);
      s->weights[name] = std::move(o);
    }
    if (s->weights.empty())
      throw std::invalid_argument("offload: no frozen block weights to offload (trainable weights stay in memory in "
                                  "this version: combine with lora, or freeze stages)");
    s->worker = std::thread([s] { s->worker_loop(); });
    s->host.log(TF_LOG_INFO, "disk tier: " + std::to_string(s->weights.size()) + " weights, " +
                                 std::to_string(bytes >> 20) + " MiB in " + dir);
    return TF_OK;
  });
}

tf_status stage_event(void* state, tf_host_context* ctx, const tf_stage_event* ev) {
  auto* s = static_cast<Offload*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const int32_t dir = ev->phase == TF_PHASE_FORWARD ? 1 : -1;
    if (ev->begin) {
      s->ensure(ev->stage);
      for (int32_t k = 1; k <= s->prefetch; ++k) s->request(ev->stage + dir * k);
    } else if (ev->phase != TF_PHASE_RECOMPUTE) {  // backward of a recomputed stage still needs it
      s->evict(ev->stage);
    }
    return TF_OK;
  });
}

tf_status fetch_weight(void* state, tf_host_context* ctx, const char* name, tf_tensor, tf_tensor* out) {
  auto* s = static_cast<Offload*>(state);
  auto it = s->weights.find(name);
  if (it == s->weights.end()) return TF_NOT_HANDLED;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const int32_t stage = it->second.stage;
    s->ensure(stage);
    std::lock_guard<std::mutex> lock(s->m);
    auto st = s->resident.find(stage);
    at::Tensor w = st != s->resident.end() ? st->second.at(name) : s->read(it->second);
    *out = tf_sdk::give(w.to(at::Device(s->device)));
    return TF_OK;
  });
}

const tf_config_key kKeys[] = {
    tf_sdk::key("params", TF_VALUE_STRING, "\"disk\"", "tier for frozen block weights", 1, 0, "disk|host"),
    tf_sdk::key("prefetch", TF_VALUE_INT, "1", "stages read ahead on a background thread", 0, 64),
    tf_sdk::key("dir", TF_VALUE_STRING, "\"\"", "disk tier folder; empty = <run folder>/offload"),
};

tf_strategy_vtable make_vtable() {
  tf_strategy_vtable v{};
  v.struct_size = sizeof v;
  v.create = create;
  v.destroy = destroy;
  v.params_ready = params_ready;
  v.stage_event = stage_event;
  v.fetch_weight = fetch_weight;
  return v;
}
const tf_strategy_vtable kVtable = make_vtable();

const tf_plugin_descriptor kDescriptor = {
    sizeof(tf_plugin_descriptor), TF_ABI_VERSION, TF_PLUGIN_STRATEGY, "offload", "0.1.0",
    "frozen block weights on a disk tier, streamed stage by stage with background prefetch", TORCH_VERSION, 0, kKeys,
    sizeof(kKeys) / sizeof(kKeys[0]), &kVtable, {}};

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
