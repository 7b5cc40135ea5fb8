// The two small JSON files a checkpoint folder is found and resumed by: the
// manifest (which step-NNNNNNNN folders are complete, oldest first) and each
// checkpoint's trainer.json (where training stood). Both are read from disk a
// user may have edited or a crash may have cut, so parsing is strict, checks
// every type and range, and throws std::runtime_error naming the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace tightfit {

inline constexpr int kCheckpointFormatVersion = 1;

// "step-00000042": the only names the manifest may list (more digits past
// step 99,999,999).
std::string checkpoint_step_name(int64_t step);
bool is_checkpoint_name(const std::string& name);

// Every checkpoint folder holds this file from the moment it is created: the
// sweep after a crash removes only folders that have it.
inline constexpr const char* kCheckpointMarker = ".tightfit-checkpoint";
// A save a crash cut short ("step-N.tmp-PID", "step-N.tmp-ranks") or the
// replaced copy of a step ("step-N.old"), made by tightfit (it has the
// marker, or is empty), or the manifest's temporary file
// ("manifest.json.tmp-PID-N").
bool is_checkpoint_leftover(const std::filesystem::path& path);

// The manifest's checkpoint names; `where` names the file in errors.
std::vector<std::string> parse_checkpoint_manifest(const std::string& text,
                                                   const std::string& where);
// No manifest yet: no checkpoints.
std::vector<std::string> read_checkpoint_manifest(const std::filesystem::path& manifest);
// Replaces dir/manifest.json atomically (temporary file, fsync, rename);
// `run` is the run folder that owns the checkpoints.
void write_checkpoint_manifest(const std::filesystem::path& dir,
                               const std::vector<std::string>& names, const std::string& run);
// The run folder a manifest says owns its checkpoints; "" when none is
// recorded (no manifest, or one written before runs were recorded).
std::string checkpoint_manifest_run(const std::filesystem::path& manifest);

// trainer.json: the kernel's own part of the training state.
struct TrainerRecord {
  int64_t step = 0;
  int64_t optimizer_steps = 0;
  double lr = 0;
  int64_t data_position = 0;
  int64_t world_size = 1;  // ranks that saved it: state.rank-1.. files exist
  // The optimizer steps each parameter sat out (no gradient, no update), by
  // name; absent for parameters updated in every step.
  std::map<std::string, int64_t> steps_sat_out;
};
TrainerRecord parse_trainer_record(const std::string& text, const std::string& where);

}  // namespace tightfit
