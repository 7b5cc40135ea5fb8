"""Reference for the BPE tokenizer test: byte-level BPE tokenizers built with
Hugging Face `tokenizers` (GPT-2 style and LLaMA-3 style), trained on varied
text, and the ids they give for a few thousand lines the test encodes too.

Writes OUT/{gpt2,llama3}/tokenizer.json, OUT/lines.json and OUT/{gpt2,llama3}.ids.json.
usage: bpe_parity.py OUT_DIR
"""
import json
import pathlib
import random
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")

WORDS = ["the", "memory", "budget", "Tensor", "gradient", "checkpoint", "naïve", "café", "Straße", "日本語",
         "모델", "Ωmega", "don't", "we'll", "I'M", "x86_64", "3.14159", "2026", "1234567", "🙂", "🚀🚀",
         "tab\there", "CamelCase", "snake_case", "<|end|>", "e=mc²", "naïveté", "ÆØÅ", "—dash—", "مرحبا"]


def lines(n: int) -> list:
    rng = random.Random(11)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            w = rng.choice(WORDS)
            sep = rng.choice([" ", " ", " ", "  ", "\t", "\n", "   ", ", ", ". ", "\r\n", ""])
            parts.append(w + sep)
        out.append("".join(parts))
    return out


def build(style: str, corpus: list) -> Tokenizer:
    if style == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return tok


def main(out: pathlib.Path) -> None:
    corpus = lines(3000)
    test = lines(3500)[500:] + ["", " ", "   leading", "trailing   ", "a<|endoftext|>b", "\n\n\n", "x" * 50]
    (out / "lines.json").write_text(json.dumps(test))
    for style in ("gpt2", "llama3"):
        tok = build(style, corpus)
        (out / style).mkdir(exist_ok=True)
        tok.save(str(out / style / "tokenizer.json"))
        ids = [tok.encode(line).ids for line in test]
        (out / f"{style}.ids.json").write_text(json.dumps(ids))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
