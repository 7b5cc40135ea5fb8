// The safetensors reader on arbitrary bytes: it must refuse a bad file with
// SafetensorsError before allocating for it, and read a good one.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "expand_input.hpp"
#include "safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/fuzz_safetensors." + std::to_string(::getpid());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  const std::string bytes = expand_input(data, size);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  try {
    const tightfit::SafetensorsReader reader(path);
    for (const auto& name : reader.names()) (void)reader.read(name).sum();
  } catch (const tightfit::SafetensorsError&) {
    // refused, as it should be
  }
  return 0;
}
