#include "plugin_scan.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>

#include "file_util.hpp"
#include "json_input.hpp"
#include "plugin_scan_cache.hpp"

extern char** environ;

namespace tightfit {
namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxAnswerBytes = 1u << 20;  // one library's answer line
// Seconds a library may take to load in the scanner before it counts as hung.
int scan_timeout_seconds() {
  if (const char* v = std::getenv("TIGHTFIT_PLUGIN_SCAN_TIMEOUT")) {
    char* end = nullptr;
    const long s = std::strtol(v, &end, 10);
    if (end != v && *end == '\0' && s > 0 && s <= 3600) return static_cast<int>(s);
  }
  return 60;
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigdescr_np(sig);
    return "crashed while being loaded (signal " + std::to_string(sig) + ", " +
           (name ? name : "unknown") + ")";
  }
  if (WIFEXITED(status))
    return "ended the scanner while being loaded (exit status " +
           std::to_string(WEXITSTATUS(status)) + ")";
  return "stopped the scanner while being loaded";
}

// One run of the scanner over `paths`: fills `out` from index `first` on,
// until all are answered or the scanner dies (then the library it was
// loading gets the reason and the caller starts a new scanner after it).
// Returns the index of the first path not answered.
size_t run_scanner(const std::string& scanner, const std::vector<std::string>& paths, size_t first,
                   std::vector<PluginScanResult>& out) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    out[first].problem = "plugin " + paths[first] + ": cannot start the plugin scanner (" +
                         std::strerror(errno) + ")";
    out[first].cacheable = false;
    return first + 1;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  std::vector<std::string> args = {scanner};
  args.insert(args.end(), paths.begin() + static_cast<std::ptrdiff_t>(first), paths.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, scanner.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  if (spawned != 0) {
    ::close(pipe_fds[0]);
    for (size_t i = first; i < paths.size(); ++i) {
      out[i].problem = "plugin " + paths[i] + ": not scanned: cannot run the plugin scanner " +
                       scanner + " (" + std::strerror(spawned) +
                       "); reinstall tightfit, or set TIGHTFIT_PLUGIN_SCANNER to its path";
      out[i].cacheable = false;
    }
    return paths.size();
  }

  const int timeout_ms = scan_timeout_seconds() * 1000;
  size_t next = first;
  std::string buffer;
  bool timed_out = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (char chunk[4096]; next < paths.size();) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    pollfd pfd{pipe_fds[0], POLLIN, 0};
    const int ready = left > 0 ? ::poll(&pfd, 1, static_cast<int>(left)) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      timed_out = true;
      break;
    }
    const ssize_t n = ::read(pipe_fds[0], chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buffer.append(chunk, static_cast<size_t>(n));
    for (size_t nl; next < paths.size() && (nl = buffer.find('\n')) != std::string::npos;) {
      const std::string line = buffer.substr(0, nl);
      buffer.erase(0, nl + 1);
      PluginScanResult& r = out[next];
      try {
        const nlohmann::json j = parse_json(line, "the plugin scanner's answer");
        if (answer_string(j, "path") != paths[next])
          throw std::invalid_argument("an answer for another file");
        if (j.contains("error"))
          r.problem = answer_string(j, "error");
        else
          r.info = plugin_info_from_json(j.at("info"));
        if (r.info && r.info->path != paths[next])
          throw std::invalid_argument("an answer for another file");
      } catch (const std::exception& e) {
        r.info.reset();
        r.problem = "plugin " + paths[next] + ": its scan gave an unreadable answer (" + e.what() +
                    "); the library may write to the scanner's output when loaded";
      }
      ++next;
      deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    }
    if (buffer.size() > kMaxAnswerBytes) break;
  }
  ::close(pipe_fds[0]);
  if (timed_out || next < paths.size()) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (next < paths.size()) {
    PluginScanResult& r = out[next];
    r.info.reset();
    if (timed_out) {
      r.problem = "plugin " + paths[next] + ": did not finish loading within " +
                  std::to_string(timeout_ms / 1000) +
                  " s in the plugin scanner (does a constructor of it wait forever?); "
                  "TIGHTFIT_PLUGIN_SCAN_TIMEOUT sets the limit in seconds";
      r.cacheable = false;  // a slow disk is not a broken library: try again next time
    } else if (buffer.size() > kMaxAnswerBytes) {
      r.problem = "plugin " + paths[next] + ": its scan wrote more than " +
                  std::to_string(kMaxAnswerBytes) + " bytes; the library writes to its output";
    } else {
      r.problem = "plugin " + paths[next] + ": " + describe_exit(status) +
                  " in the plugin scanner, so tightfit does not load it; rebuild it, or remove "
                  "it from the plugin folders";
    }
    ++next;
  }
  return next;
}

std::optional<FileIdentity> identity_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileIdentity{st.st_dev, st.st_ino, st.st_size,
                      static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

}  // namespace

std::string plugin_scanner_path() {
  if (const char* env = std::getenv("TIGHTFIT_PLUGIN_SCANNER"); env && *env == '/') return env;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&plugin_scanner_path), &info) == 0 || !info.dli_fname)
    return "tightfit-plugin-scan";
  return (fs::absolute(info.dli_fname).parent_path().parent_path() / "bin" / "tightfit-plugin-scan")
      .string();
}

std::vector<PluginScanResult> scan_plugin_files(const std::vector<std::string>& paths,
                                                const std::string& origin) {
  std::vector<PluginScanResult> results(paths.size());
  PluginScanCache cache(PluginScanCache::default_path());
  std::vector<std::string> to_scan;
  std::vector<size_t> where;
  std::vector<FileIdentity> ids(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::optional<FileIdentity> id = identity_of(paths[i]);
    if (!id) {
      results[i].problem = "plugin " + paths[i] + ": cannot read it (" + std::strerror(errno) + ")";
      continue;
    }
    ids[i] = *id;
    if (auto cached = cache.lookup(paths[i], *id)) {
      results[i] = std::move(*cached);
    } else {
      to_scan.push_back(paths[i]);
      where.push_back(i);
    }
  }
  if (!to_scan.empty()) {
    std::vector<PluginScanResult> scanned(to_scan.size());
    const std::string scanner = plugin_scanner_path();
    for (size_t next = 0; next < to_scan.size();)
      next = run_scanner(scanner, to_scan, next, scanned);
    for (size_t k = 0; k < to_scan.size(); ++k) {
      // A file replaced while it was scanned is scanned again next time.
      if (scanned[k].info && !(scanned[k].info->file == ids[where[k]]))
        scanned[k].cacheable = false;
      cache.store(to_scan[k], ids[where[k]], scanned[k]);
      results[where[k]] = std::move(scanned[k]);
    }
    cache.save();
  }
  for (auto& r : results)
    if (r.info) r.info->origin = origin;
  return results;
}

}  // namespace tightfit
