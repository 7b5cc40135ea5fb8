"""Reference for the completion-mask test: TRL's SFTTrainer (completion-only
loss) prepares the rows, and its input_ids and completion_mask are written
beside the rows tightfit formats itself.

Rows: plain prompt/completion (TRL appends EOS and masks the prompt with the
tokenizer's BOS), conversational prompt/completion, Alpaca rows (tightfit
reads them as a user turn and an answer, so TRL is given that conversation),
and single-answer conversations (tightfit's "messages" rows; TRL is given the
same as prompt = the turns before the answer, completion = the answer).

Writes OUT/tokenizer.json, OUT/tokenizer_config.json, OUT/rows.jsonl and
OUT/expected.json ([{"input_ids", "completion_mask"}], one per row).
usage: trl_parity.py OUT_DIR
"""
import json
import logging
import pathlib
import sys
import tempfile

from datasets import Dataset, disable_progress_bars
from tokenizers import processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from chat_template_parity import tokenizer  # noqa: E402
from chat_templates import CHATML  # noqa: E402

PLAIN = [{"prompt": "Translate to French: cheese", "completion": " fromage"},
         {"prompt": "2+2=", "completion": "4</s>"},
         {"prompt": "Write a haiku about memory.\n", "completion": "Weights on the disk 🙂\nstreamed in"},
         {"prompt": "  leading spaces", "completion": "\n\ttabbed answer"}]
SPLIT_WORDS = [{"prompt": "The weat", "completion": "her is fine"},
               {"prompt": "It stre", "completion": "amed in"},
               {"prompt": "The memory bud", "completion": "get is eight"}]
CONVERSATIONAL = [{"prompt": [{"role": "user", "content": "Hello!"}],
                   "completion": [{"role": "assistant", "content": "Hi, how can I help?"}]},
                  {"prompt": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}],
                   "completion": [{"role": "assistant", "content": "4"}]}]
ALPACA = [{"instruction": "Name a colour.", "input": "", "output": "Blue."},
          {"instruction": "Add the numbers.", "input": "3 and 4", "output": "7"}]
MESSAGES = [{"messages": [{"role": "user", "content": "What is GQA?"},
                          {"role": "assistant", "content": "Grouped-query attention."}]},
            {"messages": [{"role": "system", "content": "You explain."}, {"role": "user", "content": "Why?"},
                          {"role": "assistant", "content": "Because.\nReally."}]}]


def alpaca_as_trl(row):
    user = row["instruction"] + ("\n\n" + row["input"] if row["input"] else "")
    return {"prompt": [{"role": "user", "content": user}],
            "completion": [{"role": "assistant", "content": row["output"]}]}


def messages_as_trl(row):
    return {"prompt": row["messages"][:-1], "completion": row["messages"][-1:]}


def prepare(tok, model, rows):
    with tempfile.TemporaryDirectory() as tmp:
        args = SFTConfig(output_dir=tmp, report_to="none", max_length=None, packing=False,
                         completion_only_loss=True, dataset_num_proc=None, bf16=False, use_cpu=True)
        trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
        return [{"input_ids": r["input_ids"], "completion_mask": r["completion_mask"]} for r in trainer.train_dataset]


def main(out: pathlib.Path) -> None:
    logging.disable(logging.WARNING)
    disable_progress_bars()
    tok = tokenizer(out)
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.convert_tokens_to_ids("<s>"))])
    tok.backend_tokenizer.save(str(out / "tokenizer.json"))
    tok = PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"), bos_token="<s>", eos_token="</s>",
                                  pad_token="</s>")
    tok.chat_template = CHATML
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}, "pad_token": "</s>",
         "chat_template": CHATML, "tokenizer_class": "PreTrainedTokenizerFast"}))
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2))
    expected = prepare(tok, model, PLAIN)
    expected += prepare(tok, model, CONVERSATIONAL)
    expected += prepare(tok, model, [alpaca_as_trl(r) for r in ALPACA])
    expected += prepare(tok, model, [messages_as_trl(r) for r in MESSAGES])
    with open(out / "rows.jsonl", "w") as f:
        for row in PLAIN + CONVERSATIONAL + ALPACA + MESSAGES:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    (out / "expected.json").write_text(json.dumps(expected))

    # The same tokenizer as a LlamaTokenizerFast with add_bos_token = false:
    # its class rebuilds the post-processor, so no row gets a BOS. The last
    # rows' prompts end inside a word their completions finish, so their
    # tokenized prompt is not a prefix of the whole row's tokens.
    nobos = out / "nobos"
    nobos.mkdir(exist_ok=True)
    (nobos / "tokenizer.json").write_text((out / "tokenizer.json").read_text())
    (nobos / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "</s>", "unk_token": "<unk>",
         "tokenizer_class": "LlamaTokenizerFast", "add_bos_token": False, "add_eos_token": False}))
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(nobos))
    assert type(tok).__name__ == "LlamaTokenizerFast", type(tok)
    rows = PLAIN + SPLIT_WORDS
    with open(nobos / "rows.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    (nobos / "expected.json").write_text(json.dumps(prepare(tok, model, rows)))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
