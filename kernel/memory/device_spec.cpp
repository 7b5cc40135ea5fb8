#include "device_spec.hpp"

#include <stdexcept>

namespace tightfit {

c10::Device parse_training_device(const std::string& text) {
  const std::string accepted = " (use cpu, cuda or cuda:N)";
  // Bounded before LibTorch sees it: a device string is a few characters.
  if (text.size() > 32) throw std::invalid_argument("a device string is too long" + accepted);
  std::optional<c10::Device> device;
  try {
    device = c10::Device(text);
  } catch (const std::exception&) {
    throw std::invalid_argument("\"" + text + "\" is not a device" + accepted);
  }
  if (device->is_cpu()) {
    // One CPU device: an index would name nothing.
    if (device->has_index() && device->index() != 0)
      throw std::invalid_argument("\"" + text + "\": the CPU has no index" + accepted);
    return c10::Device(c10::kCPU);
  }
  if (device->is_cuda()) return *device;
  throw std::invalid_argument("\"" + text + "\" is not a device tightfit trains on" + accepted);
}

}  // namespace tightfit
