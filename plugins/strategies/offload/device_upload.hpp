// Host-to-GPU copies of a stage's weights on a side stream, so that the copy
// for the next stages overlaps the compute of this one on the main stream.
// The CUDA types stay in device_upload.cpp.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>

namespace offload {

struct Upload {
  std::map<std::string, at::Tensor> source;   // the host copies, kept until the copy is done
  std::map<std::string, at::Tensor> tensors;  // on the device
  std::shared_ptr<void> done;                 // the copy's CUDA event
};

// Starts copying `host` (pinned CPU tensors) to `device` on a stream from
// LibTorch's pool; returns at once.
Upload upload_async(const std::map<std::string, at::Tensor>& host, const at::Device& device);

// Makes the current stream wait for the copy, and tells the caching
// allocator the tensors are used on it (so their memory is not reused while
// the current stream may still read them).
void use_on_current_stream(const Upload& upload, const at::Device& device);

}  // namespace offload
