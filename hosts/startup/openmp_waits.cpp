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
#include <sys/auxv.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace {

char kPassive[] = "OMP_WAIT_POLICY=PASSIVE";

void passive_openmp_waits(int, char** argv, char** envp) {
  size_t n = 0;
  for (; envp != nullptr && envp[n] != nullptr; ++n)
    if (std::strncmp(envp[n], "OMP_WAIT_POLICY=", 16) == 0) return;  // the user's
  // Started as `ld.so ./tightfit`: /proc/self/exe is the loader, which would
  // read the program's arguments as its own.
  if (getauxval(AT_BASE) == 0) return;
  auto** env = static_cast<char**>(std::malloc((n + 2) * sizeof(char*)));
  if (env == nullptr) return;
  if (n > 0) std::memcpy(env, envp, n * sizeof(char*));
  env[n] = kPassive;
  env[n + 1] = nullptr;
  execve("/proc/self/exe", argv, env);
  std::free(env);  // no /proc: the spinning waits, nothing else lost
}

[[gnu::section(".preinit_array"),
  gnu::used]] void (*const kPassiveOpenmpWaits)(int, char**, char**) = &passive_openmp_waits;

}  // namespace
