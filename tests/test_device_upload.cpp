// The offload strategy's host-to-GPU copies (plugins/strategies/offload/
// device_upload.hpp): a prefetched stage's weights, pinned in host memory,
// copy on a side stream while the main stream computes, and the main stream
// sees them only once the copy is done. Only a GPU has anything to overlap:
// scripts/gpu-check runs this suite there (label cuda); elsewhere it skips.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "device_upload.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

// The GPU TIGHTFIT_TEST_DEVICE names, or nullopt (the suite skips). Asked
// for where CUDA is not usable, the test fails rather than skips.
std::optional<at::Device> asked_gpu() {
  const std::string device = test::test_device();
  if (device.rfind("cuda", 0) != 0) return std::nullopt;
  return at::Device(device);
}

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  c10::cuda::device_synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool done(const offload::Upload& u) {
  return static_cast<at::cuda::CUDAEvent*>(u.done.get())->query();
}

// A copy started behind a queue of matmuls on the main stream finishes while
// they still run: it is on another stream and does not block the host. Were
// it on the main stream (or from pageable memory, copied synchronously) it
// would wait for them. The queue is sized to 20x the copy's own time.
TEST(DeviceUpload, APrefetchedCopyOverlapsTheComputeQueuedBeforeIt) {
  const std::optional<at::Device> gpu = asked_gpu();
  if (!gpu) GTEST_SKIP() << "no GPU asked for (TIGHTFIT_TEST_DEVICE=cuda:0 runs it on one)";
  ASSERT_TRUE(at::hasCUDA()) << "TIGHTFIT_TEST_DEVICE names a GPU, but CUDA is not usable here";
  const at::Device device = *gpu;
  // 256 MiB of a stage's weights, pinned as the host tier keeps them.
  const std::map<std::string, at::Tensor> host{
      {"w", at::full({64, 1024, 1024}, 1.5f, at::TensorOptions().pinned_memory(true))}};
  ASSERT_TRUE(host.at("w").is_pinned());
  const at::Tensor a = at::full({8192, 8192}, 1e-4f, at::TensorOptions().device(device));
  // Timed after a first of each, which pays for the stream pool and cuBLAS.
  seconds_of([&] {
    offload::upload_async(host, device);
    at::mm(a, a);
  });
  const double copy_s = seconds_of([&] { offload::upload_async(host, device); });
  const double mm_s = seconds_of([&] { at::mm(a, a); });
  const int n = 2 + static_cast<int>(std::ceil(20 * copy_s / mm_s));

  at::cuda::CUDAEvent computed;
  for (int i = 0; i < n; ++i) at::mm(a, a);
  computed.record();
  const offload::Upload upload = offload::upload_async(host, device);
  EXPECT_FALSE(computed.query()) << "upload_async blocked the host until the compute ended";
  while (!done(upload)) {
  }
  EXPECT_FALSE(computed.query()) << "the copy waited for the compute queued before it (" << n
                                 << " matmuls of " << mm_s << " s, copy " << copy_s << " s)";

  offload::use_on_current_stream(upload, device);
  EXPECT_TRUE(at::equal(upload.tensors.at("w").cpu(), host.at("w")));
}

// The main stream waits for the copy: a stage reading its weights right
// after use_on_current_stream sees all of them, however long the copy takes.
TEST(DeviceUpload, TheMainStreamReadsTheWeightsOnlyAfterTheCopy) {
  const std::optional<at::Device> gpu = asked_gpu();
  if (!gpu) GTEST_SKIP() << "no GPU asked for (TIGHTFIT_TEST_DEVICE=cuda:0 runs it on one)";
  ASSERT_TRUE(at::hasCUDA()) << "TIGHTFIT_TEST_DEVICE names a GPU, but CUDA is not usable here";
  const at::Device device = *gpu;
  for (int round = 0; round < 5; ++round) {
    const float value = 0.5f + static_cast<float>(round);
    const std::map<std::string, at::Tensor> host{
        {"w", at::full({64, 1024, 1024}, value, at::TensorOptions().pinned_memory(true))}};
    const offload::Upload upload = offload::upload_async(host, device);
    offload::use_on_current_stream(upload, device);
    // Queued on the main stream at once, before the copy can have finished.
    const at::Tensor sum = upload.tensors.at("w").sum(at::kDouble);
    EXPECT_EQ(sum.item<double>(), static_cast<double>(value) * 64 * 1024 * 1024) << round;
  }
}

}  // namespace
}  // namespace tightfit
