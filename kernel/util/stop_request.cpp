#include "stop_request.hpp"

#include <unistd.h>

#include <atomic>
#include <csignal>

namespace tightfit {
namespace {

// Lock-free atomics only: they are read and written from the handler.
std::atomic<int> requested{0};
std::atomic<bool> armed{false};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free);

void say(const char* text) {
  size_t n = 0;
  while (text[n]) ++n;
  // Nothing to do if stderr is gone: the request stands either way.
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, text, n);
}

void on_signal(int signal) {
  if (!armed.load() || requested.load() != 0) {
    // Not training, or asked twice: the signal's own action, at once.
    std::signal(signal, SIG_DFL);
    std::raise(signal);
    return;
  }
  requested.store(signal);
  say(signal == SIGINT
          ? "\ntightfit: stopping after this step to save a checkpoint (Ctrl-C again stops at "
            "once, keeping only what was saved before)\n"
          : "\ntightfit: SIGTERM: stopping after this step to save a checkpoint\n");
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a read or write in progress goes on
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

void arm_stop_request() {
  armed.store(true);
}

void disarm_stop_request() {
  armed.store(false);
}

int stop_requested() {
  return requested.load();
}

void request_stop(int signal) {
  requested.store(signal);
}

void clear_stop_request() {
  requested.store(0);
}

}  // namespace tightfit
