#include "launch.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <stdexcept>
#include <thread>

#include "commands.hpp"

namespace tightfit::host {
namespace {

// A port the kernel gives out now; rank 0's store binds it a moment later.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error(std::string("cannot find a free port: ") + std::strerror(errno));
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("cannot find this executable (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           ::strsignal(WTERMSIG(status)) + ")";
  return "stopped";
}

// In a forked child: becomes the program `exe` with `args`.
[[noreturn]] void exec_program(const std::string& exe, const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(exe.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(exe.c_str(), argv.data());
  std::cerr << "tightfit: cannot start " << exe << ": " << std::strerror(errno) << "\n";
  ::_exit(127);
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

}  // namespace

namespace {
// SIGTERM sent to the launcher alone, for its ranks (a terminal's Ctrl-C
// reaches them itself: they are in its process group).
volatile std::sig_atomic_t terminate_requests = 0;
void on_terminate(int) {
  terminate_requests = terminate_requests + 1;
}
}  // namespace

int launch_local_ranks(int nproc, const std::vector<std::string>& args, double grace_s) {
  const std::string exe = self_exe();
  const std::string port = std::to_string(free_port());
  std::map<pid_t, int> ranks;  // running children
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      exec_program(exe, args);
    }
    ranks[pid] = r;
  }

  // The ranks stop at a step boundary and save on Ctrl-C or SIGTERM; the
  // launcher waits for them rather than leave them behind.
  std::signal(SIGINT, SIG_IGN);
  std::signal(SIGTERM, on_terminate);
  std::sig_atomic_t forwarded = 0;
  int result = 0;
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (!ranks.empty()) {
    for (; forwarded < terminate_requests; ++forwarded)
      for (const auto& [p, r] : ranks) ::kill(p, SIGTERM);
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno != EINTR) break;
    if (pid <= 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        for (const auto& [p, r] : ranks) {
          write_stderr_line("tightfit: rank " + std::to_string(r) + " did not stop " +
                            std::to_string(grace_s) + " s after the failure; ending it");
          ::kill(p, SIGKILL);
        }
        deadline = std::chrono::steady_clock::time_point::max();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    auto it = ranks.find(pid);
    if (it == ranks.end()) continue;
    const int rank = it->second;
    ranks.erase(it);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    // Stopped by Ctrl-C or SIGTERM: every rank stops at the same step
    // boundary and saves together, so the others are not hurried.
    if (WIFEXITED(status) && (WEXITSTATUS(status) == 130 || WEXITSTATUS(status) == 143)) {
      if (result == 0) result = WEXITSTATUS(status);
      continue;
    }
    if (result == 0 || result == 130 || result == 143) {
      result = exit_code(status);
      write_stderr_line("tightfit: rank " + std::to_string(rank) + " of " + std::to_string(nproc) +
                        " " + describe(status) + "; the other ranks stop too");
      deadline = std::chrono::steady_clock::now() +
                 std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000));
    }
  }
  return result;
}

int run_self(const std::vector<std::string>& args, const std::string& log) {
  return run_program(self_exe(), args, log);
}

int run_program(const std::string& exe, const std::vector<std::string>& args,
                const std::string& log) {
  // Opened before the fork, so that a log that cannot be made is said here;
  // a link planted at its name is refused, never written through.
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0)
    throw std::runtime_error("cannot write " + log + ": " +
                             (errno == ELOOP ? std::string("it is a symbolic link")
                                             : std::string(std::strerror(errno))));
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::dup2(fd, 1);  // dup2's copies do not inherit O_CLOEXEC
    ::dup2(fd, 2);
    exec_program(exe, args);
  }
  ::close(fd);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return exit_code(status);
}

}  // namespace tightfit::host
