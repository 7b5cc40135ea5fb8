// The two small JSON files a checkpoint folder is found and resumed by: the
// manifest (which step-NNNNNNNN folders are complete, oldest first) and each
// checkpoint's trainer.json (where training stood). Both are read from disk a
// user may have edited or a crash may have cut, so parsing is strict, checks
// every type and range, and throws std::runtime_error naming the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace tightfit {

inline constexpr int kCheckpointFormatVersion = 1;

// "step-00000042": the only names the manifest may list.
std::string checkpoint_step_name(int64_t step);

// The manifest's checkpoint names; `where` names the file in errors.
std::vector<std::string> parse_checkpoint_manifest(const std::string& text,
                                                   const std::string& where);
// No manifest yet: no checkpoints.
std::vector<std::string> read_checkpoint_manifest(const std::filesystem::path& manifest);
// Replaces dir/manifest.json atomically (temporary file, fsync, rename).
void write_checkpoint_manifest(const std::filesystem::path& dir,
                               const std::vector<std::string>& names);

// trainer.json: the kernel's own part of the training state.
struct TrainerRecord {
  int64_t step = 0;
  int64_t optimizer_steps = 0;
  double lr = 0;
  int64_t data_position = 0;
  int64_t world_size = 1;  // ranks that saved it: state.rank-1.. files exist
};
TrainerRecord parse_trainer_record(const std::string& text, const std::string& where);

}  // namespace tightfit
