"""Reference for the scorer_model reward: a seeded 2-layer
LlamaForSequenceClassification (2 labels) on the tokenizer in OUT/tokenizer,
saved as OUT/scorer (safetensors, config.json, the tokenizer's files), and —
when OUT/texts.json exists — its scores as TRL 0.24's GRPOTrainer computes
a reward model's: conversational rows through the reward tokenizer's chat
template (trl.data_utils.apply_chat_template), then tokenizer(texts,
padding=True, padding_side="right", add_special_tokens=False), the pad token
its EOS when it has none (also the model's pad_token_id), and
model(**inputs).logits[:, label].

Reads OUT/texts.json: {"texts": [str], "messages": [[{role, content}]]}.
Writes OUT/expected.json: {"texts": [[label 0, label 1] per text],
"messages": [[label 0, label 1] per conversation]}.
usage: scorer_model.py OUT
"""
import json
import pathlib
import shutil
import sys

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, LlamaConfig, \
    LlamaForSequenceClassification
from trl.data_utils import apply_chat_template


def make(out: pathlib.Path) -> None:
    folder = out / "scorer"
    if folder.exists():
        return
    folder.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(out / "tokenizer" / f, folder / f)
    tok = AutoTokenizer.from_pretrained(str(folder))
    torch.manual_seed(5)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                      num_labels=2, tie_word_embeddings=False)
    model = LlamaForSequenceClassification(cfg)
    with torch.no_grad():
        model.score.weight.mul_(40.0)  # scores of order one, not hundredths
    model.save_pretrained(str(folder), safe_serialization=True)


def score(folder: pathlib.Path, texts):
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder), torch_dtype=torch.float32)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.config.pad_token_id = tok.pad_token_id
    inputs = tok(text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    with torch.inference_mode():
        return model(**inputs).logits.tolist()


def main(out: pathlib.Path) -> None:
    make(out)
    asked = out / "texts.json"
    if not asked.exists():
        return
    j = json.loads(asked.read_text())
    folder = out / "scorer"
    tok = AutoTokenizer.from_pretrained(str(folder))
    rendered = [apply_chat_template({"messages": m}, tok)["text"] for m in j["messages"]]
    (out / "expected.json").write_text(json.dumps({
        "texts": score(folder, j["texts"]),
        "messages": score(folder, rendered),
        "rendered": rendered,
    }))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
