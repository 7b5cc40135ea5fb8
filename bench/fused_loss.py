#!/usr/bin/env python3
"""The fused head + loss against the whole logits, side by side in one run.

Trains a one-layer LLaMA with Qwen2's 151,936-word vocabulary on 4,096
tokens a step (batch 4 x 1024) twice, [run] fused_loss = true and false,
steps interleaved run by run, and prints from their metrics.jsonl:
  head + loss peak: the step's tracked peak less the model's own state
    (weights, gradients, optimizer state, other) — what the logits, their
    gradient and the block's activations hold;
  step time: each run's median step (the first step dropped); the ratio is
    the median over rounds of fused / whole within a round, so that a
    machine busy for a while weighs on both sides of a ratio.
The block is small (width 64) so that the head and the loss are nearly all
of the step, as they are in the field notes' seed-003 recipe.

Pass marks (issue 23): head + loss peak ratio fused / whole <= 0.05, and
step-time ratio <= 1.05. --check exits non-zero when one is missed.
Bounded: 2 x rounds x (steps + 1) steps (3 x 2 x 5 = 30 by default) of
about 1-10 s each on a 2-core x86-64 (fp32 only: no 16-bit arithmetic).

usage: bench/fused_loss.py [--steps N] [--rounds R] [--width C] [--check] [--json OUT]
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
VOCAB = 151936
MODEL_STATE = ("weights", "grads", "optimizer", "other", "adapters")


def recipe(width: int, steps: int, fused: bool) -> str:
    return f"""[run]
name = "fused-{str(fused).lower()}"
steps = {steps}
sample_tokens = 0
eval_batches = 0
log_every = 1000
fused_loss = {str(fused).lower()}

[model]
plugin = "llama"
preset = "custom"
n_layer = 1
n_embd = {width}
n_head = 4
intermediate_size = {2 * width}
max_positions = 1024
tie_embeddings = false
vocab_size = {VOCAB}

[data]
corpus = "builtin:fortunes"
tokenizer = "byte"
seq_len = 1024
batch_size = 4

[optimizer]
lr = 1e-3

[schedule]
plugin = "standard"
warmup_steps = 1

[save]
final = false
"""


def run(tmp: pathlib.Path, width: int, steps: int, fused: bool, chunk: int) -> dict:
    out = pathlib.Path(tempfile.mkdtemp(dir=tmp))  # a fresh run folder each time
    path = out / "recipe.toml"
    path.write_text(recipe(width, steps, fused))
    subprocess.run([str(TIGHTFIT), "run", str(path), "--quiet", "--set", f"run.out_dir={out}",
                    "--set", f"run.loss_chunk_tokens={chunk}"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (out / f"fused-{str(fused).lower()}" / "metrics.jsonl").open()]
    times = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])]
    last = rows[-1]
    head_loss = last["peak_total"] - sum(last[f"peak_{c}"] for c in MODEL_STATE)
    return {"fused": fused, "steps": len(rows), "peak_total": last["peak_total"],
            "head_loss_peak": head_loss, "times": times, "final_loss": last["loss"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="whole/fused pairs, interleaved")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=0, help="loss_chunk_tokens (0: tightfit's default)")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    results = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        # Interleaved: a machine busy for a while weighs on both.
        for fused in (False, True) * args.rounds:
            r = run(pathlib.Path(tmp), args.width, args.steps + 1, fused, args.chunk)
            results[fused].append(r)
            print(f"  {'fused' if fused else 'whole'}: head + loss {r['head_loss_peak'] / 2**20:.1f} MiB, "
                  f"steps {', '.join(f'{t:.2f}' for t in r['times'])} s", flush=True)
    def summary(rs):
        return {"head_loss_peak": max(r["head_loss_peak"] for r in rs),
                "peak_total": max(r["peak_total"] for r in rs),
                "median_step_s": statistics.median(t for r in rs for t in r["times"]),
                "final_loss": rs[-1]["final_loss"]}
    whole, fused = summary(results[False]), summary(results[True])
    mem_ratio = fused["head_loss_peak"] / whole["head_loss_peak"]
    round_ratios = [statistics.median(f["times"]) / statistics.median(w["times"])
                    for w, f in zip(results[False], results[True])]
    time_ratio = statistics.median(round_ratios)
    mib = 1 << 20
    print(f"LLaMA 1 layer x {args.width}, vocabulary {VOCAB}, 4,096 tokens a step, CPU")
    print(f"{'':28}{'whole':>12}{'fused':>12}{'ratio':>8}")
    print(f"{'head + loss peak (MiB)':28}{whole['head_loss_peak'] / mib:12.1f}{fused['head_loss_peak'] / mib:12.1f}{mem_ratio:8.3f}")
    print(f"{'peak total (MiB)':28}{whole['peak_total'] / mib:12.1f}{fused['peak_total'] / mib:12.1f}"
          f"{fused['peak_total'] / whole['peak_total']:8.3f}")
    print(f"{'median step time (s)':28}{whole['median_step_s']:12.3f}{fused['median_step_s']:12.3f}{time_ratio:8.3f}"
          f"  (rounds: {', '.join(f'{r:.3f}' for r in round_ratios)})")
    print(f"{'loss after last step':28}{whole['final_loss']:12.4f}{fused['final_loss']:12.4f}")
    marks = {"head + loss peak ratio <= 0.05": mem_ratio <= 0.05, "step time ratio <= 1.05": time_ratio <= 1.05}
    for mark, ok in marks.items():
        print(f"{'PASS' if ok else 'MISS'}  {mark}")
    if args.json:
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.json).write_text(json.dumps(
            {"whole": whole, "fused": fused, "memory_ratio": mem_ratio, "time_ratio": time_ratio,
             "round_time_ratios": round_ratios}, indent=2))
    return 1 if args.check and not all(marks.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
