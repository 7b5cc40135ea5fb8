"""Mixtures of experts written as GGUF by tightfit, checked against the readers
users have (test_gguf_export_moe.cpp).

usage: gguf_moe.py make OUT
         OUT/FAMILY/ for FAMILY in qwen2_moe, qwen3_moe, mixtral, olmoe: small
         random transformers models (config.json, model.safetensors) with a
         Qwen2-style byte-level BPE tokenizer.json, configured as llama.cpp's
         graphs compute them (every layer routed; top-k weights normalized
         for qwen3moe and Mixtral only; OLMoE with as many key as query heads)
       gguf_moe.py check OUT
         reads OUT/FAMILY/m-f32.gguf and m-q8_0.gguf (tightfit's export) and
         writes OUT/report.json: {FAMILY: {
           "arch": general.architecture,
           "unknown_names": tensors whose name is not one of gguf's MODEL_TENSORS
                            for the architecture,
           "wrong": {type: [names]}: tensors whose bytes differ from
                    gguf.quants.quantize of the transformers tensor (routed
                    experts stacked [n, out, in], as convert_hf_to_gguf stacks
                    them; norms, biases and routers F32),
           "missing": the names such a conversion has that the file lacks,
           "metadata_wrong": expert and shape keys that differ or are missing,
           "logits_max_err": max |logits| of the F32 file's model against
                             the model itself,
           "ids": the prompt, "logits": {type: the logits [24 x vocab] of
                  m-TYPE.gguf's model, flattened}}}
         The file's model is transformers' GGUF loader's for qwen2moe and
         qwen3moe; transformers 4.57 reads neither Mixtral nor OLMoE files,
         so for those it is the transformers model with the file's tensors,
         dequantized by gguf-py (llama.cpp's own reader), put back under
         their Hugging Face names. For mixtral it also writes
         OUT/mixtral/m-single.gguf: m-f32.gguf with each stack of experts
         split into one tensor per expert (blk.L.ffn_gate.E.weight), as
         llama.cpp wrote Mixtral before it stacked them.
"""
import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from bpe_parity import build, lines  # noqa: E402

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402

FAMILIES = ("qwen2_moe", "qwen3_moe", "mixtral", "olmoe")
ARCH = {"qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "mixtral": "llama", "olmoe": "olmoe"}
# Mixtral's w1, w3, w2 are the gate, up and down projections.
MIXTRAL_W = {"w1": "gate", "w3": "up", "w2": "down"}
BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm", "mlp.gate": "ffn_gate_inp",
         "block_sparse_moe.gate": "ffn_gate_inp",
         "mlp.shared_expert_gate": "ffn_gate_inp_shexp", "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
         "mlp.shared_expert.up_proj": "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp"}
WHOLE = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
         "lm_head.weight": "output.weight"}


def config(family, vocab):
    common = dict(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, num_experts=4,
                  num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=96,
                  tie_word_embeddings=False, rope_theta=10000.0)
    if family == "qwen2_moe":
        return transformers.Qwen2MoeConfig(shared_expert_intermediate_size=64, norm_topk_prob=False, **common)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(head_dim=16, norm_topk_prob=True, **common)
    # Mixtral's and OLMoE's experts are intermediate_size wide.
    for key in ("moe_intermediate_size", "num_experts", "intermediate_size"):
        common.pop(key)
    if family == "mixtral":
        return transformers.MixtralConfig(num_local_experts=4, intermediate_size=32, sliding_window=None,
                                          **common)
    common.update(num_key_value_heads=4, rms_norm_eps=1e-5)  # OLMoE's converter writes 1e-5
    return transformers.OlmoeConfig(num_experts=4, intermediate_size=32, norm_topk_prob=False, clip_qkv=None,
                                    **common)


def make(out):
    tok = build("qwen2", lines(2000))
    for family in FAMILIES:
        torch.manual_seed(5)
        model = transformers.AutoModelForCausalLM.from_config(config(family, tok.get_vocab_size()))
        with torch.no_grad():  # routers away from uniform, so the choice matters
            for name, p in model.named_parameters():
                if name.endswith((".mlp.gate.weight", ".block_sparse_moe.gate.weight")):
                    p.normal_(0, 0.5)
        folder = out / family
        model.save_pretrained(folder, safe_serialization=True)
        tok.save(str(folder / "tokenizer.json"))
        # The tokenizer is Qwen2's style; without this, Mixtral's model_type
        # would give it LlamaTokenizer's <unk>, <s>, </s> (as AutoTokenizer does).
        (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "Qwen2Tokenizer"}))


