#include "run_environment.hpp"

#include <filesystem>

#include "cuda_memory.hpp"

namespace tightfit {

std::string RunEnvironment::checkpoint_dir() const {
  const std::string d = config.save.dir;
  return d.empty() ? (std::filesystem::path(run_dir) / "checkpoints").string() : d;
}

MemorySnapshot RunEnvironment::memory_snapshot() const {
  MemorySnapshot m = MemoryAccounting::instance().snapshot();
  CudaMemory c;
  if (device.is_cuda() && cuda_memory(device.has_index() ? device.index() : 0, &c)) {
    m.device_current = c.allocated;
    m.device_peak = c.peak_allocated;
  }
  return m;
}

}  // namespace tightfit
