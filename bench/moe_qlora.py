"""A Qwen3-30B-A3B-shape QLoRA step with its experts streamed from disk.

The model is Qwen3-30B-A3B's config.json (48 blocks of 128 experts, 8 a
token, hidden 2048, experts 768 wide; 30.5B parameters, 3.3B active), with
random weights: the shape is what memory depends on. The recipe is QLoRA
(NF4 double-quantized base, bf16 weights and compute, LoRA r16 on
q/k/v/o), every block checkpointed and its weights on disk (`offload`), the
frozen experts read only when a batch routes tokens to them (ABI 1.15's
TF_PARAM_EXPERT), under `memory_budget = "4GiB"`.

Two figures: `tightfit plan` of the full 48-block model (13.9 GiB of NF4
codes on disk, minutes a block-step on a CPU: planned, not run), and a run of
`--layers` blocks (2 by default) whose measured peak is compared with its
own plan. Pass marks: the plan within 5% of the measured peak (tracked,
less the data), the run's peak inside the 4 GiB budget, and the expert
weights a step reads (`offload.expert_loads`) no more than 10% past what
the plan expects (`routed_reads`: ABI 1.17's routed share, even routing),
so that fit's step time never counts on fewer reads than happen. The
random routers here read fewer than even routing would (measured
2026-12-02: 47% of the estimate): an upper estimate, printed as a ratio.

    bench/run moe [--layers 2] [--steps 3] [--check]
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

from tightfit_runs import QLORA_STRATEGIES, TIGHTFIT, finish, report_marks, step_times

# Qwen/Qwen3-30B-A3B's config.json (the keys that shape the model).
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
    "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "attention_bias": False,
    "use_sliding_window": False, "output_router_logits": False, "router_aux_loss_coef": 0.001,
    "torch_dtype": "bfloat16",
}

RECIPE = """[run]
name = "moe-{layers}"
seed = 1234
steps = {steps}
log_every = 1
sample_tokens = 0
eval_batches = 0
memory_budget = "{budget}"
out_dir = "{out}"
[model]
plugin = "llama"
config = "{folder}"
n_layer = {layers}
dtype = "bf16"
[data]
corpus = "builtin:fortunes"
tokenizer = "byte"  # random weights: the byte tokenizer, said
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
""" + QLORA_STRATEGIES + """
[[strategy]]
plugin = "checkpoint"
[[strategy]]
plugin = "offload"
params = "disk"
"""


def plan_json(recipe):
    p = subprocess.run([str(TIGHTFIT), "plan", recipe, "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"tightfit plan {recipe} failed:\n{p.stderr}")
    return json.loads(p.stdout)


def train(recipe, out, name):
    cmd = ["/usr/bin/time", "-v", str(TIGHTFIT), "run", recipe, "--quiet"]
    start = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - start
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-4000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1)) * 1024
    rows = [json.loads(line) for line in open(os.path.join(out, name, "metrics.jsonl"))]
    return rows, rss, wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--layers", type=int, default=2, help="blocks of the run (the plan is also full depth)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--budget", default="4GiB")
    ap.add_argument("--check", action="store_true", help="exit 1 when a pass mark is missed")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tightfit-moe-")
    results = {"model": "Qwen3-30B-A3B shape (qwen3_moe, 128 experts, 8 a token)", "budget": args.budget}
    try:
        folder = os.path.join(tmp, "qwen3-30b-a3b")
        os.makedirs(folder)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(QWEN3_30B_A3B, f)
        out = os.path.join(tmp, "runs")

        def write(layers):
            path = os.path.join(tmp, f"moe-{layers}.toml")
            with open(path, "w") as f:
                f.write(RECIPE.format(layers=layers, steps=args.steps, budget=args.budget, out=out,
                                      folder=folder))
            return path

        full = plan_json(write(48))
        results["full_depth_plan"] = {k: full[k] for k in ("n_params", "tracked_peak", "safe_budget",
                                                            "disk_bytes")}
        print(f"Qwen3-30B-A3B shape, 48 blocks: {full['n_params'] / 1e9:.1f}B parameters; planned peak "
              f"{full['tracked_peak'] / 2**30:.2f} GiB (safe budget {full['safe_budget'] / 2**30:.2f}), "
              f"{full['disk_bytes'] / 2**30:.1f} GiB on disk")
        recipe = write(args.layers)
        p = plan_json(recipe)
        print(f"{args.layers} blocks: {p['n_params'] / 1e9:.2f}B parameters; planned peak "
              f"{p['tracked_peak'] / 2**30:.2f} GiB, {p['disk_bytes'] / 2**30:.1f} GiB on disk; "
              f"training {args.steps} steps ...", flush=True)
        rows, rss, wall = train(recipe, out, f"moe-{args.layers}")
        last = rows[-1]
        measured = max(r["peak_total"] - r["at_peak"].get("other", 0) for r in rows)
        loads = [r.get("offload.expert_loads", 0) for r in rows]
        mib = [r.get("offload.expert_mib", 0) for r in rows]
        # Expert weights a pass could read: blocks x experts x (gate, up, down).
        per_pass = args.layers * QWEN3_30B_A3B["num_experts"] * 3
        # What the plan expects a step to read of them (ABI 1.17's routed_share; even routing).
        planned_reads = p.get("routed_reads", {}).get("reads_per_pass", 0)
        planned_mib = p.get("routed_reads", {}).get("bytes_per_pass", 0) / 2**20
        run = {"layers": args.layers, "losses": [r["loss"] for r in rows], "step_s": step_times(rows),
               "first_step_s": rows[0]["elapsed_s"], "wall_s": wall, "planned_peak": p["tracked_peak"],
               "measured_peak": measured, "peak_rss": rss, "expert_loads": loads, "expert_mib": mib,
               "expert_weights_per_pass": per_pass, "planned_expert_reads": planned_reads,
               "planned_expert_mib": planned_mib}
        results["run"] = run
        print(f"losses {', '.join(f'{x:.4f}' for x in run['losses'])}; s/step "
              f"{', '.join(f'{t:.1f}' for t in run['step_s'])} after a first step of "
              f"{run['first_step_s']:.1f} s (with setup); wall {wall:.0f} s")
        print(f"expert weights read per step {', '.join(f'{x:.0f}' for x in loads)} "
              f"({', '.join(f'{x:.0f}' for x in mib)} MiB) of {per_pass} per pass "
              f"(forward, recompute and backward each read what they use); planned "
              f"{planned_reads:.0f} ({planned_mib:.0f} MiB)")
        print(f"peak tracked (less the data) {measured / 2**30:.3f} GiB, planned {p['tracked_peak'] / 2**30:.3f} "
              f"GiB; peak RSS {rss / 2**30:.2f} GiB")
        error = p["tracked_peak"] / measured - 1
        budget = int(float(args.budget.removesuffix("GiB")) * 2**30)
        # The mean of the steps: a step reads what its batch routes to.
        read_error = (sum(loads) / len(loads)) / planned_reads - 1 if planned_reads > 0 else float("inf")
        all_met = report_marks([
            ("plan within 5% of the measured peak", abs(error) <= 0.05, f"{error * 100:+.1f}%"),
            ("expert reads at most the plan's (+10%)", read_error <= 0.10,
             f"{read_error * 100:+.1f}%"),
            (f"step inside {args.budget}", measured <= budget and last["peak_total"] <= budget,
             f"{last['peak_total'] / 2**30:.2f} GiB tracked"),
        ])
        results["plan_error"] = error
        results["expert_read_error"] = read_error
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return finish(args, results, all_met)


if __name__ == "__main__":
    sys.exit(main())
