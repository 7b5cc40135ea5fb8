// tokenizer.json loading and encoding: the input's first line is text to
// encode, the rest the tokenizer.json. A bad file must be refused with
// std::invalid_argument at load, or std::runtime_error when encoding meets
// what it lacks (both become a recipe error naming [data]); nothing else
// may escape, and nothing may crash.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "bpe_tokenizer.hpp"
#include "expand_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string all = expand_input(data, size);
  const size_t nl = all.find('\n');
  const std::string text = nl == std::string::npos ? std::string() : all.substr(0, nl);
  const std::string json = nl == std::string::npos ? all : all.substr(nl + 1);
  static const std::string path = "/tmp/fuzz_tokenizer." + std::to_string(::getpid()) + ".json";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(json.data(), 1, json.size(), f);
  std::fclose(f);
  try {
    auto tok = tightfit::BpeTokenizer::load(path);
    (void)tok->decode(tok->encode(text));
  } catch (const std::invalid_argument&) {
  } catch (const std::runtime_error&) {
  }
  return 0;
}
