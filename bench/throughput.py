#!/usr/bin/env python3
"""Training-step throughput: tightfit against the same model written in plain
PyTorch (bench/peers/eager_models.py, nanoGPT style) and Hugging Face
transformers' model, all on this CPU in one run; model FLOPs utilisation
against this machine's matmul peak measured in the same run; and the time
each spends outside LibTorch operators per step.

Every side: the same shape, byte tokens of Debian's fortunes, the same batch
and sequence length, fp32, the same optimizer (AdamW for GPT-2 124M; plain
SGD for the LLaMA-1B shape, whose AdamW state would not fit three runs of it
in this machine's 24 GiB one after another), gradient clipping at 1.0,
LibTorch's CPU threads (torch.get_num_threads(), which tightfit uses too).
Tokens/s is of the fastest step after the first (which warms caches) over
--rounds rounds that alternate tightfit, the eager model and transformers, so
that a slow spell of a shared CPU does not fall on one side only.

MFU: training FLOPs per token = 6 x (parameters in matmuls, the head
included) + 12 x layers x seq x width (attention scores and values, forward
and backward; nanoGPT's / PaLM's estimate), times tokens/s, over the peak
FLOP/s of a square fp32 matmul (the best of 1024..4096, measured here).

Outside ops: a step's wall time less the time inside the outermost LibTorch
operators (tightfit: [run] profile_ops; the peers: torch.profiler, the same
definition) — the host's own overhead, or the Python interpreter's.

Pass marks (--check exits 1 when one is missed):
  tightfit tokens/s >= 1.1 x plain PyTorch eager on GPT-2 124M
  MFU >= 0.5 at the best batch of GPT-2 124M

On a GPU (--device cuda, as scripts/gpu-check runs it) every side runs on
that device, each step is timed to a device synchronize, and the peak is the
card's fp32 matmul peak measured the same way. The bf16 peak is measured only
there: on a CPU without native bf16 it takes minutes and no mark uses it.

usage: bench/throughput.py [--models gpt2-124m,llama-1b] [--steps N] [--rounds R] [--quick] [--check]
                           [--device cpu|cuda] [--json OUT]
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from peers.eager_models import Gpt2, Llama  # noqa: E402
from peers.corpus import fortunes_bytes  # noqa: E402
from tightfit_runs import finish, report_marks, step_times  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
TIGHTFIT = ROOT / "build" / "bin" / "tightfit"
DEVICE = torch.device("cpu")  # --device


def sync():
    """Waits for the device, so that a step's time is its work's."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


# name: tightfit settings, the shape, optimizer, batch sizes to try for MFU
MODELS = {
    "gpt2-124m": dict(recipe="gpt2-124m.toml", family="gpt2", seq=256, batch=4, mfu_batches=[1, 2, 4, 8],
                      optimizer="adamw", shape=dict(vocab=50257, n_positions=1024, d=768, n_layer=12, n_head=12)),
    "llama-1b": dict(recipe="llama-tiny.toml", family="llama", seq=128, batch=1, mfu_batches=[],
                     optimizer="sgd", shape=dict(vocab=128256, d=2048, n_layer=16, n_head=32, n_kv=8, ffn=8192)),
}


def matmul_peak(dtype: torch.dtype) -> float:
    """Best FLOP/s of a square matmul on this machine's threads (or its GPU)."""
    best = 0.0
    for n in (1024, 2048, 4096):
        a = torch.randn(n, n, dtype=dtype, device=DEVICE)
        b = torch.randn(n, n, dtype=dtype, device=DEVICE)
        torch.mm(a, b)
        sync()
        for _ in range(3):
            t = time.perf_counter()
            torch.mm(a, b)
            sync()
            best = max(best, 2 * n ** 3 / (time.perf_counter() - t))
    return best


# --- the peers -------------------------------------------------------------

def eager_model(spec: dict) -> torch.nn.Module:
    s = spec["shape"]
    if spec["family"] == "gpt2":
        return Gpt2(s["vocab"], s["n_positions"], s["d"], s["n_layer"], s["n_head"])
    return Llama(s["vocab"], s["d"], s["n_layer"], s["n_head"], s["n_kv"], s["ffn"], tie=True)


