// The offload strategy's state (offload.cpp holds its hooks): the params
// tier's files or host copies and the stages read ahead on a worker thread
// (params_tier.cpp), experts brought in on demand, and the optimizer-state
// and activation tiers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
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
#include "tier_file.hpp"
#include "tightfit/plugin_sdk.hpp"
#include "tightfit/scratch_dir.hpp"

namespace offload {

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
  // A frozen expert's weight (TF_PARAM_EXPERT) or a parameter's copy
  // (TF_PARAM_COPY, a reference model's): not brought in with its stage,
  // only when a pass fetches it (the experts its tokens are routed to, the
  // copies a reference pass reads).
  bool on_demand = false;
  bool copy = false;
};

// Whether offload leaves a weight in its tier through its stage's events.
inline bool read_on_demand(const tf_param_info& info) {
  return (info.flags & (TF_PARAM_EXPERT | TF_PARAM_COPY)) != 0 && !info.trainable;
}

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
  TierIo tier_io = TierIo::kDirect;               // how the disk tier's files were written
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
  int64_t on_demand_weights = 0, expert_weights = 0, expert_loads = 0, expert_load_bytes = 0,
          copy_load_bytes = 0;
  // Expert weights read ahead (expert_reads.cpp): those the model says it
  // fetches next (expect_weight, once its router has chosen) and, in a
  // stage's backward, those its forward brought in, last first. At most
  // `expert_prefetch` are read or being read on the worker; the rest wait
  // in `expected` (main thread). What was read is in host memory until
  // brought in, and dropped when the stage's event ends.
  int64_t expert_prefetch = 6;
  std::deque<std::string> expected;
  std::map<int32_t, std::vector<std::string>> forward_order;  // per stage, as brought in
  std::map<int32_t, tf_pass_phase> phase_of;                  // of each stage's running event
  int64_t expert_ahead_hits = 0;                              // brought in read (per step)
  std::string optimizer_tier;                                 // "none" | "host" | "disk"
  std::unique_ptr<offload::StateTier> state;                  // created in params_ready
  std::string activations_tier;                               // "none" | "host" | "disk"
  std::unique_ptr<offload::ActivationStore> activations;      // created in params_ready

  // Loaded weights, by stage; guarded by m.
  std::mutex m;
  std::condition_variable cv;
  std::map<int32_t, std::map<std::string, at::Tensor>> resident;
  std::set<int32_t> loading;
  std::deque<int32_t> queue;
  std::deque<std::string> expert_queue;            // expert weights for the worker to read
  std::set<std::string> expert_loading;            // queued or being read
  std::map<std::string, at::Tensor> expert_ahead;  // read, not brought in yet
  bool stop = false;
  std::thread worker;

  ~Offload();
  // A weight from its tier: its file, read into pinned memory on a CUDA run
  // so that the copy to the device can be asynchronous; or the host copy.
  at::Tensor read(const std::string& name, const Offloaded& w) const;
  // Reads a stage's weights (any thread); counted as weights.
  std::map<std::string, at::Tensor> read_stage(int32_t stage);
  void worker_loop();
  // Makes `stage` resident, waiting for a prefetch in flight or reading now.
  void ensure(int32_t stage);
  void request(int32_t stage);
  // Puts the stage's loaded weights into the store (main thread).
  void swap_in(int32_t stage);
  // An on-demand expert into the store until its stage's event ends: read
  // ahead already, or read now.
  void bring_in(const std::string& name, const Offloaded& w);
  void put_back(const std::string& name);
  // The model will fetch this expert weight next: read it ahead.
  void expect(const std::string& name);
  // Hands expected weights to the worker while fewer than expert_prefetch are ahead.
  void read_ahead();
  // The worker's part: one expert weight from the queue (lock held on entry and exit).
  void read_one_expert(std::unique_lock<std::mutex>& lock);
  // A stage's event begins: in its backward, its forward's experts are expected, last first.
  void expect_for_event(int32_t stage, tf_pass_phase phase);
  // A stage's event ends: what was read ahead for it goes.
  void drop_ahead(int32_t stage);
  // Empty placeholders back into the store; the loaded copies go.
  void swap_out(int32_t stage);
  // Writes the frozen block weights of `stage` (all stages when < 0) that
  // are still in memory to files, leaving placeholders.
  void offload_stage(int32_t stage);
  tf_residency tier() const { return disk ? TF_TIER_DISK : TF_TIER_HOST; }
  // Gives a trained weight's leaf its bytes again from `src` (its tier's
  // copy), without touching its autograd version: tensors autograd saved in
  // forward are the same tensor and must still count as unmodified.
  void fill_leaf(Offloaded& w, const at::Tensor& src);
  // Writes an updated trained weight back to its tier; stale read-ahead
  // copies of its stage are dropped.
  void store_back(const std::string& name, const Offloaded& w);
};

}  // namespace offload
