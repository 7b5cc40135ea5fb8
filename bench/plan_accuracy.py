#!/usr/bin/env python3
"""`tightfit plan` against measured runs: for each recipe, the planned peak
(from the recipe alone, `tightfit plan --json`) and the peak a 3-step run
measures (tracked memory less the data, from metrics.jsonl), with the error.
Small recipes over the three models and the strategies, then GPT-2 124M.

usage: bench/plan_accuracy.py [--json OUT] [--only NAME ...] [--quick]
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIGHTFIT = os.path.join(ROOT, "build", "bin", "tightfit")

GPT2 = 'plugin = "gpt2"\npreset = "custom"\nn_layer = 6\nn_embd = 384\nn_head = 6\nn_positions = 256'
GPT2_124M = 'plugin = "gpt2"\npreset = "124M"'
LLAMA = ('plugin = "llama"\npreset = "custom"\nn_layer = 4\nn_embd = 256\nn_head = 4\n'
         'n_kv_head = 2\nintermediate_size = 688\nmax_positions = 256')
RWKV = 'plugin = "rwkv"\npreset = "custom"\nn_layer = 4\nn_embd = 256'
LLAMA_BIG_VOCAB = ('plugin = "llama"\npreset = "custom"\nn_layer = 2\nn_embd = 256\nn_head = 4\n'
                   'n_kv_head = 2\nintermediate_size = 688\nmax_positions = 128\n'
                   'vocab_size = 32000\ntie_embeddings = true')
STD = 'plugin = "standard"\nwarmup_steps = 1'


def strategy(name, keys=""):
    if keys and not keys.endswith("\n"):
        keys += "\n"
    return f'[[strategy]]\nplugin = "{name}"\n{keys}'


# name, model, schedule, strategies, batch, seq
CASES = [
    ("gpt2", GPT2, STD, "", 8, 128),
    ("llama", LLAMA, STD, "", 8, 128),
    ("rwkv", RWKV, STD, "", 8, 128),
    ("gpt2 checkpoint", GPT2, STD, strategy("checkpoint"), 8, 128),
    ("llama checkpoint", LLAMA, STD, strategy("checkpoint"), 8, 128),
    ("llama vocab 32k tied", LLAMA_BIG_VOCAB, STD, "", 8, 128),
    ("llama vocab 32k lora autocast", LLAMA_BIG_VOCAB, STD,
     strategy("lora") + strategy("precision"), 8, 128),
    ("rwkv checkpoint", RWKV, STD, strategy("checkpoint"), 8, 128),
    ("gpt2 lora", GPT2, STD, strategy("lora", 'targets = ["c_attn"]'), 8, 128),
    ("rwkv lora", RWKV, STD, strategy("lora", 'targets = ["key", "value", "receptance"]'), 8, 128),
    ("gpt2 lora checkpoint", GPT2, STD,
     strategy("lora", 'targets = ["c_attn"]') + strategy("checkpoint"), 8, 128),
    ("rwkv lora checkpoint", RWKV, STD,
     strategy("lora", 'targets = ["key", "value", "receptance"]') + strategy("checkpoint"), 8, 128),
    ("llama qlora", LLAMA, STD, strategy("quantize") + strategy("lora"), 8, 128),
    ("llama qlora checkpoint", LLAMA, STD,
     strategy("quantize") + strategy("lora") + strategy("checkpoint"), 8, 128),
    ("llama lora ckpt act@disk", LLAMA, STD,
     strategy("lora") + strategy("checkpoint") +
     strategy("offload", 'params = "none"\nactivations = "disk"'), 8, 128),
    ("llama lora offload disk", LLAMA, STD,
     strategy("lora") + strategy("offload", 'params = "disk"\nprefetch = 2'), 8, 128),
    ("llama qlora offload disk", LLAMA, STD,
     strategy("quantize") + strategy("lora") + strategy("offload", 'params = "disk"'), 8, 128),
    ("llama qlora bf16", LLAMA, STD,
     strategy("quantize") + strategy("lora") + strategy("precision", 'mode = "bf16"'), 8, 128),
    ("gpt2 offload optimizer", GPT2, STD,
     strategy("offload", 'params = "none"\noptimizer = "host"'), 8, 128),
    ("gpt2 fused_update", GPT2, STD, strategy("fused_update"), 8, 128),
    ("gpt2 autocast", GPT2, STD, strategy("precision"), 8, 128),
    ("llama autocast", LLAMA, STD, strategy("precision"), 8, 128),
    ("rwkv autocast", RWKV, STD, strategy("precision"), 8, 128),
    ("gpt2 bf16", GPT2, STD, strategy("precision", 'mode = "bf16"'), 8, 128),
    ("llama bf16", LLAMA, STD, strategy("precision", 'mode = "bf16"'), 8, 128),
    ("rwkv bf16", RWKV, STD, strategy("precision", 'mode = "bf16"'), 8, 128),
    ("llama sparse skip", LLAMA, STD, strategy("sparse", 'first = 1\nlast = 1\nmiddle = "skip"'), 8, 128),
    ("llama lisa", LLAMA, STD, strategy("sparse", 'first = 1\nlast = 1\nmiddle = "lisa"\nk = 1'), 8, 128),
    ("gpt2 accumulate", GPT2, 'plugin = "accumulate"\nmicro_batches = 2\nwarmup_steps = 1', "", 8, 128),
    ("gpt2 mezo", GPT2, 'plugin = "mezo"\nwarmup_steps = 1', "", 8, 128),
    ("gpt2 hybrid", GPT2, 'plugin = "hybrid"\nwarmup_full_steps = 0\nfull_steps = 1', "", 8, 128),
    ("gpt2-124M", GPT2_124M, STD, "", 4, 128),
    ("gpt2-124M checkpoint", GPT2_124M, STD, strategy("checkpoint"), 4, 128),
    ("gpt2-124M lora", GPT2_124M, STD, strategy("lora", 'targets = ["c_attn"]'), 4, 128),
    # The notes' QLoRA stack on the LLaMA-3.2-1B shape (128,256-word tied
    # vocabulary), at a batch this CPU runs in seconds.
    ("llama-1B qlora autocast ckpt", 'plugin = "llama"\npreset = "1B"', STD,
     strategy("lora", 'targets = ["q", "k", "v", "o", "gate", "up", "down"]\nrank = 32') +
     strategy("quantize") + strategy("precision") + strategy("checkpoint"), 2, 256),
]
QUICK = {"gpt2", "llama", "rwkv", "gpt2 checkpoint", "llama qlora"}

RECIPE = """[run]
name = "plan"
seed = 1
steps = 3
log_every = 1000
sample_tokens = 0
eval_batches = 1
out_dir = "{out}"
[model]
{model}
[data]
corpus = "builtin:fortunes"
tokenizer = "byte"
seq_len = {seq}
batch_size = {batch}
[optimizer]
name = "adamw"
lr = 1e-3
[schedule]
{schedule}
{strategies}
"""


def measure(name, model, schedule, strategies, batch, seq, work):
    path = os.path.join(work, name.replace(" ", "_") + ".toml")
    out = os.path.join(work, "runs", name.replace(" ", "_"))
    with open(path, "w") as f:
        f.write(RECIPE.format(out=out, model=model, schedule=schedule, strategies=strategies,
                              batch=batch, seq=seq))
    plan = subprocess.run([TIGHTFIT, "plan", path, "--json"], capture_output=True, text=True)
    if plan.returncode != 0:
        raise RuntimeError(f"{name}: tightfit plan failed: {plan.stderr}")
    planned = json.loads(plan.stdout)
    run = subprocess.run([TIGHTFIT, "run", path, "-q"], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{name}: tightfit run failed: {run.stderr[-2000:]}")
    metrics = glob.glob(os.path.join(out, "**", "metrics.jsonl"), recursive=True)[0]
    last = [json.loads(line) for line in open(metrics)][-1]
    measured = last["peak_total"] - last.get("peak_other", 0)
    shutil.rmtree(out, ignore_errors=True)
    return {
        "recipe": name,
        "planned_bytes": planned["tracked_peak"],
        "measured_bytes": measured,
        "error": (planned["tracked_peak"] - measured) / measured,
        "moment": planned["peak_moment"],
    }


def accelerate_reference(rows):
    """What `accelerate estimate-memory` prints for the same models, by its
    own functions (the command itself only takes Hub names; nothing may be
    downloaded here): the model's size and "Training using Adam" — weights,
    gradients and optimizer state, no activations, no batch."""
    import transformers
    from accelerate import init_empty_weights
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes

    configs = {
        "gpt2-124M": transformers.GPT2Config(),
        "llama-1B qlora autocast ckpt": transformers.LlamaConfig(
            vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
            num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
    }
    measured = {r["recipe"]: r for r in rows}
    out = []
    print("\naccelerate estimate-memory on the same configurations (its functions):")
    print(f"{'recipe':30s} {'fp32 size':>10s} {'int4 size':>10s} {'Adam fp32':>10s} "
          f"{'tightfit plan':>14s} {'measured':>9s}  MiB")
    for name, cfg in configs.items():
        with init_empty_weights():
            model = transformers.AutoModelForCausalLM.from_config(cfg)
        total, _ = calculate_maximum_sizes(model)
        adam = max(estimate_training_usage(total, "float32").values())
        r = measured.get(name)
        row = {"recipe": name, "accelerate_fp32_bytes": total, "accelerate_int4_bytes": total / 8,
               "accelerate_training_adam_fp32_bytes": adam}
        if r:
            row.update(planned_bytes=r["planned_bytes"], measured_bytes=r["measured_bytes"])
        out.append(row)
        plan = f"{r['planned_bytes'] / 2**20:14.1f} {r['measured_bytes'] / 2**20:9.1f}" if r else ""
        print(f"{name:30s} {total / 2**20:10.1f} {total / 8 / 2**20:10.1f} {adam / 2**20:10.1f} "
              f"{plan}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--only", nargs="*", help="recipe names to run")
    ap.add_argument("--quick", action="store_true", help="five small recipes")
    args = ap.parse_args()
    cases = [c for c in CASES if (not args.only or c[0] in args.only)
             and (not args.quick or c[0] in QUICK)]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        print(f"{'recipe':28s} {'planned MiB':>12s} {'measured MiB':>13s} {'error':>8s}  peak in")
        for case in cases:
            r = measure(*case, work)
            rows.append(r)
            print(f"{r['recipe']:28s} {r['planned_bytes'] / 2**20:12.1f} "
                  f"{r['measured_bytes'] / 2**20:13.1f} {100 * r['error']:+7.1f}%  {r['moment']}",
                  flush=True)
    errors = sorted(abs(r["error"]) for r in rows)
    within = sum(e <= 0.10 for e in errors)
    median = errors[len(errors) // 2] if errors else 0
    print(f"\n{within} of {len(rows)} within ±10%; median |error| {100 * median:.1f}%, "
          f"largest {100 * (errors[-1] if errors else 0):.1f}%")
    reference = accelerate_reference(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"recipes": rows, "within_10pct": within, "count": len(rows),
                       "median_abs_error": median, "accelerate_reference": reference}, f,
                      indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
