"""Reference for the DPO schedule test: TRL 0.24's DPOTrainer on the base
model tightfit exported with its LoRA adapter loaded by PEFT (the reference
model is the base with the adapter disabled, as TRL does for a PeftModel),
all rows of OUT/rows.jsonl in one batch. Or, when OUT/policy is there, a full
fine-tune: the policy is OUT/policy and the reference model OUT/base (the
weights before the first update, as TRL's copy of the model it starts from).

Reads OUT/base (transformers folder), OUT/adapter (PEFT) or OUT/policy, OUT/tokenizer
(tokenizer.json, tokenizer_config.json), OUT/rows.jsonl, OUT/options.json
({"loss_type", "beta", "label_smoothing", "max_length"}). Writes
OUT/expected.safetensors: the loss, the policy's and the reference's
log-probabilities per row ("policy_chosen", "policy_rejected", "ref_chosen",
"ref_rejected", in the rows' order), the metrics TRL logs ("metric.<name>")
and every adapter gradient ("grad.<PEFT key>", as adapter_model.safetensors
names the weight).
usage: dpo_parity.py OUT
"""
import json
import logging
import pathlib
import sys
import tempfile

import torch
from datasets import Dataset, disable_progress_bars
from peft import PeftModel
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from trl import DPOConfig, DPOTrainer


def config(out, options, tmp):
    return DPOConfig(output_dir=tmp, report_to="none", bf16=False, use_cpu=True, dataset_num_proc=None,
                     per_device_train_batch_size=1, loss_type=[options["loss_type"]], beta=options["beta"],
                     label_smoothing=options["label_smoothing"], max_length=options["max_length"])


def main(out: pathlib.Path) -> None:
    logging.disable(logging.WARNING)
    disable_progress_bars()
    torch.use_deterministic_algorithms(True)
    options = json.loads((out / "options.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines() if line.strip()]
    # Each row tokenized on its own (a dataset column cannot mix text and
    # messages), by a throwaway model's trainer: tokenizing needs no weights.
    dummy = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=8, intermediate_size=16,
                                         num_hidden_layers=1, num_attention_heads=2))
    pairs = []
    for row in rows:
        with tempfile.TemporaryDirectory() as tmp:
            t = DPOTrainer(model=dummy, args=config(out, options, tmp), train_dataset=Dataset.from_list([row]),
                           processing_class=tok)
            r = t.train_dataset[0]
            pairs.append({k: r[k] for k in ("prompt_input_ids", "chosen_input_ids", "rejected_input_ids")})

    base = AutoModelForCausalLM.from_pretrained(str(out / "base"), torch_dtype=torch.float32)
    peft = not (out / "policy").exists()
    if peft:
        model, ref_model = PeftModel.from_pretrained(base, str(out / "adapter"), is_trainable=True), None
    else:
        model = AutoModelForCausalLM.from_pretrained(str(out / "policy"), torch_dtype=torch.float32)
        ref_model = base
    with tempfile.TemporaryDirectory() as tmp:
        trainer = DPOTrainer(model=model, ref_model=ref_model, args=config(out, options, tmp),
                             train_dataset=Dataset.from_list([rows[0]]), processing_class=tok)
        batch = trainer.data_collator(pairs)
        model.train()
        model.zero_grad()
        loss, metrics = trainer.get_batch_loss_metrics(model, batch)
        loss.backward()
        with torch.no_grad():
            policy = trainer.concatenated_forward(model, batch)
            ref_c, ref_r = trainer.compute_ref_log_probs(batch)
    tensors = {"loss": loss.detach().reshape(1),
               "policy_chosen": policy["chosen_logps"], "policy_rejected": policy["rejected_logps"],
               "ref_chosen": ref_c, "ref_rejected": ref_r}
    for name, value in metrics.items():
        tensors["metric." + name] = torch.tensor([float(value)])
    for name, p in model.named_parameters():
        if p.requires_grad:
            tensors["grad." + (name.replace(".default", "") if peft else name)] = p.grad.detach().clone()
    save_file({k: v.contiguous().float() for k, v in tensors.items()}, str(out / "expected.safetensors"))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
