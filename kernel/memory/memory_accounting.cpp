#include "memory_accounting.hpp"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cpu_block_cache.hpp"

namespace tightfit {
namespace {

thread_local std::vector<tf_mem_category> t_category_stack;
thread_local int64_t t_allocated_bytes = 0;  // counted CPU bytes this thread ever allocated

// One counted allocation: the real allocation plus what we counted for it.
// Data pointers handed out are "simple" (context == data), as LibTorch's
// raw_allocate users (oneDNN scratch space, for one) require, so the blocks
// are found by address.
struct CountedBlock {
  c10::DataPtr inner;
  int64_t bytes;
  int64_t capacity;  // what `inner` holds (CpuBlockCache::capacity_for(bytes))
  tf_mem_category category;
};

class BlockTable {
 public:
  void insert(void* data, CountedBlock block) {
    std::lock_guard<std::mutex> lock(m_);
    blocks_.emplace(data, std::move(block));
  }
  // Removes the block and returns its allocation (freed by the caller, unlocked).
  bool take(void* data, CountedBlock* out) {
    std::lock_guard<std::mutex> lock(m_);
    auto it = blocks_.find(data);
    if (it == blocks_.end()) return false;
    *out = std::move(it->second);
    blocks_.erase(it);
    return true;
  }
  // Moves a block to another category; returns {bytes, old category} or bytes < 0.
  std::pair<int64_t, tf_mem_category> retag(void* data, tf_mem_category to) {
    std::lock_guard<std::mutex> lock(m_);
    auto it = blocks_.find(data);
    if (it == blocks_.end() || it->second.category == to) return {-1, to};
    const tf_mem_category from = it->second.category;
    it->second.category = to;
    return {it->second.bytes, from};
  }

