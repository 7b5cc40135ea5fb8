#!/usr/bin/env python3
"""ATen operators dispatched per training step, tightfit against its peers,
counted on this CPU the same way on both sides: LibTorch's RecordFunction
callbacks (tightfit: [run] profile_ops, metrics.jsonl's `ops`, `ops_all` and
`host_reads`; the peers: torch.autograd.profiler over one step). On a GPU
every dispatched operator is at least one kernel launch and some host work,
so the count is what a step costs the host before the device is busy.

  ops       the operators the step called itself (an operator run inside
            another, as _foreach_mul_ runs mul_ on a CPU, is not counted)
  ops_all   every operator, those run inside others included
  reads     Tensor::item() calls and tightfit's counted reads of device
            values (host_reads.hpp): each waits for the device on a GPU

Cases (each side's step after a first, warming one):
  GPT-2 124M            batch 1 x 64 tokens, AdamW, clipping at 1.0, against
                        the nanoGPT-style model (bench/peers/eager_models.py)
                        with torch.optim.AdamW(foreach=True) and
                        clip_grad_norm_
  LLaMA-1B width        Llama-3.2-1B's width, tied 128,256-word vocabulary,
                        4 of its 16 layers (the op count grows by layer; the
                        whole depth's AdamW state would not fit two runs in
                        this machine's memory), the same peer set-up
  SmolLM2 LoRA          the main job's step (configs/default.toml: LoRA r8 on
                        the seven projections of SmolLM2-135M-Instruct from
                        its GGUF) against transformers + PEFT on the same
                        file, AdamW(foreach=True)

Pass mark (--check exits 1 when missed): tightfit's `ops` at most the
peer's in every case.

usage: bench/dispatch.py [--only NAME] [--check] [--json OUT]
"""
import argparse
import json
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from tightfit_runs import ROOT, finish, report_marks, run  # noqa: E402

GGUF = ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

# The peer's side, in its own process: builds the model, takes a warming
# step, then counts one step's operators with torch.autograd.profiler.
PEER = r"""
import json, sys
import torch
spec = json.loads(sys.argv[1])
sys.path.insert(0, spec["bench"])
torch.manual_seed(0)
if spec["peer"] == "eager":
    from peers.eager_models import Gpt2, Llama
    s = spec["shape"]
    if spec["family"] == "gpt2":
        model = Gpt2(s["vocab"], s["n_positions"], s["d"], s["n_layer"], s["n_head"])
    else:
        model = Llama(s["vocab"], s["d"], s["n_layer"], s["n_head"], s["n_kv"], s["ffn"], tie=True)
    vocab = s["vocab"]
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            foreach=True)
    def loss_of(x, y):
        return model(x, y)
else:
    from transformers import AutoModelForCausalLM
    import peft
    folder, name = spec["gguf"].rsplit("/", 1)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model = peft.get_peft_model(model, peft.LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    vocab = model.config.vocab_size
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3,
                            weight_decay=0.0, foreach=True)
    def loss_of(x, y):
        return model(input_ids=x, labels=y).loss
model.train()
params = [p for p in model.parameters() if p.requires_grad]
g = torch.Generator().manual_seed(1)
def step():
    x = torch.randint(0, vocab, (spec["batch"], spec["seq"]), generator=g)
    loss = loss_of(x, x)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return loss.item()  # the loss a training loop logs
step()
with torch.autograd.profiler.profile() as prof:
    step()
aten = [e for e in prof.function_events if e.name.startswith("aten::")]
def nested(e):
    p = e.cpu_parent
    while p is not None:
        if p.name.startswith("aten::"):
            return True
        p = p.cpu_parent
    return False
print(json.dumps({"ops": sum(1 for e in aten if not nested(e)), "ops_all": len(aten),
                  "reads": sum(1 for e in aten if e.name == "aten::_local_scalar_dense"),
                  "threads": torch.get_num_threads()}))
"""

GPT2_124M = {"family": "gpt2", "shape": {"vocab": 256, "n_positions": 1024, "d": 768, "n_layer": 12,
                                         "n_head": 12}}
LLAMA_1B_WIDTH = {"family": "llama", "shape": {"vocab": 128256, "d": 2048, "n_layer": 4, "n_head": 32,
                                               "n_kv": 8, "ffn": 8192}}
OPTIMIZER_SETS = ["optimizer.name=adamw", "optimizer.lr=6e-4", "optimizer.weight_decay=0.1",
                  "optimizer.beta1=0.9", "optimizer.beta2=0.95", "optimizer.grad_clip=1.0"]
DATA_SETS = ["data.corpus=builtin:fortunes", "data.tokenizer=byte", "data.seq_len=64", "data.batch_size=1"]

CASES = [
    {"name": "GPT-2 124M", "recipe": "gpt2-124m.toml", "sets": DATA_SETS + OPTIMIZER_SETS,
     "peer": "eager", "peer_name": "PyTorch eager", **GPT2_124M},
    {"name": "LLaMA-1B width, 4 layers", "recipe": "gpt2-124m.toml",
     "sets": DATA_SETS + OPTIMIZER_SETS + [
         "model.plugin=llama", "model.preset=1B", "model.n_layer=4", "model.vocab_size=128256"],
     "peer": "eager", "peer_name": "PyTorch eager", **LLAMA_1B_WIDTH},
    {"name": "SmolLM2-135M LoRA", "recipe": "default.toml",
     "sets": ["run.answer_prompts=", "data.seq_len=64", "data.batch_size=1"],
     "peer": "peft", "peer_name": "transformers + PEFT"},
]


def peer_counts(case: dict) -> dict:
    spec = {"peer": case["peer"], "bench": str(ROOT / "bench"), "batch": 1, "seq": 64,
            "gguf": str(GGUF), "family": case.get("family"), "shape": case.get("shape")}
    p = subprocess.run([sys.executable, "-c", PEER, json.dumps(spec)], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{case['peer_name']} ({case['name']}) failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def tightfit_counts(case: dict) -> dict:
    last = run(case["recipe"], case["sets"] + ["run.profile_ops=true"], steps=3)
    return {"ops": last["ops"], "ops_all": last["ops_all"], "reads": last["host_reads"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", help="a case's name (repeatable)")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    cases = [c for c in CASES if not args.only or c["name"] in args.only]
    if any(c["peer"] == "peft" for c in cases) and not GGUF.exists():
        sys.exit(f"{GGUF} is missing: run scripts/setup")
    results = {"date": time.strftime("%Y-%m-%d"), "cases": {}}
    marks = []
    for case in cases:
        ours, theirs = tightfit_counts(case), peer_counts(case)
        ratio = ours["ops"] / theirs["ops"]
        results["cases"][case["name"]] = {
            "tightfit ops": ours["ops"], case["peer_name"] + " ops": theirs["ops"], "ratio": round(ratio, 3),
            "tightfit ops_all": ours["ops_all"], case["peer_name"] + " ops_all": theirs["ops_all"],
            "tightfit reads": ours["reads"], case["peer_name"] + " item() calls": theirs["reads"]}
        print(f"{case['name']:28s} tightfit {ours['ops']:5d} ops ({ours['ops_all']} in all, "
              f"{ours['reads']} reads)  {case['peer_name']} {theirs['ops']:5d} ops "
              f"({theirs['ops_all']} in all, {theirs['reads']} item() calls)  ratio {ratio:.2f}")
        marks.append((f"{case['name']}: tightfit ops <= {case['peer_name']}'s", ratio <= 1.0, f"{ratio:.2f}x"))
    return finish(args, results, report_marks(marks))


if __name__ == "__main__":
    sys.exit(main())
