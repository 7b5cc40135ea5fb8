#!/usr/bin/env python3
"""Training throughput of the tiny presets: tightfit vs the same model in
Hugging Face transformers, trained from Python in the same run.

Both sides: same shape, byte tokens of Debian's fortunes, seq 128, batch 16,
AdamW (lr 2e-3, betas 0.9/0.95, weight decay 0.1), gradient clipping at 1.0,
fp32, LibTorch's default CPU threads. Tokens/s is measured over steps 2..N
(the first step warms caches). Prints the ratio tightfit / transformers.

usage: bench/models_vs_transformers.py [--steps N] [--families gpt2,llama,rwkv] [--json OUT]
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from peers.corpus import fortunes_bytes  # noqa: E402
from tightfit_runs import finish  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
TIGHTFIT = ROOT / "build" / "bin" / "tightfit"
RECIPES = {"gpt2": "fortunes-gpt2.toml", "llama": "llama-tiny.toml", "rwkv": "rwkv-tiny.toml"}
SEQ, BATCH = 128, 16


def hf_model(family: str) -> torch.nn.Module:
    if family == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=256, n_positions=256, n_embd=128, n_layer=4, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, activation_function="gelu_new"))
    if family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=256, hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5))
    return transformers.RwkvForCausalLM(transformers.RwkvConfig(
        vocab_size=256, context_length=1024, hidden_size=128, num_hidden_layers=4, attention_hidden_size=128,
        intermediate_size=512, rescale_every=0))


def transformers_tokens_per_s(family: str, steps: int, data: torch.Tensor) -> float:
    torch.manual_seed(0)
    model = hf_model(family).train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(0)
    start = None
    for step in range(steps):
        if step == 1:
            start = time.perf_counter()
        idx = torch.randint(0, data.numel() - SEQ - 1, (BATCH,), generator=g)
        window = torch.stack([data[i:i + SEQ + 1] for i in idx.tolist()])
        logits = model(window[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return (steps - 1) * BATCH * SEQ / (time.perf_counter() - start)


def tightfit_tokens_per_s(family: str, steps: int, out: str) -> float:
    cmd = [str(TIGHTFIT), "run", str(ROOT / "configs" / RECIPES[family]), "--quiet",
           "--set", f"run.steps={steps}", "--set", f"run.out_dir={out}", "--set", f"run.name={family}",
           "--set", "run.sample_tokens=0", "--set", "run.eval_batches=0", "--set", "save.final=false",
           "--set", "save.every=0", "--set", f"data.seq_len={SEQ}", "--set", f"data.batch_size={BATCH}"]
    if family != "gpt2":
        cmd += ["--set", "save.hf=false"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (pathlib.Path(out) / family / "metrics.jsonl").open()]
    return sum(r["tokens"] for r in rows[1:]) / (rows[-1]["elapsed_s"] - rows[0]["elapsed_s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--families", default="gpt2,llama,rwkv")
    ap.add_argument("--json")
    args = ap.parse_args()
    data = fortunes_bytes()
    results = {}
    print(f"tiny presets, seq {SEQ}, batch {BATCH}, {args.steps} steps, fp32 CPU, {torch.get_num_threads()} threads")
    print(f"{'model':8}{'tightfit tok/s':>16}{'transformers tok/s':>20}{'ratio':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families.split(","):
            ours = tightfit_tokens_per_s(family, args.steps, tmp)
            theirs = transformers_tokens_per_s(family, args.steps, data)
            results[family] = {"tightfit": ours, "transformers": theirs, "ratio": ours / theirs}
            print(f"{family:8}{ours:16.0f}{theirs:20.0f}{ours / theirs:8.2f}")
    return finish(args, results, all_met=True)


if __name__ == "__main__":
    sys.exit(main())
