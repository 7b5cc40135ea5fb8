"""Reference for the BPE tokenizer test: BPE tokenizers built with Hugging Face
`tokenizers` in each style the supported model families ship, trained on
varied text, and the ids they give (add_special_tokens=True, the library's
default) for a few thousand lines plus a corpus of hard strings.

Styles:
  gpt2      byte-level, GPT-2's regex
  llama3    Llama 3's split regex + byte level, ignore_merges, <|begin_of_text|> prepended
  qwen2     Qwen2's split regex, NFC, byte level, chat special tokens
  llama2    SentencePiece-style: Prepend/Replace normalizer, byte fallback, fused unk, <s> prepended
  mistral   SentencePiece-style with a Metaspace pre-tokenizer (prepend_scheme first), byte fallback
  nfkc      NFKC normalizer, Metaspace that splits and always prepends, unk without fallback

Writes OUT/STYLE/tokenizer.json, OUT/lines.json and OUT/STYLE.ids.json
({"vocab_size": N, "ids": [...], "decoded": [...]}).
usage: bpe_parity.py OUT_DIR
"""
import json
import pathlib
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPIECE = "\u2581"

WORDS = ["the", "memory", "budget", "Tensor", "gradient", "checkpoint", "naïve", "café", "Straße", "日本語",
         "모델", "Ωmega", "don't", "we'll", "I'M", "x86_64", "3.14159", "2026", "1234567", "🙂", "🚀🚀",
         "tab\there", "CamelCase", "snake_case", "<|end|>", "e=mc²", "naïveté", "ÆØÅ", "—dash—", "مرحبا"]

# Strings that break tokenizers: Unicode of every width, runs of spaces,
# tabs and newlines, digits, emoji, special tokens inside text, the empty string.
HARD = ["", " ", "  ", "   leading", "trailing   ", "\n\n\n", "\t\t tabs\t", " \n \n", "x" * 50,
        "12345678901234567890", "3.14159e-10", "🙂🙂🙂 emoji 👩‍👩‍👧", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math", "ꙮ rare", "\u0000nul",
        "e\u0301 combining", "é composed", "ｆｕｌｌｗｉｄｔｈ ①②", "ﬁ ligature", "Ǆ titlecase",
        "a<|endoftext|>b", "<s>inside</s> text", "<s> spaced </s>", "[INST] hi [/INST]",
        "<|im_start|>user\nhello<|im_end|>\n", "<|begin_of_text|>start", "\r\nwindows\r\n",
        "mixed\u00a0nbsp", "zero\u200bwidth", "\u2581already metaspace", "日本語のテキスト", "한국어 텍스트",
        # Added tokens that overlap, nest and need words or spaces around them (style "added").
        "abcd abc ab bcd cdab", "xabcdx abcde", "word<sw>word <sw> w<sw> <sw>w", "a  <ls>  b  <rs>  c",
        "<ls><rs><ls>", "<both>   <both>  x", "aaaaaaa <sw><sw> <sw>", "memory budget memory budgets"]


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


def byte_level(corpus, pre, model_kwargs, special):
    tok = Tokenizer(models.BPE(**model_kwargs))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=special, show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return tok


def sentencepiece(corpus, byte_fallback, unk="<unk>"):
    """A SentencePiece-style BPE: characters, not bytes, with <0xAB> tokens
    for the characters left out of the alphabet (limit_alphabet)."""
    trainer_tok = Tokenizer(models.BPE())
    trainer_tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPIECE), normalizers.Replace(" ", SPIECE)])
    trainer = trainers.BpeTrainer(vocab_size=500, limit_alphabet=60, show_progress=False)
    trainer_tok.train_from_iterator(corpus, trainer)
    trained = json.loads(trainer_tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    if byte_fallback:
        for b in range(256):
            vocab[f"<0x{b:02X}>"] = len(vocab)
    for t in sorted(trained["vocab"], key=trained["vocab"].get):
        vocab.setdefault(t, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=unk, byte_fallback=byte_fallback, fuse_unk=True))
    tok.add_special_tokens([AddedToken("<unk>", special=True, normalized=False),
                            AddedToken("<s>", special=True, normalized=False),
                            AddedToken("</s>", special=True, normalized=False)])
    return tok


def build(style: str, corpus: list) -> Tokenizer:
    if style == "gpt2":
        return byte_level(corpus, pre_tokenizers.ByteLevel(add_prefix_space=False), {}, ["<|endoftext|>"])
    if style == "llama3":
        tok = byte_level(corpus, pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), {"ignore_merges": True},
            ["<|endoftext|>", "<|begin_of_text|>"])
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
        return tok
    if style == "qwen2":
        tok = byte_level(corpus, pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), {},
            ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        tok.normalizer = normalizers.NFC()
        return tok
    if style == "llama2":
        tok = sentencepiece(corpus, byte_fallback=True)
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPIECE), normalizers.Replace(" ", SPIECE)])
        tok.decoder = decoders.Sequence([decoders.Replace(SPIECE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", 1)])
        tok.add_special_tokens([AddedToken("[INST]", special=True, normalized=False),
                                AddedToken("[/INST]", special=True, normalized=False)])
        return tok
    if style == "mistral":
        tok = sentencepiece(corpus, byte_fallback=True)
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPIECE, prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.Metaspace(replacement=SPIECE, prepend_scheme="first"),
                                         decoders.ByteFallback(), decoders.Fuse()])
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", 1)])
        tok.add_tokens([AddedToken("memory budget", normalized=True)])  # a normalized added token
        return tok
    if style == "nfkc":
        tok = sentencepiece(corpus, byte_fallback=False)
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPIECE, prepend_scheme="always", split=True)
        tok.decoder = decoders.Metaspace(replacement=SPIECE, prepend_scheme="always")
        return tok
    if style == "added":  # many added tokens: overlapping, single_word, lstrip, rstrip
        tok = byte_level(corpus, pre_tokenizers.ByteLevel(add_prefix_space=False), {}, ["<|endoftext|>"])
        tok.add_tokens([AddedToken(t, normalized=False) for t in ["ab", "abc", "bcd", "abcd", "cda", "aaa"]])
        tok.add_tokens([AddedToken("<sw>", single_word=True, normalized=False),
                        AddedToken("<ls>", lstrip=True, normalized=False),
                        AddedToken("<rs>", rstrip=True, normalized=False),
                        AddedToken("<both>", lstrip=True, rstrip=True, normalized=False),
                        AddedToken("memory budget", normalized=True)])
        return tok
    raise SystemExit(f"unknown style {style}")


STYLES = ["gpt2", "llama3", "qwen2", "llama2", "mistral", "nfkc", "added"]


def main(out: pathlib.Path) -> None:
    corpus = lines(3000)
    test = lines(3500)[500:] + HARD
    (out / "lines.json").write_text(json.dumps(test))
    for style in STYLES:
        tok = build(style, corpus)
        (out / style).mkdir(exist_ok=True)
        tok.save(str(out / style / "tokenizer.json"))
        ids = [tok.encode(line).ids for line in test]
        decoded = [tok.decode(i, skip_special_tokens=False) for i in ids]
        (out / f"{style}.ids.json").write_text(json.dumps(
            {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "ids": ids, "decoded": decoded}))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
