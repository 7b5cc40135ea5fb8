// The GGUF reader on arbitrary bytes: it must refuse a bad file with
// GgufError before allocating for it, and read a good one (every tensor it
// decodes, decoded); then the config.json and the tokenizer made from its
// metadata (gguf_model, gguf_tokenizer): made or refused, never a crash.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "expand_input.hpp"
#include "gguf_file.hpp"
#include "gguf_model.hpp"
#include "gguf_quants.hpp"
#include "gguf_tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/fuzz_gguf." + std::to_string(::getpid());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  const std::string bytes = expand_input(data, size);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  try {
    const tightfit::gguf::GgufReader reader(path);
    for (const auto& t : reader.tensors())
      if (tightfit::gguf::can_dequantize(*t.type)) (void)reader.read_float(t).sum();
    try {
      (void)tightfit::gguf::hf_config(reader).dump();
    } catch (const tightfit::gguf::GgufError&) {
    }
    try {
      (void)tightfit::gguf::tokenizer_files(reader).tokenizer.dump();
    } catch (const tightfit::gguf::GgufError&) {
    } catch (const std::invalid_argument&) {
      // the SentencePiece conversion's refusals (a piece too long)
    }
  } catch (const tightfit::gguf::GgufError&) {
    // refused, as it should be
  }
  return 0;
}
