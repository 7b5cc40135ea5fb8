// The offload strategy's experts (offload_state.hpp): a frozen expert's
// weight stays in the tier through its stage's event and comes in when the
// model fetches it for the tokens routed to it (want_weight, ABI 1.15), at
// most kExpertsResident at once. Once the router has chosen, the model says
// which weights it fetches next (expect_weight, ABI 1.17), and the worker
// reads the disk tier's files ahead, up to expert_prefetch weights, so a
// fetch finds its weight read while the expert before it computes; a
// stage's backward fetches what its forward did, and its forward's order,
// last first, is read ahead then.
#include <algorithm>
#include <exception>

#include "offload_state.hpp"

namespace offload {

void Offload::bring_in(const std::string& name, const Offloaded& w) {
  at::Tensor t;
  {
    std::unique_lock<std::mutex> lock(m);
    // Still queued behind others: read here now; being read: wait for it.
    if (const auto q = std::find(expert_queue.begin(), expert_queue.end(), name);
        q != expert_queue.end()) {
      expert_queue.erase(q);
      expert_loading.erase(name);
    }
    cv.wait(lock, [&] { return !expert_loading.count(name); });
    if (auto it = expert_ahead.find(name); it != expert_ahead.end()) {
      t = std::move(it->second);
      expert_ahead.erase(it);
      ++expert_ahead_hits;
    }
  }
  expected.erase(std::remove(expected.begin(), expected.end(), name), expected.end());
  {
    const tf_sdk::MemoryCategory weights_scope(host, TF_MEM_WEIGHTS);
    if (!t.defined()) t = read(name, w);
    if (t.device() != at::Device(device)) t = t.to(at::Device(device));
  }
  // The fetch that asked holds its own reference to what it uses, so the
  // least recent expert can go back to the tier now.
  while (experts_in.size() >= kExpertsResident) put_back(experts_in.front());
  host.set_param_storage(name, t, w.format, tier());
  experts_in.push_back(name);
  const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
  if (w.copy) {
    copy_load_bytes += bytes;
  } else {
    ++expert_loads;
    expert_load_bytes += bytes;
  }
  if (const auto phase = phase_of.find(w.stage);
      phase != phase_of.end() && phase->second != TF_PHASE_BACKWARD)
    forward_order[w.stage].push_back(name);
  read_ahead();  // its place ahead is free
}

void Offload::put_back(const std::string& name) {
  const Offloaded& w = weights.at(name);
  host.set_param_storage(name, at::empty({0}, at::TensorOptions().dtype(w.dtype)), w.format,
                         tier());
  experts_in.erase(std::find(experts_in.begin(), experts_in.end(), name));
}

void Offload::expect(const std::string& name) {
  // The host tier is memory already: nothing to read ahead.
  if (!disk || expert_prefetch == 0 || !worker.joinable()) return;
  if (std::find(experts_in.begin(), experts_in.end(), name) != experts_in.end()) return;
  expected.push_back(name);
  read_ahead();
}

void Offload::read_ahead() {
  std::lock_guard<std::mutex> lock(m);
  while (!expected.empty() &&
         static_cast<int64_t>(expert_loading.size() + expert_ahead.size()) < expert_prefetch) {
    const std::string name = expected.front();
    expected.pop_front();
    if (expert_loading.count(name) || expert_ahead.count(name) ||
        std::find(experts_in.begin(), experts_in.end(), name) != experts_in.end())
      continue;
    expert_loading.insert(name);
    expert_queue.push_back(name);
  }
  cv.notify_all();
}

void Offload::read_one_expert(std::unique_lock<std::mutex>& lock) {
  const std::string name = expert_queue.front();
  expert_queue.pop_front();
  lock.unlock();
  at::Tensor t;
  try {
    const tf_sdk::MemoryCategory weights_scope(host, TF_MEM_WEIGHTS);
    t = read(name, weights.at(name));
  } catch (const std::exception& e) {
    host.log(TF_LOG_ERROR, e.what());  // the fetch reads it again and reports its own error
  }
  lock.lock();
  expert_loading.erase(name);
  if (t.defined()) expert_ahead[name] = std::move(t);
  cv.notify_all();
}

void Offload::expect_for_event(int32_t stage, tf_pass_phase phase) {
  if (phase == TF_PHASE_ACCESS) return;
  phase_of[stage] = phase;
  std::vector<std::string>& order = forward_order[stage];
  if (phase != TF_PHASE_BACKWARD) {
    order.clear();  // this pass's forward (or recompute) brings them in again
    return;
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) expect(*it);
}

void Offload::drop_ahead(int32_t stage) {
  phase_of.erase(stage);
  auto of_stage = [&](const std::string& name) { return weights.at(name).stage == stage; };
  expected.erase(std::remove_if(expected.begin(), expected.end(), of_stage), expected.end());
  std::unique_lock<std::mutex> lock(m);
  expert_queue.erase(std::remove_if(expert_queue.begin(), expert_queue.end(),
                                    [&](const std::string& name) {
                                      if (!of_stage(name)) return false;
                                      expert_loading.erase(name);
                                      return true;
                                    }),
                     expert_queue.end());
  // A read under way finishes (it holds no lock); then it goes too.
  cv.wait(lock,
          [&] { return std::none_of(expert_loading.begin(), expert_loading.end(), of_stage); });
  for (auto it = expert_ahead.begin(); it != expert_ahead.end();)
    it = of_stage(it->first) ? expert_ahead.erase(it) : std::next(it);
}

}  // namespace offload
