// Idle OpenMP threads sleep rather than spin, unless the user says otherwise.
//
// LibTorch's CPU kernels run on GNU OpenMP, whose threads, with
// OMP_WAIT_POLICY unset, spin (300000 turns) at the end of every parallel
// region before they sleep. While every CPU is busy (a second trainer, a
// compile, `ctest -j2`), a spinning thread holds the CPU its partner needs to
// reach the barrier, and a region of microseconds waits out a scheduler
// slice: a tiny RWKV's three steps took 1.5 s alone and 18 s beside a copy of
// themselves on a 2-CPU machine, 1.0 s and 1.6 s with passive waits; the main
// job's step 3.13 -> 3.00 s alone and 6.17 -> 5.55 s beside a busy process
// (bench/run contention, 2026-12-05).
//
// libgomp reads the variable once, in its constructor, before main; and
// libc sets the environment from exec's arguments after an executable's
// .preinit_array has run, so a setenv there is lost. So the executable runs
// itself again, from its .preinit_array, with the variable added: before any
// library's constructor has run, so the first start costs the exec and the
// dynamic loader's mapping alone (`tightfit --version` 0.34 -> 0.36 s). A
// value the user gave, even empty, is kept, and then nothing runs twice
// (under a debugger or valgrind, set it to skip the exec).
// Executables link this object (tightfit, the tests); a shared library
// cannot carry a .preinit_array.
//
// A run whose threads follow the machine's load ([run] adapt_threads) spins
// briefly instead (spin_briefly_while_threads_adapt below): beside a busy
// process it trains on one thread, which waits on no partner, and on a quiet
// machine a decode's thousands of small regions a token no longer pay a
// futex wake each.
#include "openmp_waits.hpp"

#include <sys/auxv.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string_view>

namespace {

char kPassive[] = "OMP_WAIT_POLICY=PASSIVE";
// Says the policy above is tightfit's, not the user's (children inherit both).
char kOurs[] = "TIGHTFIT_OPENMP_WAITS=passive";
constexpr const char* kOursName = "TIGHTFIT_OPENMP_WAITS";
char** started_argv = nullptr;  // the arguments this image was started with

void passive_openmp_waits(int, char** argv, char** envp) {
  started_argv = argv;
  size_t n = 0;
  for (; envp != nullptr && envp[n] != nullptr; ++n)
    if (std::strncmp(envp[n], "OMP_WAIT_POLICY=", 16) == 0) return;  // the user's
  // Started as `ld.so ./tightfit`: /proc/self/exe is the loader, which would
  // read the program's arguments as its own.
  if (getauxval(AT_BASE) == 0) return;
  auto** env = static_cast<char**>(std::malloc((n + 3) * sizeof(char*)));
  if (env == nullptr) return;
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i)  // a stale marker without the policy is not ours
    if (std::strncmp(envp[i], "TIGHTFIT_OPENMP_WAITS=", 22) != 0) env[kept++] = envp[i];
  env[kept] = kPassive;
  env[kept + 1] = kOurs;
  env[kept + 2] = nullptr;
  execve("/proc/self/exe", argv, env);
  std::free(env);  // no /proc: the spinning waits, nothing else lost
}

[[gnu::section(".preinit_array"),
  gnu::used]] void (*const kPassiveOpenmpWaits)(int, char**, char**) = &passive_openmp_waits;

}  // namespace

namespace tightfit {

void spin_briefly_while_threads_adapt(bool threads_adapt) {
  const char* ours = std::getenv(kOursName);
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  // The user chose the policy (or there was no exec): a marker inherited
  // beside a policy the user set again is not ours.
  if (ours == nullptr || policy == nullptr || std::string_view(policy) != "PASSIVE") return;
  if (std::string_view(ours) == "short-spin") {
    // This image is the respawn: libgomp has read the spin count, and a
    // tightfit this one starts (`tightfit ab`, ranks) chooses for its own recipe.
    unsetenv("GOMP_SPINCOUNT");
    setenv(kOursName, "passive", 1);
    return;
  }
  if (!threads_adapt || std::getenv("GOMP_SPINCOUNT") != nullptr || started_argv == nullptr) return;
  // 3000 turns, a few microseconds: the GRPO recipe's decode token of 16
  // rows took 90-107 ms against 154-176 ms passive on 2 cores (docs/benchmarks.md).
  setenv("GOMP_SPINCOUNT", "3000", 1);
  setenv(kOursName, "short-spin", 1);
  execv("/proc/self/exe", started_argv);
  unsetenv("GOMP_SPINCOUNT");  // no exec: the passive waits stand
  setenv(kOursName, "passive", 1);
}

}  // namespace tightfit
