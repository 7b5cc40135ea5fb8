"""A small LLaMA GGUF whose block matrices are in ggml's quantized types,
one type a matrix, for test_gguf_qlora: QLoRA on the file's own blocks.

  mixed.gguf  2 layers, hidden 64, intermediate 256, 4 heads (2 kv), vocab 257:
              a byte-level BPE tokenizer ("gpt2", pre "gpt-2") of the 256 bytes
              (token i is byte i) and one merge, " t"; per layer q Q4_0, k Q4_1, v Q5_0, o Q5_1,
              gate Q8_0, up F16, and down Q4_K (layer 0) / Q6_K (layer 1) as
              random blocks with small float16 scales (gguf cannot quantize
              K-quants); q and k rows permuted as llama.cpp's converter does;
              embeddings, norms and the head F32.

usage: gguf_qlora.py OUT_DIR
"""
import sys
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T

HIDDEN, INTER, LAYERS, HEADS, KV, VOCAB = 64, 256, 2, 4, 2, 257


def permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def byte_level_chars():
    """GPT-2's bytes_to_unicode, in byte order: token i is byte i."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, n = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + n))
            n += 1
    return chars


def k_quant(rng, qtype, rows, cols):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n = rows * cols // block
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    # The float16 super-block scales, small enough for weights of about 0.05.
    for at, scale in {T.Q4_K: [(0, 2e-4), (2, 2e-4)], T.Q6_K: [(208, 5e-5)]}[qtype]:
        raw[:, at:at + 2] = rng.uniform(scale / 2, scale, size=n).astype(np.float16).view(np.uint8).reshape(n, 2)
    return raw.reshape(rows, cols // block * size)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(11)
    w = gguf.GGUFWriter(str(out / "mixed.gguf"), arch="llama")
    w.add_context_length(128)
    w.add_block_count(LAYERS)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_vocab_size(VOCAB)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(byte_level_chars() + ["\u0120t"])
    w.add_token_types([1] * VOCAB)
    w.add_token_merges(["\u0120 t"])

    def dense(rows, cols):
        return (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)

    def add(name, a, qtype):
        if qtype == T.F32:
            w.add_tensor(name, a)
        elif qtype == T.F16:
            w.add_tensor(name, a.astype(np.float16))
        else:
            q = gguf.quants.quantize(a, qtype)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)

    add("token_embd.weight", dense(VOCAB, HIDDEN), T.F32)
    for layer in range(LAYERS):
        b = f"blk.{layer}."
        add(b + "attn_norm.weight", np.ones(HIDDEN, np.float32), T.F32)
        add(b + "ffn_norm.weight", np.ones(HIDDEN, np.float32), T.F32)
        add(b + "attn_q.weight", permute(dense(HIDDEN, HIDDEN), HEADS), T.Q4_0)
        add(b + "attn_k.weight", permute(dense(HIDDEN // HEADS * KV, HIDDEN), KV), T.Q4_1)
        add(b + "attn_v.weight", dense(HIDDEN // HEADS * KV, HIDDEN), T.Q5_0)
        add(b + "attn_output.weight", dense(HIDDEN, HIDDEN), T.Q5_1)
        add(b + "ffn_gate.weight", dense(INTER, HIDDEN), T.Q8_0)
        add(b + "ffn_up.weight", dense(INTER, HIDDEN), T.F16)
        down = T.Q4_K if layer == 0 else T.Q6_K
        raw = k_quant(rng, down, HIDDEN, INTER)
        w.add_tensor(b + "ffn_down.weight", raw, raw_shape=raw.shape, raw_dtype=down)
    add("output_norm.weight", np.ones(HIDDEN, np.float32), T.F32)
    add("output.weight", dense(VOCAB, HIDDEN), T.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
