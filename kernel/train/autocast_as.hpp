// LibTorch's autocast set for one device for the life of a scope, and put
// back as it was after (its cast cache cleared): a weight fetched in
// backward in the gradient's dtype, a tiled feed-forward's tile run again
// as its forward ran.
#pragma once

#include <ATen/autocast_mode.h>

namespace tightfit {

class AutocastAs {
 public:
  AutocastAs(at::DeviceType device, bool enabled, at::ScalarType dtype)
      : device_(device),
        enabled_before_(at::autocast::is_autocast_enabled(device)),
        dtype_before_(at::autocast::get_autocast_dtype(device)) {
    at::autocast::set_autocast_dtype(device_, dtype);
    at::autocast::set_autocast_enabled(device_, enabled);
  }
  ~AutocastAs() {
    at::autocast::set_autocast_enabled(device_, enabled_before_);
    at::autocast::set_autocast_dtype(device_, dtype_before_);
    at::autocast::clear_cache();
  }
  AutocastAs(const AutocastAs&) = delete;
  AutocastAs& operator=(const AutocastAs&) = delete;

 private:
  at::DeviceType device_;
  bool enabled_before_;
  at::ScalarType dtype_before_;
};

}  // namespace tightfit
