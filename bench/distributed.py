#!/usr/bin/env python3
"""Data parallel against ZeRO stages 1, 2 and 3, side by side in one run.

Runs configs/gpt2-124m.toml (GPT-2 124M) with `tightfit run --nproc N` (Gloo
on this machine's CPU, one intra-op thread per rank) and the shard strategy
in each mode, a few steps each, and prints from rank 0's metrics.jsonl: peak
tracked memory per rank (total and by category), median step time and the
loss after the last step, each as a ratio to data parallel. A single process
on the same global batch is shown for reference. ZeRO must give the data
parallel losses (it changes where state lives, not the maths).

usage: bench/distributed.py [--nproc N] [--steps N] [--seq-len T] [--batch B] [--json OUT]
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

VARIANTS = {
    "data": 'mode = "data"',
    "zero-1": 'mode = "zero"\nstage = 1',
    "zero-2": 'mode = "zero"\nstage = 2',
    "zero-3": 'mode = "zero"\nstage = 3',
}


def run(name: str, shard: str, nproc: int, batch: int, tmp: str, args) -> dict:
    recipe = (ROOT / "configs" / "gpt2-124m.toml").read_text()
    if shard:
        recipe += f'\n[[strategy]]\nplugin = "shard"\n{shard}\n'
    path = pathlib.Path(tmp) / f"{name}.toml"
    path.write_text(recipe)
    cmd = [str(TIGHTFIT), "run", str(path), "--quiet", "--set", f"run.steps={args.steps}",
           "--set", f"run.out_dir={tmp}", "--set", f"run.name={name}", "--set", "run.sample_tokens=0",
           "--set", "run.eval_batches=0", "--set", "save.final=false", "--set", "save.every=0",
           "--set", f"run.threads={args.threads}",
           "--set", f"data.seq_len={args.seq_len}", "--set", f"data.batch_size={batch}"]
    if nproc > 1:
        cmd[2:2] = ["--nproc", str(nproc)]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"{name} failed ({done.returncode}):\n{done.stderr}")
    rows = [json.loads(line) for line in (pathlib.Path(tmp) / name / "metrics.jsonl").open()]
    times = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])]
    last = rows[-1]
    return {"median_step_s": statistics.median(times), "loss": last["loss"],
            **{k: v for k, v in last.items() if k.startswith("peak_")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2, help="rows per rank")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    ap.add_argument("--json")
    args = ap.parse_args()
    mib = 1 << 20
    print(f"GPT-2 124M, seq {args.seq_len}, {args.batch} rows x {args.nproc} ranks, {args.steps} steps each, "
          f"fp32 CPU, Gloo, {args.threads} thread(s) per rank; memory is rank 0's")
    print(f"{'recipe':16}{'peak MiB':>10}{'ratio':>7}{'weights':>9}{'grads':>8}{'optim':>8}{'activ':>8}"
          f"{'step s':>8}{'ratio':>7}{'loss':>9}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        todo = [(name, shard, args.nproc, args.batch) for name, shard in VARIANTS.items()]
        todo.append(("1 process", "", 1, args.batch * args.nproc))
        for name, shard, nproc, batch in todo:
            r = run(name.replace(" ", "-"), shard, nproc, batch, tmp, args)
            results[name] = r
            d = results["data"]
            print(f"{name:16}{r['peak_total'] / mib:10.0f}{r['peak_total'] / d['peak_total']:7.2f}"
                  f"{r['peak_weights'] / mib:9.0f}{r['peak_grads'] / mib:8.0f}{r['peak_optimizer'] / mib:8.0f}"
                  f"{r['peak_activations'] / mib:8.0f}{r['median_step_s']:8.2f}"
                  f"{r['median_step_s'] / d['median_step_s']:7.2f}{r['loss']:9.4f}", flush=True)
    if args.json:
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
