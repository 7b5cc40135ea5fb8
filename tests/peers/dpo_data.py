"""Reference for the preference-data test: TRL's DPOTrainer prepares the
rows (maybe_extract_prompt, maybe_apply_chat_template, tokenize_row) and its
concatenated_forward cuts each side to max_length; the prompt, chosen and
rejected ids and the sequences the model is given are written beside the
rows tightfit reads itself. Then the same rows as TRL's CPOTrainer tokenizes
them (prompt + answer together, BOS, its truncation; ORPOTrainer's
tokenize_row is the same code).

Writes OUT/tokenizer.json, OUT/tokenizer_config.json, OUT/rows.jsonl,
OUT/expected.json: {config name: {"options", "pairs": [{prompt_input_ids,
chosen_input_ids, rejected_input_ids}], "sequences": [[chosen ids, rejected
ids]]}}, and OUT/expected_joint.json: {config name: {"options", "rows":
[{chosen_input_ids, chosen_labels, rejected_input_ids, rejected_labels} or
{"error": TRL's message}]}}.
usage: dpo_data.py OUT_DIR
"""
import json
import logging
import pathlib
import sys
import tempfile

import torch
from datasets import Dataset, disable_progress_bars
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import CPOConfig, CPOTrainer, DPOConfig, DPOTrainer

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from chat_template_parity import tokenizer  # noqa: E402
from chat_templates import CHATML  # noqa: E402

USER = "user"
ROWS = [
    # text, explicit prompt
    {"prompt": "The sky is", "chosen": " blue", "rejected": " green"},
    {"prompt": "Write a haiku about memory.\n", "chosen": "Weights on the disk 🙂\nstreamed in",
     "rejected": "no"},
    # text, implicit prompt (a space before the first difference goes to the completions)
    {"chosen": "the weather in Paris is fine", "rejected": "the weather in Paris is cold"},
    {"chosen": "日本語 is a layer", "rejected": "日本語 is the disk"},
    # conversational, explicit prompt
    {"prompt": [{"role": USER, "content": "What color is the sky?"}],
     "chosen": [{"role": "assistant", "content": "It is blue."}],
     "rejected": [{"role": "assistant", "content": "It is green."}]},
    {"prompt": [{"role": "system", "content": "Be terse."}, {"role": USER, "content": "2+2?"}],
     "chosen": [{"role": "assistant", "content": "4"}],
     "rejected": [{"role": "assistant", "content": "five, I think, or maybe 17"}]},
    # conversational, implicit prompt
    {"chosen": [{"role": USER, "content": "Where is the sun?"}, {"role": "assistant", "content": "In the sky."}],
     "rejected": [{"role": USER, "content": "Where is the sun?"}, {"role": "assistant", "content": "In the sea."}]},
    # a prompt ending with an assistant message: continued
    {"prompt": [{"role": USER, "content": "Name a colour."}, {"role": "assistant", "content": "My answer:"}],
     "chosen": [{"role": "assistant", "content": " blue"}],
     "rejected": [{"role": "assistant", "content": " a haiku"}]},
    # a text prompt with conversational answers: the prompt is taken from them
    {"prompt": "ignored", "chosen": [{"role": USER, "content": "hello"}, {"role": "assistant", "content": "hi"}],
     "rejected": [{"role": USER, "content": "hello"}, {"role": "assistant", "content": "go away"}]},
]

CONFIGS = {
    "defaults": {},
    "short_keep_end": {"max_prompt_length": 6, "max_completion_length": 7, "max_length": 10,
                       "truncation_mode": "keep_end"},
    "short_keep_start": {"max_prompt_length": 20, "max_completion_length": None, "max_length": 9,
                         "truncation_mode": "keep_start"},
}

JOINT_CONFIGS = {
    "cpo_defaults": {},
    "cpo_short_keep_end": {"max_prompt_length": 5, "max_length": 12, "truncation_mode": "keep_end"},
    "cpo_short_keep_start": {"max_prompt_length": 4, "max_length": 10, "truncation_mode": "keep_start"},
}


def run_joint(tok, model, options):
    rows = []
    for row in ROWS:
        with tempfile.TemporaryDirectory() as tmp:
            args = CPOConfig(output_dir=tmp, report_to="none", bf16=False, use_cpu=True,
                             per_device_train_batch_size=1, dataset_num_proc=None, **options)
            try:
                trainer = CPOTrainer(model=model, args=args, train_dataset=Dataset.from_list([row]),
                                     processing_class=tok)
            except ValueError as e:
                rows.append({"error": str(e)})
                continue
            r = trainer.train_dataset[0]
            rows.append({k: r[k] for k in ("chosen_input_ids", "chosen_labels", "rejected_input_ids",
                                           "rejected_labels")})
    return {"rows": rows}


def run(tok, model, options):
    """Each row in its own dataset: a column cannot mix text and messages."""
    pairs, sequences = [], []
    for row in ROWS:
        with tempfile.TemporaryDirectory() as tmp:
            args = DPOConfig(output_dir=tmp, report_to="none", bf16=False, use_cpu=True,
                             per_device_train_batch_size=1, dataset_num_proc=None, **options)
            trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list([row]),
                                 processing_class=tok)
            r = trainer.train_dataset[0]
            pair = {k: r[k] for k in ("prompt_input_ids", "chosen_input_ids", "rejected_input_ids")}
            pairs.append(pair)
            seen = []
            real_forward = model.forward

            def recording_forward(input_ids, attention_mask=None, **kw):
                seen.append([ids[m.bool()].tolist() for ids, m in zip(input_ids, attention_mask)])
                return real_forward(input_ids, attention_mask=attention_mask, **kw)

            model.forward = recording_forward
            with torch.no_grad():
                trainer.concatenated_forward(model, trainer.data_collator([pair]))
            model.forward = real_forward
            sequences.append(seen.pop())
    return {"pairs": pairs, "sequences": sequences}


def make_tokenizer(out: pathlib.Path) -> PreTrainedTokenizerFast:
    """The test tokenizer (BPE, ChatML template, <s> and </s>), written to OUT."""
    tokenizer(out)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"), bos_token="<s>", eos_token="</s>",
                                  pad_token="</s>")
    tok.chat_template = CHATML
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "</s>", "chat_template": CHATML,
         "tokenizer_class": "PreTrainedTokenizerFast"}))
    return tok


def main(out: pathlib.Path) -> None:
    logging.disable(logging.WARNING)
    disable_progress_bars()
    tok = make_tokenizer(out)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2))
    expected = {}
    for name, options in CONFIGS.items():
        args = DPOConfig(output_dir=str(out / "unused"), bf16=False, use_cpu=True, **options)
        expected[name] = {"options": {"max_prompt_length": args.max_prompt_length or 0,
                                      "max_completion_length": args.max_completion_length or 0,
                                      "max_length": args.max_length or 0,
                                      "keep_end": args.truncation_mode == "keep_end"},
                          **run(tok, model, options)}
    joint = {}
    for name, options in JOINT_CONFIGS.items():
        args = CPOConfig(output_dir=str(out / "unused"), bf16=False, use_cpu=True, **options)
        joint[name] = {"options": {"max_prompt_length": args.max_prompt_length, "max_completion_length": 0,
                                   "max_length": args.max_length,
                                   "keep_end": args.truncation_mode == "keep_end"},
                       **run_joint(tok, model, options)}
    (out / "expected_joint.json").write_text(json.dumps(joint))
    with open(out / "rows.jsonl", "w") as f:
        for row in ROWS:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    (out / "expected.json").write_text(json.dumps(expected))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
