"""The main job's LoRA step on the real model against transformers + PEFT,
each in its own process on this CPU: SmolLM2-135M-Instruct loaded from its
Q4_1 GGUF file (tightfit reads it; transformers' from_pretrained(gguf_file=)
dequantizes it), LoRA rank 8, alpha 16 on all seven projections, fp32,
AdamW at 2e-3, 4 rows of 256 tokens a step from the persona conversations
(configs/data/persona-train.jsonl in the model's chat template, packed).
tightfit runs configs/default.toml as it is (the loss on the answers only;
the compute is the same as the peer's loss on every token).

--qlora: QLoRA as each side does it from that file. tightfit keeps the
file's own Q4_1 blocks as the frozen base (configs/ab/smollm2-qlora-gguf.toml:
quantize format = "gguf"); the peer casts the dequantized base to bf16 (the
usual PEFT recipe when bitsandbytes has no CPU kernels; the adapters stay
fp32, as PEFT's autocast_adapter_dtype keeps them).

Reported: tokens/s of the median step after the first, and the process's
peak RSS over the whole job (load and steps), each side measured by itself.
Pass marks (--check exits 1 when one is missed): LoRA: tightfit >= 1.2x the
peer's tokens/s, and <= 0.7x its peak RSS; --qlora: <= 0.7x its peak RSS
(speed is reported: on a CPU with bf16 matrix units the peer's bf16 matmuls
are fast, and tightfit decodes Q4_1 to fp32 for every projection).

usage: bench/real_lora_vs_peft.py [--qlora] [--steps N] [--check] [--json OUT]
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
ROWS, SEQ = 4, 256

PEER = r"""
import json, resource, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
import peft
gguf, data, steps, rows, seq = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
bf16 = sys.argv[6] == "qlora"
folder, name = gguf.rsplit("/", 1)
tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
if bf16:
    model = model.to(torch.bfloat16)
model = peft.get_peft_model(model, peft.LoraConfig(
    r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
ids = []
for line in open(data):
    ids += tok.apply_chat_template(json.loads(line)["messages"], tokenize=True)
need = rows * seq
ids = torch.tensor((ids * (need * (steps + 1) // len(ids) + 2))[: need * (steps + 1)]).view(steps + 1, rows, seq)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3, weight_decay=0.0)
model.train()
times = []
for s in range(steps):
    t0 = time.perf_counter()
    batch = ids[s]
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0)
print(json.dumps({"times": times, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "threads": torch.get_num_threads(), "loss": float(loss)}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--qlora", action="store_true", help="tightfit on the file's Q4_1 blocks, the peer on bf16")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not GGUF.exists():
        sys.exit(f"{GGUF} is missing: run scripts/setup")
    tokens = ROWS * SEQ
    t0 = time.perf_counter()
    ours = (run("ab/smollm2-qlora-gguf.toml", [], steps=args.steps) if args.qlora
            else run("default.toml", ["run.answer_prompts="], steps=args.steps))
    ours_wall = time.perf_counter() - t0
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", PEER, str(GGUF), str(ROOT / "configs" / "data" / "persona-train.jsonl"),
                        str(args.steps), str(ROWS), str(SEQ), "qlora" if args.qlora else "lora"],
                       capture_output=True, text=True)
    theirs_wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"the transformers + PEFT side failed:\n{p.stderr[-3000:]}")
    theirs = json.loads(p.stdout.strip().splitlines()[-1])
    their_times = theirs["times"][1:]
    their_step = sorted(their_times)[len(their_times) // 2]
    speed = (tokens / ours["step_s"]) / (tokens / their_step)
    rss = ours["peak_rss"] / theirs["peak_rss"]
    results = {
        "date": time.strftime("%Y-%m-%d"), "steps": args.steps, "tokens_per_step": tokens,
        "mode": "QLoRA: tightfit on the Q4_1 blocks, the peer on bf16" if args.qlora else "LoRA, fp32 base",
        "sides": {
            "tightfit": {"tokens/s": round(tokens / ours["step_s"], 1), "step s": round(ours["step_s"], 3),
                         "peak RSS MiB": round(ours["peak_rss"] / 2**20), "wall s": round(ours_wall, 1)},
            ("transformers + PEFT" + (" (bf16)" if args.qlora else "")): {"tokens/s": round(tokens / their_step, 1), "step s": round(their_step, 3),
                                    "peak RSS MiB": round(theirs["peak_rss"] / 2**20),
                                    "wall s": round(theirs_wall, 1)}},
        "speed ratio": round(speed, 3), "RSS ratio": round(rss, 3), "peer threads": theirs["threads"]}
    for name, side in results["sides"].items():
        print(f"{name:22s} {side['tokens/s']:8.1f} tok/s  step {side['step s']:.3f} s  "
              f"peak RSS {side['peak RSS MiB']} MiB  ({side['wall s']} s in all)")
    marks = [("tightfit peak RSS <= 0.7x transformers + PEFT", rss <= 0.7, f"{rss:.2f}x")]
    if args.qlora:
        print(f"speed: tightfit {speed:.2f}x the peer's tokens/s (reported, no mark)")
    else:
        marks.insert(0, ("tightfit tokens/s >= 1.2x transformers + PEFT", speed >= 1.2, f"{speed:.2f}x"))
    return finish(args, results, report_marks(marks))


if __name__ == "__main__":
    sys.exit(main())