class HfLoss(torch.nn.Module):
    """transformers' model with the same (idx, targets) -> loss call."""

    def __init__(self, spec: dict):
        super().__init__()
        s = spec["shape"]
        if spec["family"] == "gpt2":
            cfg = transformers.GPT2Config(vocab_size=s["vocab"], n_positions=s["n_positions"], n_embd=s["d"],
                                          n_layer=s["n_layer"], n_head=s["n_head"], resid_pdrop=0.0,
                                          embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new")
            self.model = transformers.GPT2LMHeadModel(cfg)
        else:
            cfg = transformers.LlamaConfig(vocab_size=s["vocab"], hidden_size=s["d"], intermediate_size=s["ffn"],
                                           num_hidden_layers=s["n_layer"], num_attention_heads=s["n_head"],
                                           num_key_value_heads=s["n_kv"], tie_word_embeddings=True,
                                           max_position_embeddings=4096)
            self.model = transformers.LlamaForCausalLM(cfg)
        self.model.config._attn_implementation = "sdpa"

    def forward(self, idx, targets):
        logits = self.model(idx).logits
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def make_optimizer(spec: dict, params):
    if spec["optimizer"] == "adamw":
        return torch.optim.AdamW(params, lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    return torch.optim.SGD(params, lr=1e-3)


def is_op(name: str) -> bool:
    return name.startswith(("aten::", "autograd::engine::evaluate_function")) or name.endswith(
        ("Backward0", "Backward1"))


def time_outside_ops(step) -> tuple[float, float]:
    """(wall s, s inside the outermost LibTorch ops) of one profiled step."""
    with torch.autograd.profiler.profile() as prof:
        t = time.perf_counter()
        step()
        wall = time.perf_counter() - t
    inside = 0.0
    for e in prof.function_events:
        if not is_op(e.name):
            continue
        p, nested = e.cpu_parent, False
        while p is not None:
            if is_op(p.name):
                nested = True
                break
            p = p.cpu_parent
        if not nested:
            inside += e.time_range.elapsed_us() * 1e-6
    return wall, inside


def peer_run(spec: dict, model: torch.nn.Module, batch: int, steps: int, data: torch.Tensor) -> dict:
    seq = spec["seq"]
    model = model.to(DEVICE)
    opt = make_optimizer(spec, model.parameters())
    g = torch.Generator().manual_seed(0)

    def step():
        idx = torch.randint(0, data.numel() - seq - 1, (batch,), generator=g)
        window = torch.stack([data[i:i + seq + 1] for i in idx.tolist()]).to(DEVICE)
        loss = model(window[:, :-1], window[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()

    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    wall, inside = time_outside_ops(step)
    return {"times": times[1:], "outside_ops_s": wall - inside, "outside_ops_fraction": (wall - inside) / wall}


# --- tightfit --------------------------------------------------------------

def tightfit_args(spec: dict, batch: int, steps: int, out: str, name: str) -> list[str]:
    a = [str(TIGHTFIT), "run", str(ROOT / "configs" / spec["recipe"]), "--quiet",
         "--set", f"run.steps={steps}", "--set", f"run.out_dir={out}", "--set", f"run.name={name}",
         "--set", "run.sample_tokens=0", "--set", "run.eval_batches=0", "--set", "run.memory_budget=0",
         "--set", "save.final=false", "--set", "save.every=0", "--set", "save.hf=false",
         "--set", f"data.seq_len={spec['seq']}", "--set", f"data.batch_size={batch}",
         "--set", "data.tokenizer=byte", "--set", "data.corpus=builtin:fortunes",
         "--set", "schedule.plugin=standard", "--set", "optimizer.grad_clip=1.0",
         "--set", f"optimizer.name={spec['optimizer']}", "--set", "optimizer.momentum=0",
         "--set", f"optimizer.weight_decay={0.1 if spec['optimizer'] == 'adamw' else 0.0}",
         "--set", "optimizer.beta1=0.9", "--set", "optimizer.beta2=0.95"]
    if DEVICE.type == "cuda":
        # The peers run LibTorch's default (non-deterministic) kernels; so
        # does tightfit here. Its default, [run] deterministic = true, cost
        # GPT-2 124M 1.6x in step time on an H100 (2026-11-28, docs/gpu.md).
        a += ["--set", f"run.device={DEVICE}", "--set", "run.deterministic=false"]
    if spec["family"] == "llama":  # Llama-3.2-1B's shape
        a += ["--set", "model.preset=1B", "--set", "model.vocab_size=128256"]
    return a


def tightfit_run(spec: dict, batch: int, steps: int, profile: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as out:
        args = tightfit_args(spec, batch, steps, out, "t")
        if profile:
            args += ["--set", "run.profile_ops=true"]
        p = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed:\n{p.stderr[-4000:]}")
        rows = [json.loads(line) for line in (pathlib.Path(out) / "t" / "metrics.jsonl").open()]
    times = step_times(rows)
    r = {"times": times, "step_s": min(times), "tokens_per_s": batch * spec["seq"] / min(times)}
    if profile:
        last = rows[-1]
        r["outside_ops_s"] = last["step_s"] - last["op_s"]
        r["outside_ops_fraction"] = r["outside_ops_s"] / last["step_s"]
    return r


def tightfit_params(spec: dict) -> int:
    args = tightfit_args(spec, spec["batch"], 1, "/tmp", "plan")
    args[1] = "plan"
    args.remove("--quiet")
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return int(re.search(r"model\s+(\d+) parameters", out).group(1))


def train_flops_per_token(spec: dict, matmul_params: int) -> float:
    s = spec["shape"]
    return 6 * matmul_params + 12 * s["n_layer"] * spec["seq"] * s["d"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2-124m,llama-1b")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="GPT-2 124M only, 3 steps, no batch sweep")
    ap.add_argument("--check", action="store_true", help="exit 1 when a pass mark is missed")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda[:N] for every side on that GPU")
    ap.add_argument("--json")
    args = ap.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    if args.quick:
        args.models, args.steps, args.rounds = "gpt2-124m", 3, 1
    data = fortunes_bytes()
    peak32 = matmul_peak(torch.float32)
    peak16 = matmul_peak(torch.bfloat16) if DEVICE.type == "cuda" else None
    threads = torch.get_num_threads()
    where = torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else f"{threads} threads"
    print(f"matmul peak on {where}: fp32 {peak32 / 1e9:.0f} GFLOP/s"
          + (f", bf16 {peak16 / 1e9:.0f} GFLOP/s" if peak16 else ""), flush=True)
    results = {"device": where, "threads": threads, "matmul_peak_fp32": peak32, "matmul_peak_bf16": peak16,
               "models": {}}
    all_met = True
    for name in args.models.split(","):
        spec = MODELS[name]
        torch.manual_seed(0)
        n_eager = sum(p.numel() for p in eager_model(spec).parameters())
        n_ours = tightfit_params(spec)
        if n_eager != n_ours:
            print(f"{name}: the eager peer has {n_eager} parameters, tightfit {n_ours}: not the same model")
            return 2
        # Parameters in matmuls: all but the position table (a lookup); the
        # tied token table is the head's matmul.
        pos = spec["shape"]["n_positions"] * spec["shape"]["d"] if spec["family"] == "gpt2" else 0
        flops_tok = train_flops_per_token(spec, n_ours - pos)
        b = spec["batch"]
        print(f"\n{name}: {n_ours / 1e6:.1f}M parameters, batch {b} x seq {spec['seq']}, fp32, "
              f"{spec['optimizer']}, {args.steps} steps; {flops_tok / 1e9:.2f} GFLOP per token trained")
        # Rounds alternate the three so that a slow spell of this shared CPU
        # falls on all of them; each one's best step counts.
        rows = {"tightfit": {"times": []}, "pytorch eager": {"times": []}, "transformers": {"times": []}}
        for _ in range(args.rounds):
            rows["tightfit"]["times"] += tightfit_run(spec, b, args.steps)["times"]
            for who, make in (("pytorch eager", eager_model), ("transformers", HfLoss)):
                torch.manual_seed(0)
                model = make(spec)
                r = peer_run(spec, model, b, args.steps, data)
                del model
                rows[who]["times"] += r.pop("times")
                rows[who].update(r)
        rows["tightfit"].update({k: v for k, v in tightfit_run(spec, b, 2, profile=True).items()
                                 if k.startswith("outside")})
        for r in rows.values():
            r["step_s"] = min(r["times"])
            r["tokens_per_s"] = b * spec["seq"] / r["step_s"]
        print(f"{'':16}{'tokens/s':>10}{'x eager':>9}{'MFU':>7}{'outside ops ms/step':>21}")
        base = rows["pytorch eager"]["tokens_per_s"]
        for who, r in rows.items():
            r["mfu"] = r["tokens_per_s"] * flops_tok / peak32
            print(f"{who:16}{r['tokens_per_s']:10.1f}{r['tokens_per_s'] / base:9.2f}{r['mfu']:7.2f}"
                  f"{r['outside_ops_s'] * 1e3:14.1f} ({100 * r['outside_ops_fraction']:.1f}%)")
        sweep = {}
        if spec["mfu_batches"] and not args.quick:
            print("tightfit by batch:", end="")
            for bb in spec["mfu_batches"]:
                r = tightfit_run(spec, bb, 4)
                sweep[bb] = r["tokens_per_s"] * flops_tok / peak32
                print(f"  {bb}: MFU {sweep[bb]:.2f}", end="", flush=True)
            print()
        best_mfu = max([rows["tightfit"]["mfu"], *sweep.values()])
        ratio = rows["tightfit"]["tokens_per_s"] / base
        results["models"][name] = {"parameters": n_ours, "flops_per_token": flops_tok, "batch": b,
                                   "seq": spec["seq"], "runs": rows, "mfu_by_batch": sweep,
                                   "best_mfu": best_mfu, "tightfit_vs_eager": ratio}
        if name == "gpt2-124m":
            marks = [("tightfit >= 1.1x eager tokens/s", ratio >= 1.1, f"{ratio:.2f}x"),
                     ("MFU >= 0.50 at the best batch", best_mfu >= 0.5, f"{best_mfu:.2f}")]
            all_met = report_marks(marks) and all_met
    return finish(args, results, all_met)


if __name__ == "__main__":
    sys.exit(main())
