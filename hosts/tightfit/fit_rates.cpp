#include "fit_rates.hpp"

#include <ATen/Parallel.h>
#include <sys/stat.h>

#include <ctime>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "file_util.hpp"
#include "json_input.hpp"
#include "json_output.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace tightfit::host {
namespace {

json rates_json(const MachineRates& r) {
  json j = {{"device", r.device},
            {"threads", r.threads},
            {"memory_bytes_per_s", r.memory_bytes_per_s},
            {"activation_fp32_bytes_per_s", r.activation_fp32_bytes_per_s},
            {"activation_bf16_bytes_per_s", r.activation_bf16_bytes_per_s},
            {"host_link_bytes_per_s", r.host_link_bytes_per_s},
            {"disk_read_warm", r.disk_read_warm},
            {"disk_read_cold", r.disk_read_cold},
            {"disk_write", r.disk_write},
            {"dequant_values_per_s", r.dequant_values_per_s}};
  for (const auto& [rows, f] : r.fp32_flops) j["fp32_flops"][std::to_string(rows)] = f;
  for (const auto& [rows, f] : r.bf16_flops) j["bf16_flops"][std::to_string(rows)] = f;
  return j;
}

MachineRates rates_from_json(const json& j) {
  MachineRates r;
  r.device = j.at("device").get<std::string>();
  r.threads = j.at("threads").get<int>();
  r.memory_bytes_per_s = j.at("memory_bytes_per_s").get<double>();
  r.activation_fp32_bytes_per_s = j.at("activation_fp32_bytes_per_s").get<double>();
  r.activation_bf16_bytes_per_s = j.at("activation_bf16_bytes_per_s").get<double>();
  r.host_link_bytes_per_s = j.at("host_link_bytes_per_s").get<double>();
  r.disk_read_warm = j.at("disk_read_warm").get<double>();
  r.disk_read_cold = j.at("disk_read_cold").get<double>();
  r.disk_write = j.at("disk_write").get<double>();
  r.dequant_values_per_s = j.at("dequant_values_per_s").get<double>();
  for (const auto& [rows, f] : j.at("fp32_flops").items()) r.fp32_flops[std::stoll(rows)] = f;
  for (const auto& [rows, f] : j.at("bf16_flops").items()) r.bf16_flops[std::stoll(rows)] = f;
  return r;
}

// Where measured rates are kept between calls: $TIGHTFIT_CACHE_DIR, else
// $XDG_CACHE_HOME/tightfit, else ~/.cache/tightfit ("" when none is known).
fs::path rates_cache_file() {
  if (const char* d = std::getenv("TIGHTFIT_CACHE_DIR"); d && *d) return fs::path(d) / "rates.json";
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d)
    return fs::path(d) / "tightfit" / "rates.json";
  if (const char* h = std::getenv("HOME"); h && *h)
    return fs::path(h) / ".cache" / "tightfit" / "rates.json";
  return {};
}

}  // namespace

MachineRates cached_machine_rates(const std::string& device, const std::vector<int64_t>& rows,
                                  int64_t k, int64_t n, const std::string& scratch, bool remeasure,
                                  std::string& source) {
  struct stat st {};
  ::stat(scratch.c_str(), &st);
  std::ostringstream key;
  key << device << "|threads " << at::get_num_threads() << "|k " << k << "|n " << n << "|disk "
      << st.st_dev << "|rows";
  for (int64_t r : rows) key << " " << r;
  const fs::path file = rates_cache_file();
  json cache = json::object();
  if (!file.empty() && fs::exists(file)) {
    try {
      cache = read_json_file(file.string(), size_t{64} << 20);
    } catch (const std::exception&) {
      cache = json::object();  // a damaged cache is measured again and rewritten
    }
  }
  if (!remeasure && cache.contains(key.str())) {
    try {
      MachineRates r = rates_from_json(cache[key.str()]["rates"]);
      r.ram_available = available_ram();
      source = "measured " + cache[key.str()].value("when", std::string("earlier")) + ", " +
               file.string() + "; --measure to redo";
      return r;
    } catch (const std::exception&) {
    }
  }
  std::cerr << "fit: measuring this machine (matmul, memory, disk) ..." << std::flush;
  MachineRates r;
  try {
    r = measure_machine_rates(at::Device(device), rows, k, n, scratch);
  } catch (const std::exception&) {
    std::cerr << " failed\n";
    throw;
  }
  std::cerr << " done\n";
  source = "measured now";
  if (!file.empty()) {
    char when[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M", std::localtime(&now));
    cache[key.str()] = {{"when", when}, {"rates", rates_json(r)}};
    try {
      fs::create_directories(file.parent_path());
      const std::string tmp = file.string() + ".tmp";
      write_file_synced(tmp, dump_json(cache, 2));
      fs::rename(tmp, file);
      source += ", kept in " + file.string();
    } catch (const std::exception&) {
      source += " (the cache " + file.string() + " could not be written)";
    }
  }
  return r;
}

}  // namespace tightfit::host
