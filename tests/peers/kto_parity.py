"""Reference for the kto schedule test: TRL 0.24's KTOTrainer on the base
model tightfit exported with its LoRA adapter loaded by PEFT (the reference
is the base with the adapter disabled), or, when OUT/policy is there, a full
fine-tune whose reference model is OUT/base. All rows of OUT/rows.jsonl
make one batch (per_device_train_batch_size = their number, so the KL rows
shift within it).

Reads OUT/base, OUT/adapter or OUT/policy, OUT/tokenizer, OUT/rows.jsonl,
OUT/options.json (KTOConfig's loss_type, beta, desirable_weight,
undesirable_weight, max_length, max_prompt_length). Writes
OUT/expected.safetensors: the loss, the policy's completion and KL
log-probabilities ("policy", "policy_KL" unless apo_zero_unpaired, in the rows' order), the metrics
as TRL logs them ("metric.<name>": sums over counts, margins, kl) and every
trained gradient ("grad.<name>", PEFT's or transformers' names).
usage: kto_parity.py OUT
"""
import json
import logging
import os
import pathlib
import sys
import tempfile

import torch
from datasets import Dataset, disable_progress_bars
from peft import PeftModel
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from trl import KTOConfig, KTOTrainer  # noqa: E402


def main(out: pathlib.Path) -> None:
    logging.disable(logging.WARNING)
    disable_progress_bars()
    torch.use_deterministic_algorithms(True)
    options = json.loads((out / "options.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines() if line.strip()]
    base = AutoModelForCausalLM.from_pretrained(str(out / "base"), torch_dtype=torch.float32)
    peft = not (out / "policy").exists()
    if peft:
        model, ref_model = PeftModel.from_pretrained(base, str(out / "adapter"), is_trainable=True), None
    else:
        model = AutoModelForCausalLM.from_pretrained(str(out / "policy"), torch_dtype=torch.float32)
        ref_model = base
    with tempfile.TemporaryDirectory() as tmp:
        args = KTOConfig(output_dir=tmp, report_to="none", bf16=False, use_cpu=True, dataset_num_proc=None,
                         per_device_train_batch_size=len(rows), remove_unused_columns=False, **options)
        trainer = KTOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=tok)
        batch = next(iter(trainer.get_train_dataloader()))
        model.train()
        model.zero_grad()
        loss, metrics = trainer.get_batch_loss_metrics(model, batch)
        loss.backward()
        with torch.no_grad():
            logits = model(batch["completion_input_ids"], attention_mask=batch["completion_attention_mask"]).logits
            policy = trainer.get_batch_logps(logits, batch["completion_labels"])
            policy_kl = None
            if "KL_completion_input_ids" in batch:  # not made for apo_zero_unpaired
                kl_logits = model(batch["KL_completion_input_ids"],
                                  attention_mask=batch["KL_completion_attention_mask"]).logits
                policy_kl = trainer.get_batch_logps(kl_logits, batch["KL_completion_labels"])
    # KTOTrainer.log: each side's sums over its count, then the margins.
    logged = {"kl": metrics["kl"]}
    for side in ("chosen", "rejected"):
        if f"count/{side}" in metrics:
            for m in ("rewards", "logps"):
                logged[f"{m}/{side}"] = metrics[f"{m}/{side}_sum"] / metrics[f"count/{side}"]
    if "rewards/chosen" in logged and "rewards/rejected" in logged:
        logged["rewards/margins"] = logged["rewards/chosen"] - logged["rewards/rejected"]
    tensors = {"loss": loss.detach().reshape(1), "policy": policy}
    if policy_kl is not None:
        tensors["policy_KL"] = policy_kl
    for name, value in logged.items():
        tensors["metric." + name] = torch.tensor([float(value)])
    for name, p in model.named_parameters():
        if p.requires_grad:
            tensors["grad." + (name.replace(".default", "") if peft else name)] = p.grad.detach().clone()
    save_file({k: v.contiguous().float() for k, v in tensors.items()}, str(out / "expected.safetensors"))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