def permute(w, n_head):
    """convert_hf_to_gguf's LlamaModel.permute: q and k rows per head,
    [n_head, 2, d/2] -> [n_head, d/2, 2] (for llama.cpp's rotary kernel)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def layout(model):
    """Where convert_hf_to_gguf puts each of `model`'s tensors:
    hf name -> (GGUF name, expert index or None, heads its rows are permuted by or None)."""
    c = model.config
    llama = ARCH[c.model_type] == "llama"
    out = {}
    for hf in model.state_dict():
        if hf in WHOLE:
            out[hf] = (WHOLE[hf], None, None)
            continue
        m = re.fullmatch(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", hf)
        if m:
            out[hf] = (f"blk.{m[1]}.ffn_{m[3]}_exps.weight", int(m[2]), None)
            continue
        m = re.fullmatch(r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight", hf)
        if m:
            out[hf] = (f"blk.{m[1]}.ffn_{MIXTRAL_W[m[3]]}_exps.weight", int(m[2]), None)
            continue
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", hf)
        heads = None
        if llama and m[2] == "self_attn.q_proj":
            heads = c.num_attention_heads
        if llama and m[2] == "self_attn.k_proj":
            heads = c.num_key_value_heads
        out[hf] = (f"blk.{m[1]}.{BLOCK[m[2]]}.{m[3]}", None, heads)
    return out


def expected_tensors(model):
    """convert_hf_to_gguf's tensors of `model`: GGUF name -> float32 array."""
    out, experts = {}, {}
    for hf, t in model.state_dict().items():
        a = t.float().numpy()
        name, index, heads = layout(model)[hf]
        if index is not None:
            experts.setdefault(name, {})[index] = a
            continue
        if heads is not None:
            a = permute(a, heads)
        # llama.cpp reads the shared-expert gate as a vector ({n_embd}).
        out[name] = a.reshape(-1) if ".ffn_gate_inp_shexp." in name else a
    for name, by_index in experts.items():
        out[name] = np.stack([by_index[i] for i in range(len(by_index))])
    return out


def model_from_file(model, path):
    """`model` with the tensors of the GGUF file at `path`, dequantized by
    gguf-py, put back under their Hugging Face names (stacks split, q and k
    rows unpermuted)."""
    reader = gguf.GGUFReader(str(path))
    values = {}
    for t in reader.tensors:
        a = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        values[t.name] = np.asarray(a, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)])
    state = {}
    for hf, t in model.state_dict().items():
        name, index, heads = layout(model)[hf]
        if name == "output.weight" and name not in values:
            name = "token_embd.weight"
        a = values[name] if index is None else values[name][index]
        if heads is not None:
            a = unpermute(a, heads)
        state[hf] = torch.from_numpy(np.ascontiguousarray(a)).reshape(t.shape)
    loaded = type(model)(model.config).eval()
    loaded.load_state_dict(state)
    return loaded


