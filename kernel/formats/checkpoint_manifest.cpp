#include "checkpoint_manifest.hpp"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "file_util.hpp"
#include "json_input.hpp"
#include "json_output.hpp"

namespace tightfit {
namespace fs = std::filesystem;

std::string checkpoint_step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

bool is_checkpoint_name(const std::string& name) {
  // step-NNNNNNNN: 8 digits at least (a step past 99,999,999 has more), 19 at most.
  return name.size() >= 13 && name.size() <= 24 && name.rfind("step-", 0) == 0 &&
         name.find_first_not_of("0123456789", 5) == std::string::npos;
}

bool is_checkpoint_leftover(const fs::path& path) {
  const std::string f = path.filename().string();
  std::error_code ec;
  // The manifest's own temporary file (write_file_replacing: NAME.tmp-PID-N).
  const std::string manifest_tmp = "manifest.json.tmp-";
  if (f.rfind(manifest_tmp, 0) == 0) {
    const std::string rest = f.substr(manifest_tmp.size());
    const auto dash = rest.find('-');
    return dash != std::string::npos && dash > 0 && dash + 1 < rest.size() &&
           rest.find_first_not_of("0123456789-") == std::string::npos &&
           rest.find('-', dash + 1) == std::string::npos &&
           fs::is_regular_file(fs::symlink_status(path, ec));
  }
  const auto dot = f.find('.');
  if (dot == std::string::npos || !is_checkpoint_name(f.substr(0, dot))) return false;
  const std::string rest = f.substr(dot);
  const bool temp =
      rest.rfind(".tmp-", 0) == 0 && rest.size() > 5 &&
      (rest.substr(5) == "ranks" || rest.find_first_not_of("0123456789", 5) == std::string::npos);
  if (!temp && rest != ".old") return false;
  // Only folders tightfit made: they hold its marker from just after they
  // exist (a kill in between leaves one empty, which holds nothing to lose).
  if (!fs::is_directory(fs::symlink_status(path, ec))) return false;
  return fs::is_regular_file(fs::symlink_status(path / kCheckpointMarker, ec)) ||
         fs::is_empty(path, ec);
}

std::vector<std::string> parse_checkpoint_manifest(const std::string& text,
                                                   const std::string& where) {
  nlohmann::json j;
  try {
    j = parse_own_json(text, where);
  } catch (const std::invalid_argument&) {
    j = nlohmann::json();  // reported below, as any damaged manifest
  }
  if (!j.is_object() || !j.contains("checkpoints") || !j["checkpoints"].is_array())
    throw std::runtime_error(
        where +
        " is damaged (not a tightfit manifest); the checkpoint folders beside it are "
        "intact — delete the manifest and list them again, or move the folder away");
  // Only names this code writes: an entry such as "../elsewhere" would make
  // --resume load, and rotation delete, a folder outside the checkpoints.
  std::vector<std::string> out;
  for (const auto& e : j["checkpoints"]) {
    const std::string name = e.is_string() ? e.get<std::string>() : std::string();
    const bool well_formed = is_checkpoint_name(name);
    if (!well_formed)
      throw std::runtime_error(where + " lists " + json_excerpt(e) +
                               ", which is not a checkpoint name (step-NNNNNNNN); the manifest "
                               "was edited or damaged — fix that entry or delete the manifest");
    out.push_back(name);
  }
  return out;
}

std::string checkpoint_manifest_run(const fs::path& manifest) {
  std::error_code ec;
  if (!fs::exists(manifest, ec)) return {};
  const nlohmann::json j = parse_own_json(read_file_text(manifest.string()), manifest.string());
  const auto it = j.is_object() ? j.find("run") : j.end();
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::vector<std::string> read_checkpoint_manifest(const fs::path& manifest) {
  if (!fs::exists(manifest)) return {};
  return parse_checkpoint_manifest(read_file_text(manifest.string()), manifest.string());
}

void write_checkpoint_manifest(const fs::path& dir, const std::vector<std::string>& names,
                               const std::string& run) {
  const nlohmann::json j = {{"format", kCheckpointFormatVersion},
                            {"checkpoints", names},
                            {"latest", names.empty() ? "" : names.back()},
                            {"run", run}};
  write_file_synced((dir / "manifest.json").string(), dump_json(j, 2));  // a new file, renamed in
  fsync_path(dir.string());
}

namespace {

// A whole number in [lo, hi] under `key`, or an error naming the file and key.
int64_t integer_field(const nlohmann::json& j, const char* key, int64_t lo, int64_t hi,
                      const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer())
    throw std::runtime_error(where + " has no whole number \"" + key + "\"");
  // A non-negative number is stored unsigned and may exceed int64's range:
  // compare it as the type it is.
  bool in_range;
  if (it->is_number_unsigned()) {
    const auto u = it->get<uint64_t>();
    in_range = u <= static_cast<uint64_t>(hi) && (lo <= 0 || u >= static_cast<uint64_t>(lo));
  } else {
    const auto v = it->get<int64_t>();
    in_range = v >= lo && v <= hi;
  }
  if (!in_range)
    throw std::runtime_error(where + ": \"" + key + "\" is " + it->dump() + ", outside [" +
                             std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return it->get<int64_t>();
}

}  // namespace

TrainerRecord parse_trainer_record(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = parse_own_json(text, where);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string(e.what()) + " (the file is cut or damaged)");
  }
  if (!j.is_object())
    throw std::runtime_error(where + " is not a JSON object (the file is cut or damaged)");
  const int64_t format = integer_field(j, "format", 0, INT32_MAX, where);
  if (format != kCheckpointFormatVersion)
    throw std::runtime_error(where + ": unsupported checkpoint format " + std::to_string(format) +
                             " (this tightfit reads format " +
                             std::to_string(kCheckpointFormatVersion) + ")");
  TrainerRecord r;
  constexpr int64_t kMax = INT64_MAX / 2;
  r.step = integer_field(j, "step", 0, kMax, where);
  r.optimizer_steps = integer_field(j, "optimizer_steps", 0, kMax, where);
  r.data_position = integer_field(j, "data_position", 0, kMax, where);
  // Ranks of one run: a bound that keeps a damaged count from meaning a
  // million missing files.
  r.world_size = integer_field(j, "world_size", 1, 65536, where);
  const auto lr = j.find("lr");
  if (lr == j.end() || !lr->is_number() || !std::isfinite(lr->get<double>()))
    throw std::runtime_error(where + " has no finite number \"lr\"");
  r.lr = lr->get<double>();
  // Written from format 1's later checkpoints on; older ones updated every
  // parameter in every step.
  if (const auto sat = j.find("optimizer_steps_sat_out"); sat != j.end()) {
    if (!sat->is_object())
      throw std::runtime_error(where +
                               ": \"optimizer_steps_sat_out\" is not an object of parameter "
                               "names and counts (the file is damaged)");
    for (const auto& [name, count] : sat->items())
      r.steps_sat_out[name] = integer_field(*sat, name.c_str(), 1, r.optimizer_steps, where);
  }
  return r;
}

}  // namespace tightfit
