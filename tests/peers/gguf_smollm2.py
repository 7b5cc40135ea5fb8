"""The real SmolLM2-135M-Instruct GGUF (scripts/setup's .cache/models), as
ggml's gguf package reads it, for test_gguf: a few tensors of each of its
types (Q8_0, Q4_1, F32) dequantized, and what the metadata holds.

  gguf_smollm2.py FILE.gguf OUT
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

import gguf

r = gguf.GGUFReader(sys.argv[1])
out = Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
names = ["token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight", "blk.0.attn_norm.weight",
         "output_norm.weight"]
tensors = {t.name: t for t in r.tensors}
expected = {}
for n in names:
    t = tensors[n]
    expected[n] = torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)))
save_file(expected, str(out / "smollm2_expected.safetensors"))
f = r.fields
summary = {
    "tensor_count": len(r.tensors),
    "types": {t.name: t.tensor_type.name for t in r.tensors},
    "tokens": len(f["tokenizer.ggml.tokens"].data),
    "token_1000": f["tokenizer.ggml.tokens"].contents(1000),
    "merges": len(f["tokenizer.ggml.merges"].data),
    "merge_0": f["tokenizer.ggml.merges"].contents(0),
    "chat_template": f["tokenizer.chat_template"].contents(),
    "block_count": f["llama.block_count"].contents(),
    "rope_freq_base": f["llama.rope.freq_base"].contents(),
    "data_offset": int(r.data_offset),
}
(out / "smollm2.json").write_text(json.dumps(summary, ensure_ascii=False))

# transformers' GGUF loader: the config and the model's tensors (dequantized,
# llama's q/k permutation undone) under Hugging Face names.
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

folder, name = str(Path(sys.argv[1]).parent), Path(sys.argv[1]).name
config = AutoConfig.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
state = model.state_dict()
hf_names = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
            "model.layers.29.self_attn.k_proj.weight", "model.layers.29.mlp.down_proj.weight",
            "model.layers.3.post_attention_layernorm.weight", "model.norm.weight"]
save_file({n: state[n].contiguous() for n in hf_names}, str(out / "smollm2_hf.safetensors"))
(out / "smollm2_config.json").write_text(config.to_json_string(use_diff=False))

# The tokenizer. transformers' GGUF converter builds a byte-level BPE with
# GPT-2's split only (it drops the "smollm" pre-tokenizer's digit split, and
# makes <|im_start|> both BOS and EOS); the original SmolLM2 tokenizer.json,
# which llama.cpp's "smollm" pre-tokenizer reproduces, splits digits one by
# one first. Both on the test lines, no special tokens added (SmolLM2 adds none).
sys.path.insert(0, str(Path(__file__).parent))
import unicodedata  # noqa: E402

from bpe_parity import HARD, lines  # noqa: E402
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

test_lines = lines(300) + HARD + ["<|im_start|>user\nWhat is 12*34?<|im_end|>\n"]
hf_tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
tokens = [str(t) for t in f["tokenizer.ggml.tokens"].contents()]
merges = [tuple(m.split(" ", 1)) for m in f["tokenizer.ggml.merges"].contents()]
types = f["tokenizer.ggml.token_type"].contents()
original = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
original.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                  pre_tokenizers.ByteLevel(add_prefix_space=False)])
original.decoder = decoders.ByteLevel()
original.add_special_tokens([AddedToken(t, special=True, normalized=False)
                             for t, ty in zip(tokens, types) if ty == 3])
messages = [{"role": "user", "content": "What is the capital of France?"}]
chat = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
prompt_ids = original.encode(chat).ids
with torch.no_grad():
    ids = torch.tensor([prompt_ids])
    logits = model(ids).logits[0, -1]
    new = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=10, min_new_tokens=10, eos_token_id=None, pad_token_id=2)
(out / "smollm2_tokenizer.json").write_text(json.dumps({
    "lines": test_lines,
    "transformers": [hf_tok(t, add_special_tokens=False)["input_ids"] for t in test_lines],
    "original": [original.encode(t).ids for t in test_lines],
    "has_number": [any(unicodedata.category(c).startswith("N") for c in t) for t in test_lines],
    "chat": chat, "messages": messages, "prompt_ids": prompt_ids,
    "new_ids": new[0, len(prompt_ids):].tolist()}, ensure_ascii=False))
# The same logits in float64: the exact answer both float32 runs are measured
# against (30 layers of float32 differ by summation order, CPU to CPU).
with torch.no_grad():
    exact = model.double()(ids).logits[0, -1]
save_file({"logits": logits.contiguous(), "exact": exact.contiguous()},
          str(out / "smollm2_logits.safetensors"))
