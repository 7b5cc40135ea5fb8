#include "cuda_memory.hpp"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <mutex>

namespace tightfit {
namespace {

constexpr size_t kAggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);

}  // namespace

int cuda_device_count() {
  return at::hasCUDA() ? static_cast<int>(c10::cuda::device_count()) : 0;
}

bool cuda_device_usable(int device) {
  if (!at::hasCUDA() || device < 0 || device >= static_cast<int>(c10::cuda::device_count()))
    return false;
  // The caching allocator is set up by CUDA's lazy init, which LibTorch runs
  // at the first CUDA tensor; its statistics and memory fraction, asked
  // before that, throw "Invalid device argument". (Idempotent, once per process.)
  at::globalContext().lazyInitDevice(at::kCUDA);
  return true;
}

bool cuda_memory(int device, CudaMemory* out) {
  if (!cuda_device_usable(device)) return false;
  const auto idx = static_cast<c10::DeviceIndex>(device);
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(idx);
  out->allocated = stats.allocated_bytes[kAggregate].current;
  out->peak_allocated = stats.allocated_bytes[kAggregate].peak;
  out->reserved = stats.reserved_bytes[kAggregate].current;
  size_t free_bytes = 0, total_bytes = 0;
  c10::cuda::CUDAGuard guard(idx);
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
    out->total = static_cast<int64_t>(total_bytes);
  return true;
}

void cuda_reset_peak(int device) {
  if (cuda_device_usable(device))
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
}

int64_t cuda_library_workspace_bytes(int device) {
  if (!cuda_device_usable(device)) return -1;
  static std::mutex mutex;
  static std::map<int, int64_t> measured;
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = measured.find(device); it != measured.end()) return it->second;
  const auto idx = static_cast<c10::DeviceIndex>(device);
  const c10::cuda::CUDAGuard guard(idx);
  auto allocated = [&] {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(idx).allocated_bytes[kAggregate].current;
  };
  const int64_t before = allocated();
  // A linear with bias forward and backward, as the models' layers run it:
  // addmm through cuBLASLt forward, plain GEMMs in autograd's device thread.
  // Constants, not random values, so the device's generator is untouched.
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    try {
      const at::AutoGradMode grad(true);
      const auto options = at::TensorOptions().device(at::kCUDA, idx).dtype(dtype);
      const at::Tensor x = at::full({64, 64}, 0.5, options).requires_grad_();
      const at::Tensor w = at::full({64, 64}, 0.25, options).requires_grad_();
      const at::Tensor b = at::zeros({64}, options).requires_grad_();
      at::linear(x, w, b).sum().backward();
    } catch (const c10::Error&) {
      // A card without bf16 GEMMs: the fp32 pass has made the workspaces.
    }
  }
  c10::cuda::device_synchronize();
  const int64_t bytes = std::max<int64_t>(0, allocated() - before);
  measured[device] = bytes;
  return bytes;
}

void cuda_set_deterministic(bool on) {
  // cuBLAS picks its algorithm, and so its reduction order, by the
  // workspace it is given. With CUDA's suggested :4096:8 the same GEMMs
  // still differed in the last bits once a strategy used a side stream
  // (offload's uploads: LoRA gradients 4.5e-7 apart from the plain run's on
  // an H100, 2026-11-28); with no workspace they were equal, and GPT-2
  // 124M's step no slower. It is read when the first handle is made, so it
  // is set before the first GEMM; a user's own setting wins.
  if (on) setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0", /*overwrite=*/0);
  auto& ctx = at::globalContext();
  // Strict, not warn_only: flash attention takes its deterministic backward
  // only then (with warn_only it keeps its atomics and warns: seen on an
  // H100, 2026-11-28), and an operator with no deterministic kernel stops
  // the run with its name (nondeterministic_op) rather than silently
  // breaking the promise. Memory-efficient attention sums with atomics even in this mode
  // (2026-11-26) and cuDNN's attention makes no promise, so both are off;
  // flash and the math kernel remain.
  ctx.setDeterministicAlgorithms(on, /*warn_only=*/false);
  ctx.setDeterministicFillUninitializedMemory(false);  // no NaN fill of every empty()
  ctx.setDeterministicCuDNN(on);
  ctx.setBenchmarkCuDNN(false);
  ctx.setSDPUseMemEfficient(!on);
  ctx.setSDPUseCuDNN(!on);
}

std::optional<std::string> nondeterministic_op(const std::exception& e) {
  const auto* error = dynamic_cast<const c10::Error*>(&e);
  const std::string what = error ? error->what_without_backtrace() : e.what();
  if (what.find("does not have a deterministic implementation") == std::string::npos)
    return std::nullopt;
  return what.substr(0, what.find('\n'));
}

bool cuda_set_budget(int device, int64_t bytes) {
  CudaMemory m;
  if (!cuda_memory(device, &m) || m.total <= 0) return false;
  const double fraction =
      bytes <= 0 ? 1.0 : std::min(1.0, static_cast<double>(bytes) / static_cast<double>(m.total));
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction,
                                                     static_cast<c10::DeviceIndex>(device));
  return true;
}

}  // namespace tightfit
