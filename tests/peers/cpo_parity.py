"""Reference for the cpo and orpo schedule tests: TRL 0.24's CPOTrainer (or
ORPOTrainer, "trainer": "orpo" in the options) on the model tightfit exported
— with its LoRA adapter loaded by PEFT (OUT/adapter present)
or the whole model trained (no OUT/adapter) — all rows of OUT/rows.jsonl in
one batch.

Reads OUT/base (transformers folder), OUT/adapter (PEFT, optional),
OUT/tokenizer, OUT/rows.jsonl, OUT/options.json ({"trainer", and the
trainer's config: "loss_type", "beta", "label_smoothing", "cpo_alpha",
"simpo_gamma", "max_length", "max_prompt_length" for CPO; "beta",
"max_length", "max_prompt_length" for ORPO}). Writes OUT/expected.safetensors: the loss, the
policy's log-probabilities per row as the loss uses them ("policy_chosen",
"policy_rejected"), the metrics TRL logs ("metric.<name>") and every trained
parameter's gradient ("grad.<name>": PEFT's adapter key, or the
transformers parameter name).
usage: cpo_parity.py OUT
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
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from trl import CPOConfig, CPOTrainer, ORPOConfig, ORPOTrainer  # noqa: E402

TRAINERS = {"cpo": (CPOConfig, CPOTrainer), "orpo": (ORPOConfig, ORPOTrainer)}


def config(Config, options, tmp):
    return Config(output_dir=tmp, report_to="none", bf16=False, use_cpu=True, dataset_num_proc=None,
                     per_device_train_batch_size=1, **options)


def main(out: pathlib.Path) -> None:
    logging.disable(logging.WARNING)
    disable_progress_bars()
    torch.use_deterministic_algorithms(True)
    options = json.loads((out / "options.json").read_text())
    Config, Trainer = TRAINERS[options.pop("trainer", "cpo")]
    tok = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines() if line.strip()]
    # Each row tokenized on its own (a dataset column cannot mix text and
    # messages), by a throwaway model's trainer: tokenizing needs no weights.
    dummy = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=8, intermediate_size=16,
                                         num_hidden_layers=1, num_attention_heads=2))
    features = []
    for row in rows:
        with tempfile.TemporaryDirectory() as tmp:
            t = Trainer(model=dummy, args=config(Config, options, tmp), train_dataset=Dataset.from_list([row]),
                           processing_class=tok)
            r = t.train_dataset[0]
            features.append({k: v for k, v in r.items() if k.endswith(("input_ids", "attention_mask", "labels"))})

    model = AutoModelForCausalLM.from_pretrained(str(out / "base"), torch_dtype=torch.float32)
    peft = (out / "adapter").exists()
    if peft:
        model = PeftModel.from_pretrained(model, str(out / "adapter"), is_trainable=True)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(model=model, args=config(Config, options, tmp), train_dataset=Dataset.from_list([rows[0]]),
                             processing_class=tok)
        batch = trainer.data_collator(features)
        model.train()
        model.zero_grad()
        loss, metrics = trainer.get_batch_loss_metrics(model, batch)
        loss.backward()
        with torch.no_grad():
            chosen, rejected = trainer.concatenated_forward(model, batch)[:2]
    tensors = {"loss": loss.detach().reshape(1), "policy_chosen": chosen, "policy_rejected": rejected}
    for name, value in metrics.items():
        tensors["metric." + name] = torch.tensor([float(value)])
    for name, p in model.named_parameters():
        if p.requires_grad:
            key = name.replace(".default", "") if peft else name
            tensors["grad." + key] = p.grad.detach().clone()
    save_file({k: v.contiguous().float() for k, v in tensors.items()}, str(out / "expected.safetensors"))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
