// `tightfit run --nproc N`: N local ranks of this same binary, with the
// environment torchrun would give them, watched until all have finished.
#pragma once

#include <string>
#include <vector>

namespace tightfit::host {

// Starts `nproc` copies of this executable with `args` (RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT=a free port) and waits. When
// a rank fails, says which and how, gives the others `grace_s` seconds to
// stop on their own (they notice within [run].dist_timeout) and then ends
// them. Returns the first failing rank's exit code, 0 when all succeed.
int launch_local_ranks(int nproc, const std::vector<std::string>& args, double grace_s);

// Runs this executable with `args`, its output to the file `log`, and waits;
// returns its exit code (128 + signal when killed).
int run_self(const std::vector<std::string>& args, const std::string& log);

// Runs the program `exe` with `args` (an argument vector: no shell reads
// them), its output to the file `log` (a symbolic link there is refused,
// not followed), and waits; returns its exit code, 127 when it cannot start.
int run_program(const std::string& exe, const std::vector<std::string>& args,
                const std::string& log);

}  // namespace tightfit::host
