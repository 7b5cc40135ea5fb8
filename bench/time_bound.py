#!/usr/bin/env python3
"""Runs one benchmark under its time bound, so that every bench finishes in
bounded time on any x86-64 CPU, however slow its matmuls (issue 23: a bench
that printed nothing in 11 minutes on a CPU without native bf16).

The bench runs as a child in a process group of its own; its output passes
through as it is printed. At the bound the whole group (the bench, the
tightfit runs it started, their ranks) gets SIGTERM, then SIGKILL 10 s later,
and this prints what happened and exits 124 (as `timeout` does): what the
bench printed before then was measured, the rest was not, and no pass mark
it had not printed is claimed.

    bench/time_bound.py NAME -- python bench/SCRIPT.py [options]

The bound is BOUNDS[NAME] seconds (bench/README.md lists them), plus what
the options that add runs add (EXTRA); $BENCH_TIME_BOUND (seconds) replaces
it, 0 for none.
"""
import os
import signal
import subprocess
import sys
import time

# Each bench's bound in seconds with its default options: several times what
# it takes on the project's 2-core CPU (bench/README.md, "Time bounds").
BOUNDS = {
    "throughput": 2400,
    "memory": 1800,
    "overheads": 1500,
    "checkpoint": 600,
    "fused-loss": 900,
    "models": 900,
    "strategies": 2400,
    "distributed": 1800,
    "plan": 3600,
    "fit": 900,
    "largest": 300,
    "generation": 600,
    "real-lora": 900,
    "dpo": 1200,
    "moe": 1800,
    "dispatch": 1200,
    "contention": 1800,
    "first-step": 3600,  # a 30B set-up and step: about 9 minutes here
    "long-context": 2400,  # two 8B-wide 2-block runs of 2,048 tokens and eight plans
    "llama-cpp": 3000,  # with the one-time llama.cpp build (about 20 minutes on 2 cores)
}


def extra_seconds(name: str, args: list[str]) -> int:
    """What options that add runs add to a bench's bound."""
    if name == "plan" and "--full-depth" in args:
        return 3600  # 7B at its 32 layers: minutes a step, 3 steps
    if name == "largest" and "--run-steps" in args:
        i = args.index("--run-steps")
        steps = int(args[i + 1]) if i + 1 < len(args) and args[i + 1].isdigit() else 3
        return 1800 + 600 * steps  # a 30B set-up (~9 min here) and ~2 min a step, with room
    if name == "fit" and "--verify-model" in args:
        return 900
    return 0


def bound_for(name: str, args: list[str]) -> int:
    env = os.environ.get("BENCH_TIME_BOUND")
    if env is not None:
        return int(env)
    return BOUNDS.get(name, 1800) + extra_seconds(name, args)


class Ended(Exception):
    """This wrapper was told to end (SIGTERM, SIGHUP)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def stop_group(child: subprocess.Popen) -> None:
    """SIGTERM to the bench's process group, SIGKILL to what is left of it 10 s later
    (a second signal to this wrapper meanwhile changes nothing)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            child.poll()  # reaped, so that a dead leader no longer holds the group
            try:
                os.killpg(child.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    name, cmd = sys.argv[1], sys.argv[3:]
    bound = bound_for(name, cmd[2:])
    started = time.monotonic()
    # Unbuffered: what a bench printed before its bound reaches the log even
    # when its output is a pipe or a file.
    child = subprocess.Popen(cmd, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    # The bench's group is not ours: a `timeout` or a hang-up that ends this
    # wrapper ends the bench with it (stopped below, out of the handler: the
    # wait it interrupts holds Popen's lock).
    def forward(signum, _frame):
        raise Ended(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGHUP, forward)
    try:
        rc = child.wait(timeout=bound if bound > 0 else None)
    except Ended as e:
        stop_group(child)
        child.wait()
        return 128 + e.signum
    except subprocess.TimeoutExpired:
        stop_group(child)
        child.wait()
        print(f"\nbench {name}: stopped at its time bound of {bound} s (bench/README.md, "
              f"'Time bounds'; BENCH_TIME_BOUND=SECONDS sets another): what it printed above "
              f"was measured, the rest was not, and no pass mark it did not print is met",
              file=sys.stderr, flush=True)
        return 124
    except KeyboardInterrupt:
        stop_group(child)
        child.wait()
        return 130
    elapsed = time.monotonic() - started
    print(f"bench {name}: {elapsed:.0f} s (bound {bound} s)", file=sys.stderr, flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