 private:
  std::mutex m_;
  std::unordered_map<void*, CountedBlock> blocks_;
};

BlockTable& block_table() {
  static auto* table = new BlockTable();  // never destroyed: frees may come late
  return *table;
}

void counted_delete(void* data) {
  CountedBlock block;
  if (!block_table().take(data, &block)) return;
  MemoryAccounting::instance().on_free(block.category, block.bytes);
  // A block the cache never holds frees itself, without the cache's lock.
  if (block.capacity >= CpuBlockCache::kSmallest)
    cpu_block_cache().put(block.capacity, std::move(block.inner));  // kept, or freed
}

// Wraps LibTorch's default CPU allocator, counting bytes and refusing past the budget.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    auto& acct = MemoryAccounting::instance();
    if (acct.would_exceed(static_cast<int64_t>(n))) {
      const std::string message = describe_budget_refusal(n, acct.snapshot());
      acct.record_refusal(message);
      TORCH_CHECK_WITH(OutOfMemoryError, false, message);
    }
    const int64_t capacity = CpuBlockCache::capacity_for(static_cast<int64_t>(n));
    // Small blocks come from the heap's free lists and never pass the cache:
    // no lock round trip for them, and its live count is of cacheable blocks.
    const bool cacheable = capacity >= CpuBlockCache::kSmallest;
    c10::DataPtr inner = cacheable ? cpu_block_cache().take(capacity) : c10::DataPtr();
    if (!inner.get()) {
      if (acct.process_budget() > 0)
        if (std::optional<std::string> message = acct.process_refusal(capacity)) {
          // Cached blocks are resident: give them back before refusing.
          cpu_block_cache().release_all();
          message = acct.process_refusal(capacity);
          if (message) {
            acct.record_refusal(*message);
            TORCH_CHECK_WITH(OutOfMemoryError, false, *message);
          }
        }
      inner = base_->allocate(static_cast<size_t>(capacity));
      if (inner.get() && cacheable) cpu_block_cache().add_fresh(capacity);
    }
    void* data = inner.get();
    if (data == nullptr) return inner;  // zero-byte allocations
    const tf_mem_category c = current_category();
    acct.on_alloc(c, static_cast<int64_t>(n));
    t_allocated_bytes += static_cast<int64_t>(n);
    block_table().insert(data,
                         CountedBlock{std::move(inner), static_cast<int64_t>(n), capacity, c});
    return {data, data, &counted_delete, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &counted_delete; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

}  // namespace

const char* category_name(tf_mem_category c) {
  switch (c) {
    case TF_MEM_WEIGHTS:
      return "weights";
    case TF_MEM_GRADS:
      return "grads";
    case TF_MEM_OPTIMIZER:
      return "optimizer";
    case TF_MEM_ACTIVATIONS:
      return "activations";
    case TF_MEM_ADAPTERS:
      return "adapters";
    case TF_MEM_TRANSIENT:
      return "transient";
    case TF_MEM_OTHER:
      return "other";
    default:
      return "reserved";
  }
}

std::string describe_budget_refusal(size_t requested, const MemorySnapshot& s) {
  std::ostringstream os;
  os << "out of memory budget: allocating " << format_bytes(static_cast<int64_t>(requested))
     << " with " << format_bytes(s.total_current)
     << " in use would pass run.memory_budget = " << format_bytes(s.budget) << " (in use:";
  for (int c = 0; c < TF_MEM_CATEGORY_COUNT; ++c) {
    if (s.current[c] > 0)
      os << " " << category_name(static_cast<tf_mem_category>(c)) << " "
         << format_bytes(s.current[c]);
  }
  os << "). Fix: raise run.memory_budget, lower data.batch_size or data.seq_len, or add a "
        "[[strategy]] such as checkpoint";
  return os.str();
}

std::string describe_device_refusal(const std::string& allocator_message, int64_t budget) {
  // LibTorch's message runs on over several sentences of allocator detail:
  // its first two say what ran out and what was asked ("CUDA out of memory.
  // Tried to allocate 2.00 MiB.").
  size_t cut = allocator_message.find(". ");
  if (cut != std::string::npos) cut = allocator_message.find(". ", cut + 2);
  const std::string first =
      cut == std::string::npos ? allocator_message : allocator_message.substr(0, cut + 1);
  std::ostringstream os;
  if (budget > 0)
    os << "out of memory budget: the device's allocator would pass run.memory_budget = "
       << format_bytes(budget) << " (" << first << ")";
  else
    os << "out of device memory (" << first << ")";
  os << ". Fix: " << (budget > 0 ? "raise run.memory_budget, " : "")
     << "lower data.batch_size or data.seq_len, or add a [[strategy]] such as checkpoint or "
        "offload (tightfit plan RECIPE shows what each part takes)";
  return os.str();
}

std::optional<std::string> budget_refusal(const std::exception& e) {
  auto& acct = MemoryAccounting::instance();
  if (dynamic_cast<const OutOfBudgetError*>(&e)) return e.what();
  if (const auto* oom = dynamic_cast<const c10::OutOfMemoryError*>(&e)) {
    // The counting CPU allocator's refusal is its own message (claimed:
    // this is it); anything else is a device's allocator refusing.
    if (acct.take_refusal()) return oom->what_without_backtrace();
    return describe_device_refusal(oom->what_without_backtrace(), acct.device_budget());
  }
  if (dynamic_cast<const c10::Error*>(&e)) return acct.take_refusal();
  return std::nullopt;
}

void MemoryAccounting::record_refusal(const std::string& message) {
  std::lock_guard<std::mutex> lock(refusal_mutex_);
  refusal_ = message;
}

std::optional<std::string> MemoryAccounting::take_refusal() {
  std::lock_guard<std::mutex> lock(refusal_mutex_);
  return std::exchange(refusal_, std::nullopt);
}

void MemoryAccounting::clear_refusal() {
  take_refusal();
}

MemoryAccounting::MemoryAccounting() {
  static CountingCpuAllocator allocator(c10::GetDefaultCPUAllocator());
  // Priority above LibTorch's default registration so ours stays in place.
  c10::SetCPUAllocator(&allocator, /*priority=*/100);
}

MemoryAccounting& MemoryAccounting::instance() {
  static MemoryAccounting* acct = new MemoryAccounting();  // never destroyed: frees may come late
  return *acct;
}

bool MemoryAccounting::would_exceed(int64_t bytes) const {
  const int64_t b = budget_.load(std::memory_order_relaxed);
  return b > 0 && total_current_.load(std::memory_order_relaxed) + bytes > b;
}

// True when `value` became the new peak.
static bool raise_peak(std::atomic<int64_t>& peak, int64_t value) {
  int64_t p = peak.load(std::memory_order_relaxed);
  while (value > p)
    if (peak.compare_exchange_weak(p, value, std::memory_order_relaxed)) return true;
  return false;
}

// Racy across threads by design: a diagnostic of what the peak was made of,
// not a counter anything depends on.
void MemoryAccounting::record_at_peak() {
  for (int c = 0; c < TF_MEM_CATEGORY_COUNT; ++c)
    at_peak_[c].store(current_[c].load(std::memory_order_relaxed), std::memory_order_relaxed);
}

void MemoryAccounting::on_alloc(tf_mem_category c, int64_t bytes) {
  raise_peak(peak_[c], current_[c].fetch_add(bytes, std::memory_order_relaxed) + bytes);
  if (raise_peak(total_peak_, total_current_.fetch_add(bytes, std::memory_order_relaxed) + bytes))
    record_at_peak();
}

void MemoryAccounting::on_free(tf_mem_category c, int64_t bytes) {
  current_[c].fetch_sub(bytes, std::memory_order_relaxed);
  total_current_.fetch_sub(bytes, std::memory_order_relaxed);
}

MemorySnapshot MemoryAccounting::snapshot() const {
  MemorySnapshot s;
  for (int c = 0; c < TF_MEM_CATEGORY_COUNT; ++c) {
    s.current[c] = current_[c].load();
    s.peak[c] = peak_[c].load();
    s.at_peak[c] = at_peak_[c].load();
  }
  s.total_current = total_current_.load();
  s.total_peak = total_peak_.load();
  s.budget = budget_.load();
  return s;
}

std::optional<std::string> MemoryAccounting::process_refusal(int64_t requested) {
  if (process_budget_.load() <= 0) return std::nullopt;
  constexpr int64_t kCheckEvery = int64_t{16} << 20;
  if (requested < kCheckEvery &&
      since_process_check_.fetch_add(requested, std::memory_order_relaxed) + requested <
          kCheckEvery)
    return std::nullopt;
  since_process_check_.store(0, std::memory_order_relaxed);
  const std::optional<ProcessMemory> m = read_process_memory();
  return m ? process_refusal(*m, requested) : std::nullopt;
}

std::optional<std::string> MemoryAccounting::process_refusal(const ProcessMemory& now,
                                                             int64_t requested) const {
  const int64_t budget = process_budget_.load();
  if (budget <= 0 || now.rss + requested <= budget) return std::nullopt;
  return "out of memory budget: the process holds " + format_bytes(now.rss) + " resident" +
         (requested > 0 ? ", and allocating " + format_bytes(requested) + " more would pass"
                        : ", past") +
         " run.memory_budget = " + format_bytes(budget) +
         " (memory_budget_scope = \"process\": the budget is the whole process's RSS, libraries "
         "and allocator included, of which tensors are " +
         format_bytes(total_current_.load()) +
         "). Fix: raise run.memory_budget, lower data.batch_size or data.seq_len, add a "
         "[[strategy]] that saves memory, or set memory_budget_scope = \"tracked\" to budget "
         "the tensors alone";
}

void MemoryAccounting::reset_peaks() {
  for (int c = 0; c < TF_MEM_CATEGORY_COUNT; ++c) peak_[c].store(current_[c].load());
  total_peak_.store(total_current_.load());
  record_at_peak();
}

void MemoryAccounting::retag(const at::Tensor& t, tf_mem_category to) {
  if (!t.defined() || !t.has_storage()) return;
  const c10::DataPtr& dp = t.storage().data_ptr();
  if (dp.get_deleter() != &counted_delete) return;
  const auto [bytes, from] = block_table().retag(dp.get(), to);
  if (bytes < 0) return;
  current_[from].fetch_sub(bytes);
  raise_peak(peak_[to], current_[to].fetch_add(bytes) + bytes);
}

tf_mem_category current_category() {
  return t_category_stack.empty() ? TF_MEM_OTHER : t_category_stack.back();
}

CategoryScope::CategoryScope(tf_mem_category c) {
  t_category_stack.push_back(c);
}
CategoryScope::~CategoryScope() {
  t_category_stack.pop_back();
}

void push_category(tf_mem_category c) {
  t_category_stack.push_back(c);
}
bool pop_category() {
  if (t_category_stack.empty()) return false;
  t_category_stack.pop_back();
  return true;
}

int64_t thread_allocated_cpu_bytes() {
  return t_allocated_bytes;
}

}  // namespace tightfit
