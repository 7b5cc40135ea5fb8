"""GGUF models whose tokenizer metadata is written from Hugging Face tokenizers
as llama.cpp's convert_hf_to_gguf.py writes it (tokens, token types, merges
or scores, the pre-tokenizer's name, BOS/EOS and add-BOS), with small random
LLaMA weights (llama.cpp's q/k row permutation applied, tensors F32, F16 and
Q8_0), for test_gguf_tokenizer.

Files in OUT:
  gpt2.gguf    byte-level BPE, pre "gpt-2", no add_bos key (llama.cpp's BPE default: none)
  smollm.gguf  pre "smollm" (digits one by one, then GPT-2's regex), ChatML tokens, add_bos false
  llama3.gguf  pre "llama-bpe" (Llama 3's regex, ignore_merges), add_bos true
  qwen2.gguf   pre "qwen2" (NFC, Qwen2's regex)
  spm.gguf     model "llama": SentencePiece BPE with byte fallback, control and user-defined
               pieces, no add_bos key (llama.cpp's SentencePiece default: BOS)
  NAME_hf/     the Hugging Face tokenizer of gpt2, smollm, llama3, qwen2 (tokenizer.json; smollm
               also a tokenizer_config.json with BOS/EOS and a chat template)
  lines.json   the test lines
  NAME.ids.json  {"ids": [...]}: the original tokenizer's ids (special tokens added as it adds them)
  NAME.model.json  {"prompt_ids", "new_ids", "logits"}: transformers' GGUF loader
               (from_pretrained(gguf_file=), which dequantizes) on the original tokenizer's
               prompt ids: greedy tokens and the last position's logits

usage: gguf_tokenizers.py OUT_DIR
"""
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from bpe_parity import HARD, build, byte_level, lines  # noqa: E402
from tokenizers import pre_tokenizers  # noqa: E402
from tokenizer_folders import train_spm  # noqa: E402

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402


def bpe_vocab(tok):
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    assert None not in tokens
    special = {a.content for a in tok.get_added_tokens_decoder().values() if a.special}
    types = [3 if t in special else 1 for t in tokens]
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [" ".join(m) if isinstance(m, list) else m for m in merges]
    return tokens, types, merges


