// How idle OpenMP threads wait (openmp_waits.cpp says why).
#pragma once

namespace tightfit {

// When this process's passive waits are tightfit's own choice (not the
// user's OMP_WAIT_POLICY or GOMP_SPINCOUNT) and its threads follow the
// machine's load, starts this executable again, same arguments, with a
// short spin (GOMP_SPINCOUNT=3000): libgomp reads it only as it loads. Call
// it before anything is written or opened. In the respawned image it returns
// at once and leaves the environment as a child of it should inherit.
void spin_briefly_while_threads_adapt(bool threads_adapt);

}  // namespace tightfit
