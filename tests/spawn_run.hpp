// `tightfit run` started as a child process with its output in a file, for
// tests that signal or kill it mid-run (crash safety, interrupts).
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

namespace tightfit::test {

// Starts TIGHTFIT_BINARY with `args` (after the program name), stdout and
// stderr appended (or, with `truncate`, written fresh) to `log`.
inline pid_t start_tightfit(const std::vector<std::string>& args, const std::string& log,
                            bool truncate = false) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::FILE* out = std::freopen(log.c_str(), truncate ? "w" : "a", stdout);
    if (out) ::dup2(::fileno(stdout), STDERR_FILENO);
    std::vector<char*> argv{const_cast<char*>(TIGHTFIT_BINARY)};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(TIGHTFIT_BINARY, argv.data());
    ::_exit(127);
  }
  return pid;
}

}  // namespace tightfit::test
