"""GRPO with LoRA on the real model against TRL's GRPOTrainer + PEFT, each in
its own process on this CPU: SmolLM2-135M-Instruct from its Q4_1 GGUF file
(tightfit reads it; transformers' from_pretrained(gguf_file=) dequantizes
it), LoRA rank 8, alpha 16 on all seven projections, fp32, AdamW at 5e-4,
TRL's defaults (loss_type dapo, beta 0, one iteration), 2 prompts a step of
configs/data/arithmetic-prompts.jsonl (the model's chat template), 8
completions each of at most 24 tokens, sampled at temperature 1, rewards
exact_answer + 0.25 x format (a number alone; TRL's side: the same rules in
Python). tightfit runs configs/grpo-smollm2.toml (the held-out answers
off).

The two sides sample different completions (two libraries' generators), so
a step's work differs: reported are each side's median step time after the
first, its tokens a second (prompt + completion tokens the step processed,
TRL's num_tokens, over the step's time; both generate and train in a step),
its completion tokens a second, and the process's peak RSS over the whole
job. Two pairs, each measured in the same run: "plain" (fp32, everything
kept for backward: the recipe as shipped, TRL's defaults) and "lean" (each
side's own memory savers at their like: tightfit's checkpoint and
precision (bf16 autocast) strategies, TRL's gradient_checkpointing and
bf16). Pass marks (--check, issue 66), on each pair: tightfit's tokens a
second >= 1.2x TRL's, and its peak RSS <= 0.7x TRL's.

usage: bench/grpo_vs_trl.py [--steps N] [--pairs plain,lean] [--check] [--json OUT]
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from tightfit_runs import ROOT, finish, report_marks, run_args, run_with_peak_rss, step_times  # noqa: E402

GGUF = ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DATA = ROOT / "configs" / "data" / "arithmetic-prompts.jsonl"
PROMPTS, G, MAX_COMPLETION = 2, 8, 24

PEER = r"""
import json, logging, re, resource, sys, tempfile, time
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
import peft
from trl import GRPOConfig, GRPOTrainer
logging.disable(logging.WARNING)
gguf, data, steps, prompts, G, max_completion = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
lean = sys.argv[7] == "lean"
folder, name = gguf.rsplit("/", 1)
tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
model = peft.get_peft_model(model, peft.LoraConfig(
    r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
rows = [json.loads(line) for line in open(data)]
def text(c):
    return c if isinstance(c, str) else c[0]["content"]
def exact_answer(completions, answer, **kw):
    out = []
    for c, want in zip(completions, answer):
        found = re.findall(r"-?\d[\d,]*(?:\.\d+)?", text(c))
        got = found[-1].replace(",", "") if found else text(c).strip()
        try:
            out.append(1.0 if abs(float(got) - float(want)) < 1e-6 else 0.0)
        except ValueError:
            out.append(0.0)
    return out
def format(completions, **kw):
    return [1.0 if re.fullmatch(r"\s*-?[0-9]+\s*", text(c)) else 0.0 for c in completions]
times = []
class Timer(TrainerCallback):
    def on_step_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()
    def on_step_end(self, args, state, control, **kw):
        times.append(time.perf_counter() - self.t0)
with tempfile.TemporaryDirectory() as out:
    args = GRPOConfig(output_dir=out, report_to="none", bf16=lean, gradient_checkpointing=lean,
                      use_cpu=True, per_device_train_batch_size=prompts * G,
                      num_generations=G, max_completion_length=max_completion, learning_rate=5e-4, weight_decay=0.0,
                      max_steps=steps, logging_steps=1, save_strategy="no", disable_tqdm=True,
                      reward_weights=[1.0, 0.25], lr_scheduler_type="constant")
    trainer = GRPOTrainer(model=model, reward_funcs=[exact_answer, format], args=args,
                          train_dataset=Dataset.from_list(rows), processing_class=tok, callbacks=[Timer()])
    trainer.train()
    logs = [h for h in trainer.state.log_history if "num_tokens" in h]
print(json.dumps({"times": times, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "num_tokens": [h["num_tokens"] for h in logs],
                  "mean_length": [h["completions/mean_length"] for h in logs],
                  "reward": [h["reward"] for h in logs], "threads": torch.get_num_threads()}))
"""


def rates(times, num_tokens, mean_length):
    """Tokens a second and completion tokens a second over the steps after the first."""
    step_tokens = [b - a for a, b in zip(num_tokens, num_tokens[1:])]
    completion = [m * PROMPTS * G for m in mean_length[1:]]
    t = sum(times[-len(step_tokens):])
    return sum(step_tokens) / t, sum(completion) / t


# What each pair adds to each side.
OUR_STACKS = {"plain": [], "lean": ["--add-strategy", "checkpoint", "--add-strategy", "precision"]}


def measure(pair: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = run_args(str(ROOT / "configs" / "grpo-smollm2.toml"), out, steps,
                       ["run.answer_prompts=", "save.adapter=false"]) + OUR_STACKS[pair]
        try:  # its own process: the peak resident set of that child alone
            our_rss, ours_wall = run_with_peak_rss(cmd)
        except RuntimeError as e:
            sys.exit(f"tightfit ({pair}) failed:\n{e}")
        rows = [json.loads(line) for line in (pathlib.Path(out) / "m" / "metrics.jsonl").open()]
    our_times = step_times(rows)
    our_tps, our_cps = rates(our_times, [r["grpo.num_tokens"] for r in rows],
                             [r["grpo.completions/mean_length"] for r in rows])
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", PEER, str(GGUF), str(DATA), str(steps), str(PROMPTS), str(G),
                        str(MAX_COMPLETION), pair], capture_output=True, text=True)
    theirs_wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"the TRL side ({pair}) failed:\n{p.stderr[-3000:]}")
    theirs = json.loads(p.stdout.strip().splitlines()[-1])
    their_tps, their_cps = rates(theirs["times"][1:], theirs["num_tokens"], theirs["mean_length"])
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {
        "sides": {
            f"tightfit grpo ({pair})": {"step s": round(median(our_times), 3), "tokens/s": round(our_tps, 1),
                                        "completion tokens/s": round(our_cps, 1),
                                        "peak RSS MiB": round(our_rss / 2**20), "wall s": round(ours_wall, 1),
                                        "reward": [round(r["grpo.reward"], 3) for r in rows]},
            f"TRL GRPOTrainer + PEFT ({pair})": {
                "step s": round(median(theirs["times"][1:]), 3), "tokens/s": round(their_tps, 1),
                "completion tokens/s": round(their_cps, 1), "peak RSS MiB": round(theirs["peak_rss"] / 2**20),
                "wall s": round(theirs_wall, 1), "reward": [round(r, 3) for r in theirs["reward"]]}},
        "tokens/s ratio (tightfit / TRL)": round(our_tps / their_tps, 3),
        "RSS ratio": round(our_rss / theirs["peak_rss"], 3), "peer threads": theirs["threads"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--pairs", default="plain,lean")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not GGUF.exists():
        sys.exit(f"{GGUF} is missing: run scripts/setup")
    pairs = args.pairs.split(",")
    for pair in pairs:
        if pair not in OUR_STACKS:
            sys.exit(f"--pairs: {pair} is not one of {', '.join(OUR_STACKS)}")
    results = {"date": time.strftime("%Y-%m-%d"), "steps": args.steps, "prompts_per_step": PROMPTS,
               "generations": G, "pairs": {}}
    marks = []
    for pair in pairs:
        r = measure(pair, args.steps)
        results["pairs"][pair] = r
        for name, side in r["sides"].items():
            print(f"{name:32s} step {side['step s']:.3f} s  {side['tokens/s']} tokens/s  "
                  f"{side['completion tokens/s']} completion tokens/s  peak RSS {side['peak RSS MiB']} MiB  "
                  f"({side['wall s']} s in all)")
        speed, rss = r["tokens/s ratio (tightfit / TRL)"], r["RSS ratio"]
        marks += [(f"{pair}: tightfit tokens/s >= 1.2x TRL GRPOTrainer's", speed >= 1.2, f"{speed:.2f}x"),
                  (f"{pair}: tightfit peak RSS <= 0.7x TRL GRPOTrainer's", rss <= 0.7, f"{rss:.2f}x")]
    return finish(args, results, report_marks(marks))


if __name__ == "__main__":
    sys.exit(main())
