#!/usr/bin/env python3
"""bench/time_bound.py: a bench past its bound is stopped with everything it
started, says so, and exits 124; what it printed before the bound comes
through; a bench inside its bound keeps its exit code."""
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
WRAPPER = [sys.executable, str(ROOT / "bench" / "time_bound.py")]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2] if os.path.exists(f"/proc/{pid}/stat") else "X"
    return state not in ("Z", "X")


def main() -> int:
    failures = []
    with tempfile.TemporaryDirectory() as d:
        pidfile = pathlib.Path(d) / "grandchild.pid"
        # A bench that prints, then waits on a run that would outlive it, which
        # ignores SIGTERM (the SIGKILL after it must still end it).
        slow = ("import subprocess, sys\n"
                "print('part 1 measured')\n"
                f"p = subprocess.Popen(['bash', '-c', 'trap \"\" TERM; echo $$ > {pidfile}; "
                "while :; do sleep 1; done'])\n"
                "p.wait()\n")
        started = time.monotonic()
        # Output to files, not pipes: a run left alive would hold a pipe open.
        out, err = pathlib.Path(d) / "out", pathlib.Path(d) / "err"
        with out.open("w") as o, err.open("w") as e:
            try:
                rc = subprocess.run(WRAPPER + ["x", "--", sys.executable, "-c", slow], stdout=o, stderr=e,
                                    env={**os.environ, "BENCH_TIME_BOUND": "2"}, timeout=60).returncode
            except subprocess.TimeoutExpired:
                rc = None
        r = subprocess.CompletedProcess([], rc, out.read_text(), err.read_text())
        took = time.monotonic() - started
        if r.returncode != 124:
            failures.append(f"a bench past its bound: exit {r.returncode}, not 124")
        if "part 1 measured" not in r.stdout:
            failures.append(f"what the bench printed before its bound was lost: {r.stdout!r}")
        if "stopped at its time bound of 2 s" not in r.stderr:
            failures.append(f"no word of the bound: {r.stderr!r}")
        if took > 20:
            failures.append(f"stopping took {took:.1f} s")
        if pidfile.exists():
            pid = int(pidfile.read_text())
            time.sleep(0.5)
            if alive(pid):
                os.kill(pid, 9)
                failures.append("a run the bench started outlived its bound")
        else:
            failures.append("the bench's run never started")
        # An outer `timeout` that ends the wrapper (as scripts/gpu-check's
        # does) ends the bench too, though its process group is its own.
        pidfile2 = pathlib.Path(d) / "bench.pid"
        sleeper = f"import os, time; open({str(pidfile2)!r}, 'w').write(str(os.getpid())); time.sleep(100)"
        subprocess.run(["timeout", "3"] + WRAPPER + ["x", "--", sys.executable, "-c", sleeper],
                       env={**os.environ, "BENCH_TIME_BOUND": "0"}, timeout=60)
        time.sleep(0.5)
        if not pidfile2.exists():
            failures.append("the bench under an outer timeout never started")
        elif alive(int(pidfile2.read_text())):
            os.kill(int(pidfile2.read_text()), 9)
            failures.append("a bench outlived the wrapper an outer timeout ended")
        r = subprocess.run(WRAPPER + ["x", "--", sys.executable, "-c", "import sys; sys.exit(3)"],
                           capture_output=True, text=True, env={**os.environ, "BENCH_TIME_BOUND": "60"})
        if r.returncode != 3:
            failures.append(f"a bench inside its bound: exit {r.returncode}, not its own 3")
    for f in failures:
        print("FAIL:", f)
    print("ok" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
