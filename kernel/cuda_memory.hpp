// CUDA memory: LibTorch's caching allocator keeps its own statistics, so on a
// CUDA device the device totals come from there (the counting CPU allocator
// sees only host tensors), and the budget becomes the allocator's memory
// fraction. Everything here compiles without a GPU and is inert without one.
#pragma once

#include <cstdint>

namespace tightfit {

struct CudaMemory {
  int64_t allocated = 0;       // bytes in live tensors
  int64_t peak_allocated = 0;  // since the last reset
  int64_t reserved = 0;        // bytes the caching allocator holds
  int64_t total = 0;           // device capacity
};

// True when CUDA is available here and `device` is one of its devices.
bool cuda_device_usable(int device);
// The CUDA devices this process sees (0 without CUDA).
int cuda_device_count();
// False when CUDA is unavailable or `device` is out of range.
bool cuda_memory(int device, CudaMemory* out);
void cuda_reset_peak(int device);
// Caps the caching allocator at `bytes` (0 = no cap); returns false without CUDA.
bool cuda_set_budget(int device, int64_t bytes);

}  // namespace tightfit
