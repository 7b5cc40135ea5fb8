// Device strings from recipes and plugins: only devices tightfit trains on.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace tightfit {

// "cpu", "cuda" or "cuda:N" as a device; throws std::invalid_argument naming
// the string and what is accepted for anything else ("meta", "mps", "cuda:-1",
// "cpu:3", text LibTorch does not parse).
c10::Device parse_training_device(const std::string& text);

}  // namespace tightfit
