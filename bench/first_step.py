#!/usr/bin/env python3
"""Time to the first step: how long the 1.5B, 7B, 13B and 30B recipes take
from `tightfit run` to the end of their first training step on this
machine, and how much of it is set-up (the model built or read, quantized,
written to its tier and placed) — the wait a user has before anything trains.

Each recipe runs one step, as `tightfit run RECIPE --set run.steps=1` would,
and the figures are those its summary prints ("first step  done ... after
start (set-up ...)"), with its peak memory. The 13B and 30B rows are
configs/llama-7b-qlora-4gib.toml with `model.preset` set (the 30B under an
8 GiB budget: its plan needs 4.3 GiB), the Qwen2 1.5B QLoRA one with one
micro-batch of 1 x 256 tokens. Random weights, as the recipes have
them; a disk tier needs its free disk in the run folder (30B: 15 GiB).

Pass mark (--check exits 1 when missed): the 7B QLoRA 4 GiB recipe's first
step ends within --mark seconds (60 by default, as issue 62 sets it).

usage: bench/first_step.py [--only 7B,13B] [--mark 60] [--check] [--json OUT]
"""
import argparse
import pathlib
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from tightfit_runs import ROOT, finish, report_marks, run_args  # noqa: E402

RECIPES = [
    ("GPT-2 1.5B", "gpt2-1.5b-8gib.toml", []),
    # One micro-batch of 1 x 256 (the recipe's step is 8 x 8 x 512 tokens:
    # about 15 minutes on 2 cores, all of it step, none of it set-up).
    ("Qwen2 1.5B QLoRA", "qwen-1.5b-qlora.toml",
     ["schedule.micro_batches=1", "data.batch_size=1", "data.seq_len=256"]),
    ("7B", "llama-7b-qlora-4gib.toml", []),
    ("13B", "llama-7b-qlora-4gib.toml", ["model.preset=13B"]),
    ("30B", "llama-7b-qlora-4gib.toml", ["model.preset=30B", "run.memory_budget=8GiB"]),
]


def seconds(text: str) -> float:
    """'1m44s' or '55s' or '1h02m' as seconds."""
    total = 0.0
    for value, unit in re.findall(r"(\d+)([hms])", text):
        total += int(value) * {"h": 3600, "m": 60, "s": 1}[unit]
    return total


def first_step(recipe: str, sets: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as out:
        # The recipe's own budget stays: the set-up it plans for is the one timed.
        args = run_args(str(ROOT / "configs" / recipe), out, 1, sets, keep_budget=True)
        t0 = time.monotonic()
        p = subprocess.run(args, capture_output=True, text=True)
        wall = time.monotonic() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{p.stderr[-3000:]}")
    m = re.search(r"first step\s+done (\S+) after start \(set-up (\S+):", p.stdout)
    if not m:
        raise RuntimeError(f"no first-step line in the summary:\n{p.stdout}")
    peak = re.search(r"peak memory\s+(\S+) total", p.stdout)
    return {"first_step_s": seconds(m.group(1)), "setup_s": seconds(m.group(2)),
            "step_s": seconds(m.group(1)) - seconds(m.group(2)), "wall_s": round(wall, 1),
            "peak": peak.group(1) if peak else "?"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated row names (GPT-2 1.5B, 7B, 13B, ...)")
    ap.add_argument("--mark", type=float, default=60.0)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    only = [o.strip() for o in args.only.split(",") if o.strip()]
    results = {"date": time.strftime("%Y-%m-%d"), "rows": []}
    print(f"{'recipe':<18} {'set-up':>8} {'first step':>11} {'done after':>11} {'peak':>9}")
    for name, recipe, sets in RECIPES:
        if only and name not in only:
            continue
        r = first_step(recipe, sets)
        r.update({"name": name, "recipe": recipe, "sets": sets})
        results["rows"].append(r)
        print(f"{name:<18} {r['setup_s']:>7.0f}s {r['step_s']:>10.0f}s {r['first_step_s']:>10.0f}s "
              f"{r['peak']:>9}", flush=True)
    marks = []
    seven = [r for r in results["rows"] if r["name"] == "7B"]
    if seven:
        got = seven[0]["first_step_s"]
        marks.append((f"7B QLoRA 4 GiB first step within {args.mark:.0f} s", got <= args.mark,
                      f"{got:.0f} s (set-up {seven[0]['setup_s']:.0f} s)"))
    return finish(args, results, report_marks(marks))


if __name__ == "__main__":
    sys.exit(main())
