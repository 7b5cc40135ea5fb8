"""Checks what `tightfit export --format gguf` wrote against the readers users
have: ggml's gguf package (tensor bytes, metadata) and transformers' GGUF
loader (logits), and checks the LoRA adapter GGUF against what llama.cpp
computes with it (W + alpha / r * B A, in llama.cpp's permuted layout).

usage: gguf_export.py SOURCE.gguf DIR
DIR holds what the test exported from a LoRA run on SOURCE.gguf: hf/ (the
merged Hugging Face folder), peft/ (the PEFT adapter), m-f32.gguf,
m-f16.gguf, m-bf16.gguf, m-q8_0.gguf (the merged model) and lora.gguf (the
adapter, F32). Writes DIR/report.json:
  tensors        {type: {"checked": n, "wrong": [names]}}: each tensor's bytes equal
                 gguf.quants.quantize of the Hugging Face tensor (q/k permuted as
                 convert_hf_to_gguf), in the type the converter gives it
  metadata_wrong keys of the source's llama.* and tokenizer.* whose value differs or is missing
  general        general.architecture / type / file_type per file
  transformers_f32_vs_hf   max |logits| difference, transformers on m-f32.gguf vs on hf/
  logits         {type: {"prompt", "prompt_ids", "logits", "new_ids"}}: transformers on m-TYPE.gguf
  lora           {"general_type", "adapter_type", "alpha", "pairs", "wrong": [names],
                  "merge_max_err": max |W_source + alpha/r B A - W_merged| over adapted weights,
                  "b_abs_max": the largest |B| (the run moved B off its zero start)}
"""
import json
import pathlib
import sys

import numpy as np
import torch
from safetensors.torch import load_file

import gguf
from gguf import GGMLQuantizationType as T

PROMPT = "The memory budget 2026"


def permute(w, n_head, n_head_kv):
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
         "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
WHOLE = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
         "lm_head.weight": "output.weight"}


def gguf_name(hf):
    if hf in WHOLE:
        return WHOLE[hf]
    parts = hf.split(".")
    return f"blk.{parts[2]}.{BLOCK['.'.join(parts[3:-1])]}.{parts[-1]}"


def gguf_layout(hf, a, cfg):
    if hf.endswith("q_proj.weight"):
        return permute(a, cfg["num_attention_heads"], cfg["num_attention_heads"])
    if hf.endswith("k_proj.weight"):
        return permute(a, cfg["num_attention_heads"], cfg["num_key_value_heads"])
    return a


def field(reader, key):
    f = reader.get_field(key)
    if f is None:
        return None
    return f.contents()


def logits_of(folder, gguf_file=None):
    """transformers on the file: the prompt's ids (its tokenizer, special tokens
    added), the last position's logits, 8 greedy tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    kw = {"gguf_file": gguf_file} if gguf_file else {}
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, **kw)
    model.eval()
    prompt_ids = AutoTokenizer.from_pretrained(str(folder), **kw)(PROMPT)["input_ids"]
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=8, min_new_tokens=8, eos_token_id=None, pad_token_id=0)
    return logits, prompt_ids, gen[0, len(prompt_ids):].tolist()


def main(source: pathlib.Path, d: pathlib.Path) -> None:
    cfg = json.loads((d / "hf" / "config.json").read_text())
    hf = load_file(str(d / "hf" / "model.safetensors"))
    src = gguf.GGUFReader(str(source))
    report = {"tensors": {}, "metadata_wrong": [], "general": {}, "logits": {}}
    types = {"f32": T.F32, "f16": T.F16, "bf16": T.BF16, "q8_0": T.Q8_0}
    for name, qt in types.items():
        r = gguf.GGUFReader(str(d / f"m-{name}.gguf"))
        by_name = {t.name: t for t in r.tensors}
        wrong = []
        for h, t in hf.items():
            if h == "lm_head.weight" and cfg.get("tie_word_embeddings"):
                continue
            g = by_name.get(gguf_name(h))
            a = np.ascontiguousarray(gguf_layout(h, t.float().numpy(), cfg))
            want_type = T.F32 if a.ndim == 1 else qt
            if g is None or g.tensor_type != want_type:
                wrong.append(f"{h} (missing or {g.tensor_type.name if g else '-'})")
                continue
            want = np.asarray(gguf.quants.quantize(a, want_type)).view(np.uint8).reshape(-1)
            if not np.array_equal(np.asarray(g.data).view(np.uint8).reshape(-1), want):
                wrong.append(h)
        report["tensors"][name] = {"checked": len(hf), "wrong": wrong, "in_file": len(r.tensors)}
        for key in src.fields:
            if not (key.startswith("llama.") or key.startswith("tokenizer.")):
                continue
            if field(r, key) != field(src, key):
                report["metadata_wrong"].append(f"{name}: {key}")
        report["general"][name] = {k: field(r, "general." + k) for k in ("architecture", "type", "file_type")}
        logits, prompt_ids, new_ids = logits_of(d, f"m-{name}.gguf")
        report["logits"][name] = {"prompt": PROMPT, "prompt_ids": prompt_ids, "logits": logits.tolist(),
                                  "new_ids": new_ids}
        if name == "f32":
            ref, _, _ = logits_of(d / "hf")
            report["transformers_f32_vs_hf"] = float((logits - ref).abs().max())

    # The adapter, as llama.cpp applies it: W + alpha / r * B A, every tensor in
    # GGUF's (permuted) layout.
    lr = gguf.GGUFReader(str(d / "lora.gguf"))
    lcfg = json.loads((d / "peft" / "adapter_config.json").read_text())
    peft = load_file(str(d / "peft" / "adapter_model.safetensors"))
    alpha = float(field(lr, "adapter.lora.alpha"))
    lt = {t.name: t for t in lr.tensors}
    st = {t.name: t for t in src.tensors}
    merged = {t.name: t for t in gguf.GGUFReader(str(d / "m-f32.gguf")).tensors}
    wrong, err, pairs, b_max = [], 0.0, 0, 0.0
    for key, a in peft.items():
        if ".lora_A." not in key:
            continue
        base = key.replace("base_model.model.", "").replace(".lora_A.weight", ".weight")
        b = peft[key.replace(".lora_A.", ".lora_B.")].float().numpy()
        a = a.float().numpy()
        b = gguf_layout(base, b, cfg)
        b_max = max(b_max, float(np.abs(b).max()))
        g = gguf_name(base)
        ga, gb = lt.get(g + ".lora_a"), lt.get(g + ".lora_b")
        pairs += 1
        if ga is None or gb is None:
            wrong.append(g)
            continue
        ra = np.asarray(ga.data).reshape(a.shape)
        rb = np.asarray(gb.data).reshape(b.shape)
        if not (np.array_equal(ra, a) and np.array_equal(rb, b)):
            wrong.append(g)
        w = gguf.quants.dequantize(st[g].data, st[g].tensor_type).reshape(b.shape[0], a.shape[1])
        m = np.asarray(merged[g].data).reshape(w.shape)
        err = max(err, float(np.abs(w + alpha / lcfg["r"] * (rb @ ra) - m).max()))
    report["lora"] = {"general_type": field(lr, "general.type"), "adapter_type": field(lr, "adapter.type"),
                      "alpha": alpha, "r": lcfg["r"], "pairs": pairs, "in_file": len(lr.tensors),
                      "wrong": wrong, "merge_max_err": err, "b_abs_max": b_max,
                      "architecture": field(lr, "general.architecture")}
    (d / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))