def write_single_experts(src, dst):
    """`src` with each stack of experts [n, out, in] split into n tensors
    blk.L.ffn_X.E.weight, as llama.cpp wrote Mixtral before it stacked them."""
    reader = gguf.GGUFReader(str(src))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.STRING:
            writer.add_key_value(field.name, bytes(field.parts[-1]).decode(), vtype)
        elif vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[1]
            items = [field.parts[i] for i in field.data]
            vals = [bytes(x).decode() if sub == gguf.GGUFValueType.STRING else x[0].item() for x in items]
            writer.add_key_value(field.name, vals, vtype, sub_type=sub)
        else:
            writer.add_key_value(field.name, field.parts[-1][0].item(), vtype)
    for t in reader.tensors:
        a = np.asarray(t.data, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)])
        m = re.fullmatch(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight", t.name)
        if m:
            for e in range(a.shape[0]):
                writer.add_tensor(f"blk.{m[1]}.ffn_{m[2]}.{e}.weight", np.ascontiguousarray(a[e]))
        else:
            writer.add_tensor(t.name, np.ascontiguousarray(a))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def gguf_type(name, a, file_type):
    if a.ndim <= 1 or name.endswith("_norm.weight") or ".ffn_gate_inp" in name:
        return T.F32
    return file_type


def check(out):
    report = {}
    for family in FAMILIES:
        folder = out / family
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
        want = expected_tensors(model)
        arch = ARCH[family]
        arch_enum = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)
        known = set()
        for kind in gguf.MODEL_TENSORS[arch_enum]:
            pattern = gguf.TENSOR_NAMES[kind]
            for bid in range(model.config.num_hidden_layers):
                known.add(pattern.format(bid=bid) + ".weight")
                known.add(pattern.format(bid=bid) + ".bias")
        r = {"wrong": {}, "unknown_names": [], "missing": [], "metadata_wrong": []}
        for type_name, file_type in (("f32", T.F32), ("q8_0", T.Q8_0)):
            reader = gguf.GGUFReader(str(folder / f"m-{type_name}.gguf"))
            got = {t.name: t for t in reader.tensors}
            r["arch"] = bytes(reader.fields["general.architecture"].parts[-1]).decode()
            r["unknown_names"] += sorted(n for n in got if n not in known)
            r["missing"] += sorted(n for n in want if n not in got)
            wrong = []
            for name, a in want.items():
                if name not in got:
                    continue
                t = got[name]
                qt = gguf_type(name, a, file_type)
                expect = gguf.quants.quantize(a, qt)
                if t.tensor_type != qt or np.asarray(t.data).tobytes() != expect.tobytes():
                    wrong.append(name)
            r["wrong"][type_name] = wrong
            c = model.config
            keys = {"expert_count": getattr(c, "num_local_experts", getattr(c, "num_experts", None)),
                    "expert_used_count": c.num_experts_per_tok, "block_count": c.num_hidden_layers,
                    "embedding_length": c.hidden_size, "attention.head_count": c.num_attention_heads,
                    "attention.head_count_kv": c.num_key_value_heads}
            if family in ("qwen2_moe", "qwen3_moe"):
                keys["expert_feed_forward_length"] = c.moe_intermediate_size
            else:
                keys["feed_forward_length"] = c.intermediate_size
            if family == "qwen2_moe":
                keys["expert_shared_feed_forward_length"] = c.shared_expert_intermediate_size
            if family == "qwen3_moe":
                keys["attention.key_length"] = c.head_dim
            for k, v in keys.items():
                f = reader.fields.get(f"{arch}.{k}")
                if f is None or int(f.parts[-1][0]) != v:
                    r["metadata_wrong"].append(f"{type_name}:{arch}.{k}")
        # transformers' GGUF loader on the F32 file, with the model's config
        # (its GGUF mapping reads neither moe_intermediate_size nor
        # norm_topk_prob: the tensors and their layout are what is checked).
        # transformers 4.57 renames the keys "qwen2moe.*" to "qwen2_moe.*" and
        # then looks them up under "qwen2moe": no key of a qwen2moe file is
        # read (its expert count falls back to 60, and the split fails) —
        # llama.cpp's own files too. The mapping is given under both names.
        from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
        GGUF_CONFIG_MAPPING.setdefault("qwen2_moe", GGUF_CONFIG_MAPPING["qwen2moe"])
        ids = torch.tensor([[(7 * i + 3) % model.config.vocab_size for i in range(24)]])
        r["ids"] = ids[0].tolist()
        r["logits"] = {}
        with torch.no_grad():
            want_logits = model(ids).logits
            for type_name in ("f32", "q8_0"):
                if family in ("qwen2_moe", "qwen3_moe"):
                    loaded = transformers.AutoModelForCausalLM.from_pretrained(
                        folder, gguf_file=f"m-{type_name}.gguf", config=model.config,
                        torch_dtype=torch.float32).eval()
                else:
                    loaded = model_from_file(model, folder / f"m-{type_name}.gguf")
                got = loaded(ids).logits
                r["logits"][type_name] = got[0].flatten().tolist()
                if type_name == "f32":
                    r["logits_max_err"] = float((got - want_logits).abs().max())
        if family == "mixtral":
            write_single_experts(folder / "m-f32.gguf", folder / "m-single.gguf")
        report[family] = r
    (out / "report.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    {"make": make, "check": check}[sys.argv[1]](pathlib.Path(sys.argv[2]))
