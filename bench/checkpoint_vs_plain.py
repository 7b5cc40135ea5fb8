#!/usr/bin/env python3
"""Activation checkpointing vs the plain recipe, side by side in one run.

Runs `tightfit run` on configs/gpt2-124m.toml and configs/gpt2-124m-checkpoint.toml
(GPT-2 124M, seq 512, batch 4 unless overridden) for a few steps each and
prints, from their metrics.jsonl, the peak activation bytes and the median
step time of each, and the ratios checkpoint / plain.

Pass marks (the foundation issue's and bench targets): activation peak ratio
<= 0.35 and step-time ratio <= 1.35. --check exits non-zero when one is missed.

usage: bench/checkpoint_vs_plain.py [--steps N] [--seq-len T] [--batch B] [--check] [--json OUT]
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
TIGHTFIT = ROOT / "build" / "bin" / "tightfit"


def run(recipe: str, out_dir: str, steps: int, seq_len: int, batch: int) -> dict:
    cmd = [str(TIGHTFIT), "run", str(ROOT / "configs" / recipe), "--quiet",
           "--set", f"run.steps={steps}", "--set", f"run.out_dir={out_dir}",
           "--set", f"data.seq_len={seq_len}", "--set", f"data.batch_size={batch}",
           "--set", "run.sample_tokens=0", "--set", "run.eval_batches=0", "--set", "save.final=false"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    name = "gpt2-124m-checkpoint" if "checkpoint" in recipe else "gpt2-124m"
    rows = [json.loads(line) for line in (pathlib.Path(out_dir) / name / "metrics.jsonl").open()]
    times = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])]  # drops the first step
    return {"recipe": recipe, "steps": len(rows),
            "peak_activations": rows[-1]["peak_activations"],
            "peak_total": rows[-1]["peak_total"],
            "median_step_s": statistics.median(times), "final_loss": rows[-1]["loss"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plain = run("gpt2-124m.toml", tmp, args.steps, args.seq_len, args.batch)
        ckpt = run("gpt2-124m-checkpoint.toml", tmp, args.steps, args.seq_len, args.batch)
    act_ratio = ckpt["peak_activations"] / plain["peak_activations"]
    time_ratio = ckpt["median_step_s"] / plain["median_step_s"]
    mib = 1 << 20
    print(f"GPT-2 124M, seq {args.seq_len}, batch {args.batch}, {args.steps} steps each, CPU")
    print(f"{'':28}{'plain':>12}{'checkpoint':>12}{'ratio':>8}")
    print(f"{'peak activations (MiB)':28}{plain['peak_activations'] / mib:12.1f}"
          f"{ckpt['peak_activations'] / mib:12.1f}{act_ratio:8.3f}")
    print(f"{'peak total (MiB)':28}{plain['peak_total'] / mib:12.1f}"
          f"{ckpt['peak_total'] / mib:12.1f}{ckpt['peak_total'] / plain['peak_total']:8.3f}")
    print(f"{'median step time (s)':28}{plain['median_step_s']:12.3f}{ckpt['median_step_s']:12.3f}{time_ratio:8.3f}")
    print(f"{'loss after last step':28}{plain['final_loss']:12.4f}{ckpt['final_loss']:12.4f}")
    marks = {"activation peak ratio <= 0.35": act_ratio <= 0.35, "step time ratio <= 1.35": time_ratio <= 1.35}
    for mark, ok in marks.items():
        print(f"{'PASS' if ok else 'MISS'}  {mark}")
    if args.json:
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.json).write_text(json.dumps(
            {"plain": plain, "checkpoint": ckpt, "activation_ratio": act_ratio, "time_ratio": time_ratio}, indent=2))
    return 1 if args.check and not all(marks.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