def permute(w, n_head, n_head_kv):
    """convert_hf_to_gguf.py's LlamaModel.permute (for llama.cpp's rotary kernel)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_model(path, vocab_size, tokenizer_kv):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(5)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(20.0 if p.dim() > 1 else 1.0)
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_context_length(128)
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(16)
    w.add_vocab_size(vocab_size)
    tokenizer_kv(w)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    block = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, t in model.state_dict().items():
        a = t.float().numpy()
        if name in names:
            gname = names[name]
        else:
            parts = name.split(".")
            gname = f"blk.{parts[2]}.{block['.'.join(parts[3:-1])]}.weight"
        if name.endswith("q_proj.weight"):
            a = permute(a, 4, 4)
        if name.endswith("k_proj.weight"):
            a = permute(a, 4, 2)
        a = np.ascontiguousarray(a)
        # One of each type: Q8_0 for the MLP, F16 for attention, F32 elsewhere.
        if a.ndim == 2 and ".mlp." in name:
            q = gguf.quants.quantize(a, T.Q8_0)
            w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=T.Q8_0)
        elif a.ndim == 2 and ".self_attn." in name:
            w.add_tensor(gname, a.astype(np.float16))
        else:
            w.add_tensor(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def model_reference(out, name, prompt_ids):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(out), gguf_file=f"{name}.gguf", torch_dtype=torch.float32)
    model.eval()
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, -1].tolist()
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=12, min_new_tokens=12, eos_token_id=None, pad_token_id=0)
    return {"prompt_ids": prompt_ids, "new_ids": gen[0, len(prompt_ids):].tolist(), "logits": logits}


PROMPT = "The memory budget 2026"


def hostile(out: pathlib.Path) -> None:
    """Metadata-only files, each with one defect in its tokenizer."""
    tokens = ["<unk>", "<s>", "a", "b", "ab"]

    def base(w, model="gpt2", pre="gpt-2"):
        w.add_block_count(1)
        w.add_embedding_length(8)
        w.add_head_count(2)
        if model is not None:
            w.add_tokenizer_model(model)
        if pre is not None:
            w.add_tokenizer_pre(pre)
    cases = {
        "no_tokenizer": lambda w: base(w, model=None, pre=None),
        "no_pre": lambda w: (base(w, pre=None), w.add_token_list(tokens), w.add_token_merges(["a b"])),
        "unknown_pre": lambda w: (base(w, pre="mystery-pre"), w.add_token_list(tokens), w.add_token_merges(["a b"])),
        "t5": lambda w: (base(w, model="t5", pre=None), w.add_token_list(tokens)),
        "short_types": lambda w: (base(w), w.add_token_list(tokens), w.add_token_types([1, 1]),
                                  w.add_token_merges(["a b"])),
        "bos_out": lambda w: (base(w), w.add_token_list(tokens), w.add_token_merges(["a b"]),
                              w.add_bos_token_id(99), w.add_add_bos_token(True)),
        "bad_merge": lambda w: (base(w), w.add_token_list(tokens), w.add_token_merges(["ab"])),
        "spm_bad_type": lambda w: (base(w, model="llama", pre=None), w.add_token_list(tokens),
                                   w.add_token_types([2, 3, 1, 9, 1])),
    }
    (out / "bad").mkdir(exist_ok=True)
    for name, fill in cases.items():
        w = gguf.GGUFWriter(str(out / "bad" / f"{name}.gguf"), arch="llama")
        fill(w)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def main(out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    corpus = lines(3000)
    test = lines(3300)[3000:] + HARD + ["<|im_start|>user\n12 apples<|im_end|>", "1234567 digits 3.14"]
    (out / "lines.json").write_text(json.dumps(test))
    hostile(out)

    styles = {
        "gpt2": (build("gpt2", corpus), "gpt-2", None),
        "smollm": (byte_level(corpus, pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]),
            {}, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]), "smollm", False),
        "llama3": (build("llama3", corpus), "llama-bpe", True),
        "qwen2": (build("qwen2", corpus), "qwen2", None),
    }
    for name, (tok, pre, add_bos) in styles.items():
        tokens, types, merges = bpe_vocab(tok)
        # The Hugging Face tokenizer itself, for tightfit's GGUF export to convert.
        hf = out / f"{name}_hf"
        hf.mkdir(exist_ok=True)
        tok.save(str(hf / "tokenizer.json"))
        if name == "smollm":
            (hf / "tokenizer_config.json").write_text(json.dumps({
                "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False,
                "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                                 "{% endfor %}"}))

        def kv(w, tokens=tokens, types=types, merges=merges, pre=pre, add_bos=add_bos, tok=tok):
            w.add_tokenizer_model("gpt2")
            w.add_tokenizer_pre(pre)
            w.add_token_list(tokens)
            w.add_token_types(types)
            w.add_token_merges(merges)
            bos = tok.token_to_id("<|begin_of_text|>") or tok.token_to_id("<|im_start|>") or 0
            w.add_bos_token_id(bos)
            w.add_eos_token_id(tok.token_to_id("<|im_end|>") or tok.token_to_id("<|endoftext|>") or 0)
            if add_bos is not None:
                w.add_add_bos_token(add_bos)
        write_model(out / f"{name}.gguf", len(tokens), kv)
        ids = [tok.encode(line).ids for line in test]
        (out / f"{name}.ids.json").write_text(json.dumps({"ids": ids}))
        (out / f"{name}.model.json").write_text(json.dumps(model_reference(out, name, tok.encode(PROMPT).ids)))

    # SentencePiece: the pieces, scores and types of a trained tokenizer.model.
    from sentencepiece import sentencepiece_model_pb2
    from transformers import AutoTokenizer
    folder = out / "spm_folder"
    train_spm(folder, corpus, "bpe")
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((folder / "tokenizer.model").read_bytes())
    pieces = list(proto.pieces)

    def spm_kv(w):
        w.add_tokenizer_model("llama")
        w.add_token_list([p.piece for p in pieces])
        w.add_token_scores([p.score for p in pieces])
        w.add_token_types([int(p.type) for p in pieces])
        w.add_bos_token_id(proto.trainer_spec.bos_id)
        w.add_eos_token_id(proto.trainer_spec.eos_id)
        w.add_unk_token_id(proto.trainer_spec.unk_id)
    write_model(out / "spm.gguf", len(pieces), spm_kv)
    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = [tok(line)["input_ids"] for line in test]
    (out / "spm.ids.json").write_text(json.dumps({"ids": ids}))
    (out / "spm.model.json").write_text(json.dumps(model_reference(out, "spm", tok(PROMPT)["input_ids"])))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
