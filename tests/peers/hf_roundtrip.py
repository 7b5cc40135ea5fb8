"""Round trip check: transformers loads a folder tightfit exported and gives
the logits tightfit computed (DIR/expected.safetensors: tokens, logits).
Exits 1 when the largest absolute logit difference exceeds 1e-4.

usage: hf_roundtrip.py DIR
"""
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

folder = sys.argv[1]
expected = load_file(f"{folder}/expected.safetensors")
model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
with torch.no_grad():
    logits = model(expected["tokens"]).logits
err = (logits - expected["logits"]).abs().max().item()
print(f"{model.config.model_type}: max |logit difference| = {err:.3e}")
sys.exit(0 if err <= 1e-4 else 1)
