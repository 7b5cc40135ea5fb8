"""Adapter format check: PEFT loads the LoRA adapter tightfit wrote onto the
base model tightfit wrote, and gives the logits tightfit computed with the
adapters (DIR/expected.safetensors: tokens, logits). The base alone must give
different logits, so the adapter is known to be applied.
Exits 1 when the largest absolute logit difference exceeds 1e-4.

With --auto, the documented way: AutoPeftModelForCausalLM.from_pretrained(DIR/adapter), the base
read from the adapter's own base_model_name_or_path (DIR/base is then not read).

usage: peft_adapter.py DIR [--auto]   (DIR/base: a model folder, DIR/adapter: the adapter)
"""
import sys

import torch
from peft import AutoPeftModelForCausalLM, PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

folder = sys.argv[1]
expected = load_file(f"{folder}/expected.safetensors")
if "--auto" in sys.argv[2:]:
    model = AutoPeftModelForCausalLM.from_pretrained(f"{folder}/adapter", attn_implementation="eager").eval()
    base = model.get_base_model()
    with torch.no_grad(), model.disable_adapter():
        base_logits = model(expected["tokens"]).logits
else:
    base = AutoModelForCausalLM.from_pretrained(f"{folder}/base", attn_implementation="eager").eval()
    with torch.no_grad():
        base_logits = base(expected["tokens"]).logits
    model = PeftModel.from_pretrained(base, f"{folder}/adapter").eval()
n_lora = sum(1 for name, _ in model.named_parameters() if "lora_A" in name)
with torch.no_grad():
    logits = model(expected["tokens"]).logits
err = (logits - expected["logits"]).abs().max().item()
base_err = (base_logits - expected["logits"]).abs().max().item()
print(f"{base.config.model_type}: {n_lora} LoRA modules; max |logit difference| = {err:.3e} "
      f"(base alone: {base_err:.3e})")
sys.exit(0 if err <= 1e-4 and base_err > 1e-3 else 1)
