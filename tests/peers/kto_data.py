"""Reference for the KTO data test: TRL 0.24's KTOTrainer prepares each
dataset (maybe_extract_prompt, maybe_unpair_preference_dataset,
maybe_apply_chat_template, _tokenize, _process_tokens and the KL rows of
_get_kl_dataset in chunks of per_device_train_batch_size = 3), and the ids,
labels and KL ids it trains on are written beside the rows tightfit reads.

Writes OUT/tokenizer.json, OUT/tokenizer_config.json (dpo_data.py's),
OUT/<dataset>.jsonl and OUT/kto_expected.json: {dataset: {config name:
{"options", "rows": [{completion_input_ids, completion_labels,
KL_completion_input_ids, KL_completion_labels, label}]} or {"options",
"error": TRL's message}}}.
usage: kto_data.py OUT_DIR
"""
import json
import logging
import pathlib
import sys
import tempfile

import os

import torch
from datasets import Dataset, disable_progress_bars
from transformers import LlamaConfig, LlamaForCausalLM

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from trl import KTOConfig, KTOTrainer  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from dpo_data import ROWS, USER, make_tokenizer  # noqa: E402

CHUNK = 3
DATASETS = {
    "text_unpaired": [
        {"prompt": "The sky is", "completion": " blue", "label": True},
        {"prompt": "Write a haiku about memory.\n", "completion": "Weights on the disk 🙂\nstreamed in",
         "label": False},
        {"prompt": "日本語 is", "completion": " a layer of the disk", "label": True},
        {"prompt": "the weather in Paris is " * 4, "completion": "cold and the GPU is hot " * 3, "label": False},
        {"prompt": "hello", "completion": "", "label": True},
    ],
    "chat_unpaired": [
        {"prompt": [{"role": USER, "content": "What color is the sky?"}],
         "completion": [{"role": "assistant", "content": "It is blue."}], "label": True},
        {"prompt": [{"role": "system", "content": "Be terse."}, {"role": USER, "content": "2+2?"}],
         "completion": [{"role": "assistant", "content": "five, I think, or maybe 17"}], "label": False},
        {"prompt": [{"role": USER, "content": "Name a colour."}, {"role": "assistant", "content": "My answer:"}],
         "completion": [{"role": "assistant", "content": " blue"}], "label": True},
        {"prompt": [{"role": USER, "content": "Where is the sun?"}],
         "completion": [{"role": "assistant", "content": "In the sea."}], "label": False},
    ],
    # (A dataset's rows share their columns: explicit and implicit prompts apart.)
    "text_pairs": ROWS[:2] + [{"prompt": "日本語", "chosen": " is a layer", "rejected": " is the disk"}],
    "implicit_pairs": ROWS[2:4],
    "chat_pairs": ROWS[4:8],
}

CONFIGS = {
    "defaults": {},
    "short_keep_end": {"max_prompt_length": 4, "max_length": 12, "truncation_mode": "keep_end"},
    "short_keep_start": {"max_prompt_length": 3, "max_length": 9, "truncation_mode": "keep_start"},
}

KEYS = ("completion_input_ids", "completion_labels", "KL_completion_input_ids", "KL_completion_labels", "label")


def main(out: pathlib.Path) -> None:
    logging.disable(logging.WARNING)
    disable_progress_bars()
    tok = make_tokenizer(out)
    torch.manual_seed(0)
    def tiny():
        return LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                            num_hidden_layers=1, num_attention_heads=2))
    model, ref_model = tiny(), tiny()
    expected = {}
    for name, rows in DATASETS.items():
        with open(out / f"{name}.jsonl", "w") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        expected[name] = {}
        for config, options in CONFIGS.items():
            with tempfile.TemporaryDirectory() as tmp:
                args = KTOConfig(output_dir=tmp, report_to="none", bf16=False, use_cpu=True, dataset_num_proc=None,
                                 per_device_train_batch_size=CHUNK, **options)
                result = {"options": {"max_prompt_length": args.max_prompt_length, "max_length": args.max_length,
                                      "keep_end": args.truncation_mode == "keep_end"}}
                try:
                    trainer = KTOTrainer(model=model, ref_model=ref_model, args=args,
                                         train_dataset=Dataset.from_list(rows), processing_class=tok)
                    result["rows"] = [{k: r[k] for k in KEYS} for r in trainer.train_dataset]
                except (ValueError, TypeError) as e:
                    result["error"] = str(e)
                expected[name][config] = result
    (out / "kto_expected.json").write_text(json.dumps(expected))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
