#!/usr/bin/env python3
"""Memory strategies against the plain recipe, side by side in one run.

Runs configs/gpt2-124m.toml (GPT-2 124M, seq 512, batch 4 unless overridden)
or, with --model llama-1b, the same recipe with a Llama-3.2-1B-shaped model,
plain and with each strategy or stack, a few steps each, and prints from each
run's metrics.jsonl: peak tracked memory (total and by category), median step
time, and the loss after the last step, each strategy as a ratio to plain.

usage: bench/strategies.py [--model gpt2-124m|llama-1b] [--steps N] [--seq-len T] [--batch B]
                           [--only NAME,...] [--json OUT]
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from tightfit_runs import finish  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
TIGHTFIT = ROOT / "build" / "bin" / "tightfit"

LORA = ['strategy.{i}.plugin=lora', 'strategy.{i}.targets=["q","o","up","down"]', "strategy.{i}.rank=16",
        "strategy.{i}.alpha=32.0"]
VARIANTS = {
    "plain": [],
    "checkpoint": ["strategy.0.plugin=checkpoint"],
    "autocast-bf16": ["strategy.0.plugin=precision"],
    "bf16-weights": ["strategy.0.plugin=precision", "strategy.0.mode=bf16"],
    "fused-update": ["strategy.0.plugin=fused_update"],
    "adamw-8bit": ["strategy.0.plugin=quantize", "strategy.0.weights=false", "strategy.0.optimizer_state=int8"],
    "lora": [s.format(i=0) for s in LORA],
    "qlora-nf4": [s.format(i=0) for s in LORA] + ["strategy.1.plugin=quantize", "strategy.1.format=nf4"],
    "qlora+checkpoint": [s.format(i=0) for s in LORA] + ["strategy.1.plugin=quantize", "strategy.2.plugin=checkpoint"],
    "lora+offload-disk": [s.format(i=0) for s in LORA] + ["strategy.1.plugin=offload", "strategy.1.prefetch=1"],
    "lora+offload+checkpoint": [s.format(i=0) for s in LORA] + ["strategy.1.plugin=offload",
                                                                "strategy.2.plugin=checkpoint"],
    "checkpoint+autocast+fused": ["strategy.0.plugin=checkpoint", "strategy.1.plugin=precision",
                                  "strategy.2.plugin=fused_update"],
    "checkpoint+offload-activ": ["strategy.0.plugin=checkpoint", "strategy.1.plugin=offload", "strategy.1.params=none",
                                 "strategy.1.activations=disk"],
    "offload-optimizer-disk": ["strategy.0.plugin=offload", "strategy.0.params=none", "strategy.0.optimizer=disk"],
    "checkpoint+fused+offload-opt": ["strategy.0.plugin=checkpoint", "strategy.1.plugin=fused_update",
                                     "strategy.2.plugin=offload", "strategy.2.params=none",
                                     "strategy.2.optimizer=disk"],
    "sparse-skip-3+5": ["strategy.0.plugin=sparse", "strategy.0.first=3", "strategy.0.last=5",
                        "strategy.0.middle=skip"],
    "sparse-frozen-3+5": ["strategy.0.plugin=sparse", "strategy.0.first=3", "strategy.0.last=5",
                          "strategy.0.middle=frozen"],
    "sparse-lisa-k2": ["strategy.0.plugin=sparse", "strategy.0.middle=lisa", "strategy.0.k=2",
                       "strategy.0.interval=2"],
    "bf16+adamw-8bit+fused": ["strategy.0.plugin=precision", "strategy.0.mode=bf16", "strategy.1.plugin=quantize",
                              "strategy.1.weights=false", "strategy.1.optimizer_state=int8",
                              "strategy.2.plugin=fused_update"],
}


def strategy_tables(sets: list) -> str:
    """[[strategy]] tables for the --set keys (they must exist before --set can fill them)."""
    n = 1 + max((int(s.split(".")[1]) for s in sets), default=-1)
    return "".join(f'\n[[strategy]]\nplugin = "checkpoint"\n' for _ in range(n))


MODELS = {
    "gpt2-124m": ("GPT-2 124M", '[model]\nplugin = "gpt2"\npreset = "124M"\n'),
    "llama-1b": ("LLaMA-1B (Llama-3.2-1B shape, 1.24 B)", '[model]\nplugin = "llama"\npreset = "1B"\n'),
}


def base_recipe(model: str) -> str:
    text = (ROOT / "configs" / "gpt2-124m.toml").read_text()
    return text.replace('[model]\nplugin = "gpt2"\npreset = "124M"\n', MODELS[model][1])


def run(name: str, sets: list, tmp: str, args) -> dict:
    recipe = base_recipe(args.model) + strategy_tables(sets)
    path = pathlib.Path(tmp) / f"{name}.toml"
    path.write_text(recipe)
    cmd = [str(TIGHTFIT), "run", str(path), "--quiet", "--set", f"run.steps={args.steps}",
           "--set", f"run.out_dir={tmp}", "--set", f"run.name={name}", "--set", "run.sample_tokens=0",
           "--set", "run.eval_batches=0", "--set", "save.final=false", "--set", "save.every=0",
           "--set", f"data.seq_len={args.seq_len}", "--set", f"data.batch_size={args.batch}"]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (pathlib.Path(tmp) / name / "metrics.jsonl").open()]
    times = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])]
    last = rows[-1]
    return {"peak_total": last["peak_total"], "median_step_s": statistics.median(times), "loss": last["loss"],
            **{k: v for k, v in last.items() if k.startswith("peak_")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="gpt2-124m")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--only")
    ap.add_argument("--json")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(VARIANTS)
    if "plain" not in names:
        names.insert(0, "plain")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    results = {}
    mib = 1 << 20
    print(f"{MODELS[args.model][0]}, seq {args.seq_len}, batch {args.batch}, {args.steps} steps each, fp32 CPU")
    header = f"{'recipe':28}{'peak MiB':>10}{'ratio':>7}{'weights':>9}{'grads':>8}{'optim':>8}{'activ':>8}" \
             f"{'adapt':>7}{'step s':>8}{'ratio':>7}{'loss':>8}"
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            r = run(name, VARIANTS[name], tmp, args)
            results[name] = r
            p = results["plain"]
            print(f"{name:28}{r['peak_total'] / mib:10.0f}{r['peak_total'] / p['peak_total']:7.2f}"
                  f"{r['peak_weights'] / mib:9.0f}{r['peak_grads'] / mib:8.0f}{r['peak_optimizer'] / mib:8.0f}"
                  f"{r['peak_activations'] / mib:8.0f}{r['peak_adapters'] / mib:7.0f}"
                  f"{r['median_step_s']:8.2f}{r['median_step_s'] / p['median_step_s']:7.2f}{r['loss']:8.4f}",
                  flush=True)
    return finish(args, results, all_met=True)


if __name__ == "__main__":
    sys.exit(main())
