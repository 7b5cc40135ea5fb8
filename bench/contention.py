#!/usr/bin/env python3
"""A training step on a busy machine: the main job's step (configs/default.toml,
LoRA r8 on SmolLM2-135M-Instruct from its GGUF, 4 rows of 256 tokens) and
transformers + PEFT's step on the same file, each alone and beside one and
two busy processes of the same priority (a Python loop each, as a compile or
a browser tab would be), in one run. Users' machines are not quiet: a
trainer whose threads wait on each other while the scheduler gives one of
their CPUs to someone else slows down far more than its fair share.

Each figure is the median step after the first; the slowdown is a side's
step beside k busy processes over its step alone. A fair share of this
machine's CPUs beside k busy processes would be (cpus + k) / cpus.

tightfit runs as a user would: [run] threads = 0 (one thread per CPU it may
use) with [run] adapt_threads = true as configs/default.toml sets it; the
peer with LibTorch's defaults (torch.get_num_threads()).

Pass marks (--check exits 1 when one is missed), on 2 CPUs:
  tightfit's slowdown beside one busy process <= 2.0x
  tightfit's slowdown <= the peer's, beside one and beside two

usage: bench/contention.py [--steps N] [--busy 0,1,2] [--check] [--json OUT]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from tightfit_runs import ROOT, finish, report_marks, run  # noqa: E402
from real_lora_vs_peft import GGUF, PEER, ROWS, SEQ  # noqa: E402

BUSY = "while True: pass"


def busy(k: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(k)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def tightfit_step(steps: int) -> dict:
    last = run("default.toml", ["run.answer_prompts="], steps=steps)
    return {"step_s": median(last["times"]), "times": last["times"]}


def peer_step(steps: int) -> dict:
    p = subprocess.run([sys.executable, "-c", PEER, str(GGUF), str(ROOT / "configs" / "data" / "persona-train.jsonl"),
                        str(steps), str(ROWS), str(SEQ), "lora"], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"the transformers + PEFT side failed:\n{p.stderr[-3000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    times = out["times"][1:]
    return {"step_s": median(times), "times": times, "threads": out["threads"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--busy", default="0,1,2", help="numbers of busy processes, 0 first")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not GGUF.exists():
        sys.exit(f"{GGUF} is missing: run scripts/setup")
    levels = [int(k) for k in args.busy.split(",")]
    if levels[0] != 0:
        sys.exit("--busy must start with 0 (the step alone)")
    cpus = len(os.sched_getaffinity(0))
    sides = {"tightfit": tightfit_step, "transformers + PEFT": peer_step}
    step = {name: {} for name in sides}
    for k in levels:
        procs = busy(k)
        try:
            time.sleep(1.0)  # the busy processes settle
            for name, fn in sides.items():
                r = fn(args.steps)
                step[name][k] = r["step_s"]
                print(f"beside {k} busy: {name:20s} step {r['step_s']:.2f} s "
                      f"(slowdown {r['step_s'] / step[name][0]:.2f}x, fair {(cpus + k) / cpus:.2f}x)", flush=True)
        finally:
            stop(procs)
    results = {"date": time.strftime("%Y-%m-%d"), "cpus": cpus, "steps": args.steps, "sides": {}}
    for name in sides:
        results["sides"][name] = {f"beside {k}: step s": round(step[name][k], 3) for k in levels}
        results["sides"][name].update(
            {f"beside {k}: slowdown": round(step[name][k] / step[name][0], 3) for k in levels if k})
    marks = []
    slow = {name: {k: step[name][k] / step[name][0] for k in levels if k} for name in sides}
    if 1 in slow["tightfit"]:
        marks.append(("tightfit's slowdown beside one busy process <= 2.0x", slow["tightfit"][1] <= 2.0,
                      f"{slow['tightfit'][1]:.2f}x"))
    for k in slow["tightfit"]:
        ours, theirs = slow["tightfit"][k], slow["transformers + PEFT"][k]
        marks.append((f"tightfit's slowdown beside {k} <= transformers + PEFT's", ours <= theirs,
                      f"{ours:.2f}x vs {theirs:.2f}x"))
    return finish(args, results, report_marks(marks))


if __name__ == "__main__":
    sys.exit(main())
