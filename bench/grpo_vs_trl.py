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
job. Pass marks (--check, issue 66): tightfit's tokens a second >= 1.2x
TRL's, and its peak RSS <= 0.7x TRL's.

usage: bench/grpo_vs_trl.py [--steps N] [--check] [--json OUT]
"""
import argparse
import json
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from tightfit_runs import ROOT, finish, report_marks, run_args, step_times  # noqa: E402

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
    args = GRPOConfig(output_dir=out, report_to="none", bf16=False, use_cpu=True, per_device_train_batch_size=prompts * G,
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not GGUF.exists():
        sys.exit(f"{GGUF} is missing: run scripts/setup")
    with tempfile.TemporaryDirectory() as out:
        cmd = run_args(str(ROOT / "configs" / "grpo-smollm2.toml"), out, args.steps,
                       ["run.answer_prompts=", "save.adapter=false"])
        t0 = time.perf_counter()
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        ours_wall = time.perf_counter() - t0
        if p.returncode != 0:
            sys.exit(f"tightfit failed:\n{p.stderr[-3000:]}")
        # The only child waited for so far: its peak resident set (Linux: KiB).
        our_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        rows = [json.loads(line) for line in (pathlib.Path(out) / "m" / "metrics.jsonl").open()]
    our_times = step_times(rows)
    our_tps, our_cps = rates(our_times, [r["grpo.num_tokens"] for r in rows],
                             [r["grpo.completions/mean_length"] for r in rows])
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", PEER, str(GGUF), str(DATA), str(args.steps), str(PROMPTS), str(G),
                        str(MAX_COMPLETION)], capture_output=True, text=True)
    theirs_wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"the TRL side failed:\n{p.stderr[-3000:]}")
    theirs = json.loads(p.stdout.strip().splitlines()[-1])
    their_tps, their_cps = rates(theirs["times"][1:], theirs["num_tokens"], theirs["mean_length"])
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    speed, rss = our_tps / their_tps, our_rss / theirs["peak_rss"]
    results = {
        "date": time.strftime("%Y-%m-%d"), "steps": args.steps, "prompts_per_step": PROMPTS, "generations": G,
        "sides": {
            "tightfit grpo": {"step s": round(median(our_times), 3), "tokens/s": round(our_tps, 1),
                              "completion tokens/s": round(our_cps, 1), "peak RSS MiB": round(our_rss / 2**20),
                              "wall s": round(ours_wall, 1)},
            "TRL GRPOTrainer + PEFT": {"step s": round(median(theirs["times"][1:]), 3),
                                       "tokens/s": round(their_tps, 1), "completion tokens/s": round(their_cps, 1),
                                       "peak RSS MiB": round(theirs["peak_rss"] / 2**20),
                                       "wall s": round(theirs_wall, 1)}},
        "tokens/s ratio (tightfit / TRL)": round(speed, 3), "RSS ratio": round(rss, 3),
        "peer threads": theirs["threads"]}
    for name, side in results["sides"].items():
        print(f"{name:24s} step {side['step s']:.3f} s  {side['tokens/s']} tokens/s  "
              f"{side['completion tokens/s']} completion tokens/s  peak RSS {side['peak RSS MiB']} MiB  "
              f"({side['wall s']} s in all)")
    return finish(args, results, report_marks([
        ("tightfit tokens/s >= 1.2x TRL GRPOTrainer's", speed >= 1.2, f"{speed:.2f}x"),
        ("tightfit peak RSS <= 0.7x TRL GRPOTrainer's", rss <= 0.7, f"{rss:.2f}x")]))


if __name__ == "__main__":
    sys.exit(main())
