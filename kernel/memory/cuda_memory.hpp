// CUDA memory: LibTorch's caching allocator keeps its own statistics, so on a
// CUDA device the device totals come from there (the counting CPU allocator
// sees only host tensors), and the budget becomes the allocator's memory
// fraction. Everything here compiles without a GPU and is inert without one.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>

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
// The bytes cuBLAS's workspaces hold in the caching allocator once matmuls
// have run forward and backward on `device` from this thread (one per
// handle and stream: the calling thread's, and autograd's device thread's).
// They stay allocated for the life of the process, so a run's peak holds
// them. Measured once per device and process by a probe that allocates
// nothing else that outlives it and draws no random numbers; -1 where
// `device` is not usable here (see kAssumedCublasWorkspaceBytes).
int64_t cuda_library_workspace_bytes(int device);
// What a plan assumes where the card is not here to measure (a dry-run plan
// of a GPU recipe on another machine): LibTorch's default on Hopper and
// later, 32 MiB for each of the two threads' handles. The larger of its
// defaults (Ampere's is a quarter), so such a plan errs high.
constexpr int64_t kAssumedCublasWorkspaceBytes = int64_t{2} * (int64_t{32} << 20);
// On: LibTorch's deterministic algorithms and cuBLAS's fixed workspace
// ([run] deterministic), so CUDA runs repeat bit for bit; off: the defaults.
void cuda_set_deterministic(bool on);
// When `e` is LibTorch refusing an operator that has no deterministic CUDA
// kernel (deterministic mode is strict), the operator's message without the
// backtrace; nullopt otherwise.
std::optional<std::string> nondeterministic_op(const std::exception& e);
// Caps the caching allocator at `bytes` (0 = no cap); returns false without CUDA.
bool cuda_set_budget(int device, int64_t bytes);

}  // namespace tightfit
