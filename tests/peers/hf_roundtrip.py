"""Round trip check: transformers loads a folder tightfit exported and gives
the logits tightfit computed (DIR/expected.safetensors: tokens, logits).
Exits 1 when the largest absolute logit difference exceeds 1e-4, or when the
folder lacks a weight the model has or holds one it does not (transformers
would initialize the one at random and drop the other, silently).

usage: hf_roundtrip.py DIR
"""
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

folder = sys.argv[1]
expected = load_file(f"{folder}/expected.safetensors")
model, info = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                   output_loading_info=True)
model.eval()
for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
    if info.get(kind):
        print(f"{kind}: {sorted(map(str, info[kind]))[:8]}")
        sys.exit(1)
with torch.no_grad():
    logits = model(expected["tokens"]).logits
err = (logits - expected["logits"]).abs().max().item()
print(f"{model.config.model_type}: max |logit difference| = {err:.3e}")
sys.exit(0 if err <= 1e-4 else 1)
