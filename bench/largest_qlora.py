"""The largest LLaMA shape whose QLoRA training step fits a memory budget
(4 GiB by default) on this machine, found by `tightfit fit`: for each shape
(7B, 13B, 30B, 70B) a QLoRA recipe (NF4 double-quantized base, bf16
compute, LoRA r16 on q/k/v/o, batch 1 x 256, AdamW) is handed to
`fit --keep lora,quantize,precision`, which searches the rest
(checkpointing, offload tiers and prefetch, micro-batches) and plans each
stack. Twice: with the
model's own weights (embedding, head, norms) in fp32 and in bf16
(`model.dtype`, as QLoRA keeps them). A shape fits when the plan's safe
budget (the plan + its margin of error) is inside the budget; one whose plan
fits but whose safe budget does not is "tight": a run of it may stop out of
budget, so it is not called a fit. `--run-steps N` then trains the largest
fitting recipe (with --tight, the largest tight one) whose disk tier fits
the free disk here for N steps under /usr/bin/time -v: losses, s/step, peak
tracked and peak RSS.

    bench/run largest [--budget 4GiB] [--shapes 7B,13B,30B,70B] [--run-steps 3] [--tight]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from tightfit_runs import QLORA_STRATEGIES, TIGHTFIT, finish, step_times

RECIPE = """[run]
name = "qlora-{shape}-{dtype}"
seed = 1234
steps = 3
log_every = 1
sample_tokens = 0
eval_batches = 0
memory_budget = "{budget}"
out_dir = "{out}"
[model]
plugin = "llama"
preset = "{shape}"
dtype = "{dtype}"
[data]
corpus = "builtin:fortunes"
tokenizer = "byte"  # no weights: the byte tokenizer, said (no "auto" to resolve)
seq_len = 256
batch_size = 1
[optimizer]
name = "adamw"
lr = 5e-4
weight_decay = 0.0
[schedule]
plugin = "standard"
warmup_steps = 1
decay = "constant"
[save]
every = 0
final = false
""" + QLORA_STRATEGIES


def fit(recipe, budget, out):
    cmd = [str(TIGHTFIT), "fit", recipe, "--budget", budget, "--keep", "lora,quantize,precision", "--json",
           "--out", out]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode == 3:
        return None, p.stderr.strip().splitlines()[-1]
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    return json.loads(p.stdout), ""


def plan_json(recipe):
    p = subprocess.run([str(TIGHTFIT), "plan", recipe, "--json"], capture_output=True, text=True,
                       check=True)
    return json.loads(p.stdout)


def train(recipe, steps, out, budget=None):
    """Runs the recipe for `steps` under /usr/bin/time -v: its metrics rows and peak RSS."""
    cmd = ["/usr/bin/time", "-v", str(TIGHTFIT), "run", recipe, "--quiet", "--set",
           f"run.steps={steps}", "--set", f"run.out_dir={out}"]
    if budget:
        cmd += ["--set", f"run.memory_budget={budget}"]
    start = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - start
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-4000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1)) * 1024
    name = os.path.basename(recipe).removesuffix(".fit.toml")
    rows = [json.loads(line) for line in open(os.path.join(out, name, "metrics.jsonl"))]
    return rows, rss, wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--budget", default="4GiB")
    ap.add_argument("--shapes", default="7B,13B,30B,70B")
    ap.add_argument("--run-steps", type=int, default=0,
                    help="train the largest fitting recipe whose disk tier fits here for N steps")
    ap.add_argument("--tight", action="store_true",
                    help="--run-steps: train the largest tight recipe (plan fits, safe budget does not) "
                    "under its safe budget, to measure how far its plan is off")
    ap.add_argument("--out", default="", help="where the run writes (default: a temporary folder)")
    ap.add_argument("--check", action="store_true", help="(no pass mark: accepted for bench/run)")
    args = ap.parse_args()
    results = {"budget": args.budget, "rows": []}
    tmp = tempfile.mkdtemp(prefix="tightfit-largest-")
    out = args.out or os.path.join(tmp, "runs")
    os.makedirs(out, exist_ok=True)
    try:
        print(f"QLoRA (NF4 base, bf16 compute, LoRA r16 q/k/v/o, batch 1 x 256) in {args.budget}, "
              "by tightfit fit")
        print(f"{'shape':5} {'weights':7} {'params':>7} {'peak':>8} {'safe':>8} {'disk':>8} {'s/step':>8}  stack")
        fitted = []
        for dtype in ("fp32", "bf16"):
            for shape in args.shapes.split(","):
                recipe = os.path.join(tmp, f"qlora-{shape}-{dtype}.toml")
                with open(recipe, "w") as f:
                    f.write(RECIPE.format(shape=shape, dtype=dtype, budget=args.budget, out=out))
                written = os.path.join(tmp, f"qlora-{shape}-{dtype}.fit.toml")
                r, why = fit(recipe, args.budget, written)
                row = {"shape": shape, "weights": dtype}
                if r is None:
                    row["fits"] = False
                    row["why"] = why
                    print(f"{shape:5} {dtype:7} {'':>7} {'-':>8} {'-':>8} {'-':>8} {'-':>8}  does not fit: "
                          f"{why.split('the smallest is ')[-1]}")
                else:
                    b = r["best"][0]
                    p = plan_json(written)
                    tight = p["safe_budget"] > r["budget"]  # fit's own reading of --budget
                    row.update(fits=not tight, tight=tight, stack=b["stack"],
                               planned_peak=p["tracked_peak"], safe_budget=p["safe_budget"],
                               disk_bytes=p["disk_bytes"], params=p["n_params"],
                               predicted_step_s=b["predicted_step_s"])
                    fitted.append((row, written))
                    print(f"{shape:5} {dtype:7} {p['n_params'] / 1e9:6.1f}B "
                          f"{p['tracked_peak'] / 2**30:7.2f}G {p['safe_budget'] / 2**30:7.2f}G "
                          f"{p['disk_bytes'] / 2**30:7.1f}G "
                          f"{b['predicted_step_s']:8.0f}  {b['stack']}"
                          + ("  (tight: may stop out of budget)" if tight else ""))
                results["rows"].append(row)
        for dtype in ("fp32", "bf16"):
            fits = [r for r, _ in fitted if r["weights"] == dtype and not r["tight"]]
            tight = [r for r, _ in fitted if r["weights"] == dtype and r["tight"]]
            if tight and (not fits or max(r["params"] for r in tight) > max(r["params"] for r in fits)):
                t = max(tight, key=lambda r: r["params"])
                print(f"plan fits {args.budget} but not its margin, with {dtype} weights: {t['shape']} "
                      f"(safe budget {t['safe_budget'] / 2**30:.2f} GiB)")
            if fits:
                best = max(fits, key=lambda r: r["params"])
                results[f"largest_{dtype}"] = best["shape"]
                print(f"largest that fits {args.budget} with {dtype} weights: {best['shape']} "
                      f"({best['params'] / 1e9:.1f}B parameters, {best['planned_peak'] / 2**30:.2f} GiB "
                      f"planned, {best['disk_bytes'] / 2**30:.1f} GiB on disk)")
        if args.run_steps > 0:
            free = shutil.disk_usage(out).free
            runnable = [(r, w) for r, w in fitted
                        if r["disk_bytes"] < 0.9 * free and r["tight"] == args.tight]
            kind = "tight" if args.tight else "fitting"
            if not runnable:
                sys.exit(f"no {kind} recipe's disk tier fits the {free / 2**30:.1f} GiB free in {out}")
            # The largest; at one shape, bf16 model weights (as QLoRA keeps them).
            pick, pick_recipe = max(runnable, key=lambda p: (p[0]["params"], p[0]["weights"] == "bf16"))
            skipped = [r for r, _ in fitted
                       if r["params"] > pick["params"] and r["tight"] == args.tight]
            for r in skipped:
                print(f"not run: {r['shape']} ({r['weights']}) needs {r['disk_bytes'] / 2**30:.1f} GiB "
                      f"of disk, {free / 2**30:.1f} GiB is free in {out}")
            print(f"training {pick['shape']} ({pick['weights']} weights, {pick['stack']}) for "
                  f"{args.run_steps} steps ...", flush=True)
            # A tight recipe runs under its safe budget: the point is how far its plan is off.
            rows, rss, wall = train(pick_recipe, args.run_steps, out,
                                    str(pick["safe_budget"]) if args.tight else None)
            times = step_times(rows)
            run = {"shape": pick["shape"], "weights": pick["weights"], "stack": pick["stack"],
                   "losses": [r["loss"] for r in rows], "step_s": times,
                   "first_step_s": rows[0]["elapsed_s"], "wall_s": wall,
                   "peak_tracked": max(r["peak_total"] for r in rows), "peak_rss": rss,
                   "planned_peak": pick["planned_peak"]}
            results["run"] = run
            print(f"losses {', '.join(f'{x:.4f}' for x in run['losses'])}; s/step "
                  f"{', '.join(f'{t:.0f}' for t in times)} after a first step of "
                  f"{run['first_step_s']:.0f} s (with setup); wall {wall / 60:.1f} min")
            print(f"peak tracked {run['peak_tracked'] / 2**30:.2f} GiB (planned "
                  f"{pick['planned_peak'] / 2**30:.2f}), peak RSS {rss / 2**30:.2f} GiB")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return finish(args, results, True)


if __name__ == "__main__":
    sys.exit(main())
