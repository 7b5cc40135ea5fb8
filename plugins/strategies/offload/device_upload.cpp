#include "device_upload.hpp"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace offload {

Upload upload_async(const std::map<std::string, at::Tensor>& host, const at::Device& device) {
  const c10::cuda::CUDAGuard device_guard(device);
  c10::cuda::CUDAStream stream =
      c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  const c10::cuda::CUDAStreamGuard stream_guard(stream);
  Upload out;
  out.source = host;
  for (const auto& [name, t] : host) out.tensors[name] = t.to(device, /*non_blocking=*/true);
  auto event = std::make_shared<at::cuda::CUDAEvent>();
  event->record(stream);
  out.done = event;
  return out;
}

void use_on_current_stream(const Upload& upload, const at::Device& device) {
  const c10::cuda::CUDAGuard device_guard(device);
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device.index());
  if (upload.done) static_cast<at::cuda::CUDAEvent*>(upload.done.get())->block(current);
  for (const auto& [name, t] : upload.tensors)
    c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), current);
}

}  // namespace offload
