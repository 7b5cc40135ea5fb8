#!/usr/bin/env python3
"""Peak memory of tightfit's strategies against what a PyTorch user does
instead, on the same model and batch, in one run on this CPU.

  checkpoint  GPT-2 124M: tightfit's checkpoint (every block) against
              transformers' gradient_checkpointing_enable(), each also
              without, AdamW, fp32, seq 512, batch 4 (--seq, --batch)
  qlora       LLaMA-1B shape (Llama-3.2-1B): tightfit's QLoRA (NF4 base with
              double quantization, LoRA r16 on q/k/v/o, bf16 autocast)
              against transformers + peft LoRA (the same targets and rank)
              on a bf16 base, AdamW, batch 1 x seq 256
  adam8       GPT-2 124M: tightfit's 8-bit AdamW state against PyTorch
              AdamW's fp32 state

Peaks are of live tensor bytes, the same on both sides: tightfit's own
accounting (the run's peak less the corpus it holds) and, for the peers, the
storages alive over one training step after a first one (so the optimizer
state exists), followed through a TorchDispatchMode (bench's LiveBytes;
torch's MemTracker cannot follow frozen parameters).

Pass marks (--check exits 1 when one is missed):
  tightfit checkpoint peak <= transformers' checkpointing peak
  NF4 base weights <= 0.16 x their fp32 bytes
  8-bit AdamW state <= 0.27 x fp32 AdamW state

usage: bench/memory_peers.py [--parts checkpoint,qlora,adam8] [--seq T] [--batch B] [--check] [--json OUT]
"""
import argparse
import gc
import pathlib
import sys
import weakref

import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from peers.corpus import fortunes_bytes  # noqa: E402
from tightfit_runs import QLORA_STRATEGIES, finish, plan as plan_lines, report_marks, run as tightfit  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
MIB = 1 << 20

LLAMA_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True,
                max_position_embeddings=4096)


# --- tightfit --------------------------------------------------------------

QLORA_1B = """
[run]
name = "qlora"
[model]
plugin = "llama"
preset = "1B"
vocab_size = 128256
[data]
corpus = "builtin:fortunes"
tokenizer = "byte"
seq_len = 256
batch_size = 1
[optimizer]
name = "adamw"
lr = 1e-4
""" + QLORA_STRATEGIES

ADAM8 = '\n[[strategy]]\nplugin = "quantize"\nweights = false\noptimizer_state = "int8"\n'


# --- the peers -------------------------------------------------------------

class LiveBytes(TorchDispatchMode):
    """Bytes of live tensor storages: those alive when it starts (given) plus
    every storage an op makes while it is on, until that storage is freed;
    its peak. What tightfit's accounting counts, seen from Python."""

    def __init__(self, baseline: int):
        super().__init__()
        self.live, self.current, self.peak = {}, baseline, baseline

    def _free(self, key):
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                continue
            st = t.untyped_storage()
            key = st.data_ptr()
            if key in self.live or st.nbytes() == 0:
                continue
            self.live[key] = st.nbytes()
            self.current += st.nbytes()
            self.peak = max(self.peak, self.current)
            weakref.finalize(st, self._free, key)
        return out


