"""DPO with LoRA on the real model against TRL's DPOTrainer + PEFT, each in
its own process on this CPU: SmolLM2-135M-Instruct from its Q4_1 GGUF file
(tightfit reads it; transformers' from_pretrained(gguf_file=) dequantizes it),
LoRA rank 8, alpha 16 on all seven projections, fp32, AdamW at 1e-4, beta
0.1, sigmoid loss, 4 pairs a step of configs/data/persona-preference.jsonl
in the model's chat template, max_length 128. tightfit runs
configs/dpo-smollm2.toml as it is (the held-out answers off). Both take the
reference model as the base with the adapters off.

Reported: each side's median step time after the first and the process's
peak RSS over the whole job (load and steps). The steps differ in kind:
TRL runs the reference forward, then the policy's forward and backward
(whole logits); tightfit runs three forwards and one backward (the head's
log-softmax a chunk at a time). Pass mark (--check): tightfit's peak RSS
<= TRL's.

usage: bench/dpo_vs_trl.py [--steps N] [--check] [--json OUT]
"""
import argparse
import json
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from tightfit_runs import ROOT, finish, report_marks, run  # noqa: E402

GGUF = ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
PAIRS, MAX_LENGTH = 4, 128

PEER = r"""
import json, logging, resource, sys, tempfile, time
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
import peft
from trl import DPOConfig, DPOTrainer
logging.disable(logging.WARNING)
gguf, data, steps, pairs, max_length = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
folder, name = gguf.rsplit("/", 1)
tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
model = peft.get_peft_model(model, peft.LoraConfig(
    r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
rows = [json.loads(line) for line in open(data)]
times = []
class Timer(TrainerCallback):
    def on_step_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()
    def on_step_end(self, args, state, control, **kw):
        times.append(time.perf_counter() - self.t0)
with tempfile.TemporaryDirectory() as out:
    args = DPOConfig(output_dir=out, report_to="none", bf16=False, use_cpu=True, dataset_num_proc=None,
                     per_device_train_batch_size=pairs, max_length=max_length, beta=0.1, learning_rate=1e-4,
                     weight_decay=0.0, max_steps=steps, logging_steps=10**6, save_strategy="no",
                     disable_tqdm=True)
    trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                         callbacks=[Timer()])
    trainer.train()
print(json.dumps({"times": times, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "threads": torch.get_num_threads()}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not GGUF.exists():
        sys.exit(f"{GGUF} is missing: run scripts/setup")
    t0 = time.perf_counter()
    ours = run("dpo-smollm2.toml", ["run.answer_prompts=", "run.eval_interval=0"], steps=args.steps)
    ours_wall = time.perf_counter() - t0
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", PEER, str(GGUF),
                        str(ROOT / "configs" / "data" / "persona-preference.jsonl"), str(args.steps), str(PAIRS),
                        str(MAX_LENGTH)], capture_output=True, text=True)
    theirs_wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"the TRL side failed:\n{p.stderr[-3000:]}")
    theirs = json.loads(p.stdout.strip().splitlines()[-1])
    their_times = theirs["times"][1:] or theirs["times"]
    their_step = sorted(their_times)[len(their_times) // 2]
    rss = ours["peak_rss"] / theirs["peak_rss"]
    results = {
        "date": time.strftime("%Y-%m-%d"), "steps": args.steps, "pairs_per_step": PAIRS,
        "sides": {
            "tightfit dpo": {"step s": round(ours["step_s"], 3), "peak RSS MiB": round(ours["peak_rss"] / 2**20),
                             "wall s": round(ours_wall, 1)},
            "TRL DPOTrainer + PEFT": {"step s": round(their_step, 3),
                                      "peak RSS MiB": round(theirs["peak_rss"] / 2**20),
                                      "wall s": round(theirs_wall, 1)}},
        "step time ratio (tightfit / TRL)": round(ours["step_s"] / their_step, 3), "RSS ratio": round(rss, 3),
        "peer threads": theirs["threads"]}
    for name, side in results["sides"].items():
        print(f"{name:24s} step {side['step s']:.3f} s  peak RSS {side['peak RSS MiB']} MiB  "
              f"({side['wall s']} s in all)")
    print(f"step time: tightfit {ours['step_s'] / their_step:.2f}x TRL's (reported, no mark)")
    return finish(args, results, report_marks([("tightfit peak RSS <= TRL DPOTrainer's", rss <= 1.0,
                                                 f"{rss:.2f}x")]))


if __name__ == "__main__":
    sys.exit(main())
