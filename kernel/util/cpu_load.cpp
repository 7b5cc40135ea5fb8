#include "cpu_load.hpp"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace tightfit {
namespace {

// The first line of a small /proc or /sys file; empty when unreadable.
std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line.substr(0, 4096);
}

// The cgroup's CPU quota in CPUs, 0 when there is none (or it cannot be read).
double cgroup_quota() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  for (int n = 0; n < 64 && std::getline(in, line); ++n) {
    // "0::/path" (v2) or "4:cpu,cpuacct:/path" (v1).
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers.empty()) {
      std::istringstream max(first_line("/sys/fs/cgroup" + path + "/cpu.max"));
      std::string quota;
      double period = 0;
      if (max >> quota >> period && quota != "max" && period > 0) {
        const double q = std::atof(quota.c_str()) / period;
        if (q > 0) return q;
      }
      continue;
    }
    std::istringstream names(controllers);
    for (std::string c; std::getline(names, c, ',');) {
      if (c != "cpu") continue;
      for (const std::string dir : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}) {
        const double quota = std::atof(first_line(dir + path + "/cpu.cfs_quota_us").c_str());
        const double period = std::atof(first_line(dir + path + "/cpu.cfs_period_us").c_str());
        if (quota > 0 && period > 0) return quota / period;
      }
    }
  }
  return 0;
}

}  // namespace

std::string UsableCpus::describe() const {
  std::ostringstream os;
  os << count << (count == 1 ? " CPU" : " CPUs") << " (affinity " << ids.size() << ", ";
  if (quota > 0)
    os << "cgroup quota " << std::round(quota * 100) / 100 << ")";
  else
    os << "no cgroup quota)";
  return os.str();
}

UsableCpus usable_cpus() {
  UsableCpus u;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int i = 0; i < CPU_SETSIZE; ++i)
      if (CPU_ISSET(i, &set)) u.ids.push_back(i);
  }
  u.quota = cgroup_quota();
  int n = std::max<int>(1, static_cast<int>(u.ids.size()));
  if (u.quota > 0) n = std::min(n, std::max(1, static_cast<int>(std::ceil(u.quota - 1e-6))));
  u.count = n;
  return u;
}

CpuLoad::CpuLoad(std::vector<int> cpus) : cpus_(std::move(cpus)) {
  last_ = sample();
}

std::optional<CpuLoad::Sample> CpuLoad::sample() const {
  Sample s;
  std::ifstream stat("/proc/stat");
  std::string line;
  int seen = 0;
  for (int n = 0; n < 8192 && std::getline(stat, line); ++n) {
    // "cpuN user nice system idle iowait irq softirq steal ..."
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || line[3] < '0' || line[3] > '9') continue;
    std::istringstream in(line.substr(3));
    int id = -1;
    in >> id;
    if (std::find(cpus_.begin(), cpus_.end(), id) == cpus_.end()) continue;
    int64_t v[8] = {};
    for (int64_t& x : v) in >> x;
    const int64_t idle = v[3] + v[4];
    const int64_t total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
    s.busy_ticks += total - idle;
    s.total_ticks += total;
    ++seen;
  }
  if (seen == 0) return std::nullopt;
  // /proc/self/stat: "pid (comm) state ..." with utime and stime the 14th
  // and 15th fields; comm may hold spaces, so count from its ')'.
  const std::string self = first_line("/proc/self/stat");
  const auto close = self.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream in(self.substr(close + 1));
  std::string field;
  int64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::atoll(field.c_str());
    if (i == 15) stime = std::atoll(field.c_str());
  }
  s.own_ticks = utime + stime;
  return s;
}

std::optional<double> CpuLoad::others_busy() {
  const std::optional<Sample> now = sample();
  if (!now || !last_) {
    last_ = now;
    return std::nullopt;
  }
  const int64_t total = now->total_ticks - last_->total_ticks;
  if (total <= 0) return std::nullopt;
  const int64_t busy = now->busy_ticks - last_->busy_ticks;
  const int64_t own = now->own_ticks - last_->own_ticks;
  last_ = now;
  // total ticks over the CPUs is the wall time times their count.
  const double cpus = static_cast<double>(cpus_.size());
  return std::clamp(static_cast<double>(busy - own) / static_cast<double>(total) * cpus, 0.0, cpus);
}

int threads_beside(int usable, double others_busy) {
  const int taken = static_cast<int>(std::floor(std::max(0.0, others_busy) + 0.25));
  return std::max(1, usable - taken);
}

}  // namespace tightfit