def storage_bytes(tensors) -> int:
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def tracked_step(model: torch.nn.Module, params, batch: int, seq: int, data: torch.Tensor) -> dict:
    """Peak live tensor bytes of the second AdamW step (after the first made
    the optimizer state), with the parameters' and the state's bytes."""
    params = list(params)
    opt = torch.optim.AdamW(params, lr=1e-4)
    g = torch.Generator().manual_seed(0)

    def step():
        idx = torch.randint(0, data.numel() - seq - 1, (batch,), generator=g)
        window = torch.stack([data[i:i + seq + 1] for i in idx.tolist()])
        logits = model(window[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                 window[:, 1:].reshape(-1))
        del logits
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    weights = storage_bytes(model.parameters()) + storage_bytes(model.buffers())
    state = storage_bytes(v for st in opt.state.values() for v in st.values())
    gc.collect()
    with LiveBytes(weights + state) as tracker:
        step()
    return {"total": tracker.peak, "parameter": weights, "optstate": state}

def gpt2_124m() -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new")).train()


# --- the parts -------------------------------------------------------------

def part_checkpoint(args, data) -> tuple[dict, list]:
    sets = [f"data.seq_len={args.seq}", f"data.batch_size={args.batch}", "data.tokenizer=byte"]
    ours_plain = tightfit("gpt2-124m.toml", sets)
    ours_ckpt = tightfit("gpt2-124m-checkpoint.toml", sets)
    m = gpt2_124m()
    hf_plain = tracked_step(m, m.parameters(), args.batch, args.seq, data)
    m = gpt2_124m()
    m.gradient_checkpointing_enable()
    hf_ckpt = tracked_step(m, m.parameters(), args.batch, args.seq, data)
    del m
    print(f"\ncheckpointing: GPT-2 124M, batch {args.batch} x seq {args.seq}, AdamW, fp32 (MiB)")
    print(f"{'':34}{'peak':>9}{'x none':>8}")
    rows = [("tightfit, none", ours_plain["peak_without_data"]),
            ("tightfit, checkpoint every block", ours_ckpt["peak_without_data"]),
            ("transformers, none", hf_plain["total"]),
            ("transformers, checkpointing", hf_ckpt["total"])]
    for i, (who, peak) in enumerate(rows):
        print(f"{who:34}{peak / MIB:9.1f}{peak / rows[i - i % 2][1]:8.3f}")
    ratio = ours_ckpt["peak_without_data"] / hf_ckpt["total"]
    print(f"tightfit's checkpointing peak / transformers': {ratio:.3f}")
    result = {"tightfit": {"none": ours_plain, "checkpoint": ours_ckpt},
              "transformers": {"none": hf_plain, "checkpointing": hf_ckpt}, "peak_ratio": ratio}
    return result, [("tightfit checkpoint peak <= transformers' checkpointing", ratio <= 1.0, f"{ratio:.3f}")]


def part_qlora(args, data) -> tuple[dict, list]:
    seq, batch = 256, 1
    ours = tightfit("", [], steps=2, text=QLORA_1B)
    # NF4 bytes of the quantized (block) matrices against their fp32 bytes:
    # the run's weights less what stays fp32 (the tied embedding, the norms).
    c, f, L, kv = LLAMA_1B["hidden_size"], LLAMA_1B["intermediate_size"], LLAMA_1B["num_hidden_layers"], 512
    block_fp32 = 4 * L * (2 * c * c + 2 * c * kv + 3 * c * f)
    kept_fp32 = 4 * (LLAMA_1B["vocab_size"] * c + (2 * L + 1) * c)
    nf4_ratio = (ours["peak_weights"] - kept_fp32) / block_fp32

    torch.manual_seed(0)
    import peft
    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA_1B)).to(torch.bfloat16)
    model = peft.get_peft_model(base, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    theirs = tracked_step(model, [p for p in model.parameters() if p.requires_grad], batch, seq, data)
    del model, base
    ours_weights = ours["peak_weights"]
    print(f"\nQLoRA: LLaMA-1B shape, batch {batch} x seq {seq}, LoRA r16 q/k/v/o, AdamW (MiB)")
    print(f"{'':40}{'peak':>9}{'weights':>9}")
    print(f"{'tightfit QLoRA (NF4 + bf16 autocast)':40}{ours['peak_without_data'] / MIB:9.1f}"
          f"{ours_weights / MIB:9.1f}")
    print(f"{'peft LoRA on a bf16 base':40}{theirs['total'] / MIB:9.1f}{theirs['parameter'] / MIB:9.1f}")
    ratio = ours["peak_without_data"] / theirs["total"]
    print(f"tightfit / peft peak: {ratio:.3f}; NF4 block matrices: {nf4_ratio:.3f} of their fp32 bytes")
    result = {"tightfit": ours, "peft_bf16": theirs, "peak_ratio": ratio, "nf4_over_fp32": nf4_ratio}
    return result, [("NF4 base weights <= 0.16 x fp32", nf4_ratio <= 0.16, f"{nf4_ratio:.3f}")]


def part_adam8(args, data) -> tuple[dict, list]:
    sets = ["data.seq_len=128", "data.batch_size=1", "data.tokenizer=byte"]
    ours_fp32 = tightfit("gpt2-124m.toml", sets, steps=2)
    ours_int8 = tightfit("", sets, steps=2, text=(ROOT / "configs" / "gpt2-124m.toml").read_text() + ADAM8)
    m = gpt2_124m()
    theirs = tracked_step(m, m.parameters(), 1, 128, data)
    del m
    ratio = ours_int8["peak_optimizer"] / theirs["optstate"]
    print("\n8-bit AdamW: GPT-2 124M optimizer state (MiB)")
    print(f"{'PyTorch AdamW (fp32 moments)':34}{theirs['optstate'] / MIB:9.1f}")
    print(f"{'tightfit AdamW':34}{ours_fp32['peak_optimizer'] / MIB:9.1f}")
    print(f"{'tightfit 8-bit AdamW':34}{ours_int8['peak_optimizer'] / MIB:9.1f}  ({ratio:.3f} x PyTorch's)")
    result = {"pytorch_adamw": theirs["optstate"], "tightfit_adamw": ours_fp32["peak_optimizer"],
              "tightfit_adamw8": ours_int8["peak_optimizer"], "ratio": ratio}
    return result, [("8-bit AdamW state <= 0.27 x fp32 AdamW", ratio <= 0.27, f"{ratio:.3f}")]


PARTS = {"checkpoint": part_checkpoint, "qlora": part_qlora, "adam8": part_adam8}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="checkpoint,qlora,adam8")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    data = fortunes_bytes()
    results, marks = {}, []
    for part in args.parts.split(","):
        results[part], m = PARTS[part](args, data)
        marks += m
    print()
    return finish(args, results, report_marks(marks))


if __name__ == "__main__":
    sys.exit(main())
