// A request to stop training at the next step boundary (Ctrl-C, SIGTERM),
// made from a signal handler and read by the training loop. The loop arms it
// while it runs steps; a signal that comes while it is not armed (set-up,
// the summary) or a second one stops the process at once, as the signal's
// default would.
#pragma once

namespace tightfit {

// Installs the handlers for SIGINT and SIGTERM (the command-line host, once).
void install_stop_handlers();

// The training loop's window: between arm and disarm a first signal asks it
// to stop after the step it is in.
void arm_stop_request();
void disarm_stop_request();

// The signal that asked the loop to stop (SIGINT, SIGTERM), or 0.
int stop_requested();

// Asks as a first signal would (tests, and a host that stops a run itself);
// clear forgets a request (a process that trains again after one).
void request_stop(int signal);
void clear_stop_request();

}  // namespace tightfit
