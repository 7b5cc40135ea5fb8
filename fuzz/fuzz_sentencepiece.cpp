// A SentencePiece tokenizer.model in a model folder: the protobuf reader, the
// BPE conversion (merges from the pieces' scores) and encoding. The input's
// first byte picks the tokenizer_config.json (legacy or not); the rest is the
// tokenizer.model. A bad file must be refused with std::invalid_argument;
// nothing else may escape, and nothing may crash.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "bpe_tokenizer.hpp"
#include "expand_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string all = expand_input(data, size);
  if (all.empty()) return 0;
  static const std::string dir = "/tmp/fuzz_sentencepiece." + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  auto write = [](const std::string& path, const std::string& bytes) {
    if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
      std::fwrite(bytes.data(), 1, bytes.size(), f);
      std::fclose(f);
    }
  };
  write(dir + "/tokenizer_config.json",
        (all[0] & 1) ? R"({"tokenizer_class": "LlamaTokenizer", "legacy": false})"
                     : R"({"tokenizer_class": "LlamaTokenizer"})");
  write(dir + "/tokenizer.model", all.substr(1));
  try {
    auto tok = tightfit::BpeTokenizer::load(dir);
    (void)tok->decode(tok->encode_with_special_tokens("Hello world, caf\xc3\xa9 \xf0\x9f\x99\x82"));
  } catch (const std::invalid_argument&) {
  } catch (const std::runtime_error&) {
  }
  return 0;
}
