// A checkpoint folder's JSON files: the input is read both as a manifest and
// as a trainer.json. Either may be refused with std::runtime_error (which
// --resume reports, falling back to an earlier checkpoint); nothing else may
// escape, nothing may crash, and a manifest that is accepted lists only
// checkpoint names (never a path that leaves the folder).
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "checkpoint_manifest.hpp"
#include "expand_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = expand_input(data, size);
  try {
    for (const std::string& name : tightfit::parse_checkpoint_manifest(text, "manifest.json"))
      if (name.find('/') != std::string::npos || name.find("..") != std::string::npos ||
          !tightfit::is_checkpoint_name(name))
        std::abort();
  } catch (const std::runtime_error&) {
  }
  try {
    const tightfit::TrainerRecord r = tightfit::parse_trainer_record(text, "trainer.json");
    if (r.step < 0 || r.data_position < 0 || r.world_size < 1 || r.world_size > 65536) std::abort();
  } catch (const std::runtime_error&) {
  }
  return 0;
}
