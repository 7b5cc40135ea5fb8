"""Reference for the tokenizer-folder test: model folders as people download
them, each with only some of the files transformers can build a tokenizer
from, and the ids transformers' AutoTokenizer gives (tokenizer(text), special
tokens added as it adds them) for the same lines bpe_parity.py uses.

Folders:
  gpt2_vm          vocab.json + merges.txt, tokenizer_class GPT2Tokenizer
  gpt2_vm_type     vocab.json + merges.txt, no tokenizer_config.json: config.json model_type gpt2
  gpt2_vm_bos      as gpt2_vm with add_bos_token and add_prefix_space
  qwen2_vm         vocab.json + merges.txt, Qwen2Tokenizer, chat tokens in added_tokens_decoder
  llama_spm        tokenizer.model (SentencePiece BPE, byte fallback), LlamaTokenizer (legacy)
  llama_spm_new    the same, legacy = false, add_eos_token = true
  llama_json_flags tokenizer.json whose post-processor adds <s>, LlamaTokenizerFast with
                   add_bos_token = false and add_eos_token = true
  llama_json_type  the same tokenizer.json, no tokenizer_config.json: config.json model_type llama
                   (LlamaTokenizerFast's defaults: BOS, no EOS)
  spm_json_first   tokenizer.json with a Metaspace pre-tokenizer (prepend_scheme "first", split
                   false, byte fallback), LlamaTokenizer with legacy = false
  unigram_spm      tokenizer.model of a SentencePiece Unigram model (tightfit refuses it)

Writes OUT/NAME/ and OUT/NAME.ids.json ({"ids": [...], "decoded": [...], "eos_token", "bos_token"}),
and OUT/lines.json.

Then small random models in four of the folders (llama_spm: a Llama-2-style tokenizer.model;
llama3: a Llama-3-style tokenizer.json whose post-processor adds <|begin_of_text|>; gpt2_vm:
vocab.json + merges.txt; llama_json_type) and transformers' greedy generation from
tokenizer(PROMPT), plain and with repetition_penalty = PENALTY: OUT/NAME.generate.json
({"prompt_ids", "new_ids", "text", "repetition_penalty", "penalised_ids", "penalised_text"}).
usage: tokenizer_folders.py OUT_DIR
"""
import json
import pathlib
import shutil
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import sentencepiece as spm  # noqa: E402
from bpe_parity import HARD, build, lines  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402


def write(path: pathlib.Path, obj) -> None:
    path.write_text(json.dumps(obj, ensure_ascii=False))


def byte_level_files(folder: pathlib.Path, tok) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tok.model.save(str(folder))  # vocab.json, merges.txt


def train_spm(folder: pathlib.Path, corpus: list, model_type: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    text = folder / "corpus.txt"
    text.write_text("\n".join(corpus))
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(folder / "tokenizer"), model_type=model_type, vocab_size=400,
        byte_fallback=True, character_coverage=0.98, hard_vocab_limit=False,
        user_defined_symbols=["<|user|>"], control_symbols=["[INST]"], minloglevel=2)
    text.unlink()
    (folder / "tokenizer.vocab").unlink()


# Where a Metaspace's "first" prepend and the special tokens meet: leading
# spaces and newlines, special and added tokens first, last and in between.
EDGES = [" leading", "  two spaces", "\nnewline first", "\n\nHello world", "Hello\n world", " \n x",
         "<s> after bos", "<s>glued", "</s>Hello", "Hello</s> world", "a </s> b", "[INST] hi </s><s> there",
         "[INST]first", " [INST] spaced", "<|user|>x", " <|user|> y", "x <|user|>", "x\n\n y", "Hello <s>",
         "<s>\n\nline", "\t<s>tab", "<unk> z", "memory budget first", "say memory budget now",
         "<s>memory budget", " memory budget", "\u2581already marked", "x\u2581y", "<s>", "<s><s>", " <s>",
         "<s> ", "Hello  <s>  world", "\u00a0nbsp first", "\r\nwindows", "</s>\n</s>", "[INST] \n[INST]"]


def main(out: pathlib.Path) -> None:
    corpus = lines(3000)
    test = lines(3500)[500:800] + HARD + ["[INST] hi <|user|> there </s><s>", "a<|endoftext|>b"] + EDGES
    write(out / "lines.json", test)

    gpt2 = build("gpt2", corpus)
    byte_level_files(out / "gpt2_vm", gpt2)
    write(out / "gpt2_vm" / "tokenizer_config.json", {"tokenizer_class": "GPT2Tokenizer"})
    byte_level_files(out / "gpt2_vm_type", gpt2)
    write(out / "gpt2_vm_type" / "config.json", {"model_type": "gpt2"})
    byte_level_files(out / "gpt2_vm_bos", gpt2)
    write(out / "gpt2_vm_bos" / "tokenizer_config.json",
          {"tokenizer_class": "GPT2Tokenizer", "add_bos_token": True, "add_prefix_space": True})

    qwen = build("qwen2", corpus)
    byte_level_files(out / "qwen2_vm", qwen)
    added = {str(qwen.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                        "single_word": False, "special": True}
             for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]}
    write(out / "qwen2_vm" / "tokenizer_config.json",
          {"tokenizer_class": "Qwen2Tokenizer", "added_tokens_decoder": added, "eos_token": "<|im_end|>",
           "pad_token": "<|endoftext|>", "bos_token": None})

    train_spm(out / "llama_spm", corpus, "bpe")
    write(out / "llama_spm" / "tokenizer_config.json", {"tokenizer_class": "LlamaTokenizer"})
    train_spm(out / "llama_spm_new", corpus, "bpe")
    write(out / "llama_spm_new" / "tokenizer_config.json",
          {"tokenizer_class": "LlamaTokenizer", "legacy": False, "add_eos_token": True})
    train_spm(out / "unigram_spm", corpus, "unigram")
    write(out / "unigram_spm" / "tokenizer_config.json", {"tokenizer_class": "LlamaTokenizer"})

    llama2 = build("llama2", corpus)
    for name, config in [("llama_json_flags", None), ("llama_json_type", None)]:
        (out / name).mkdir(exist_ok=True)
        llama2.save(str(out / name / "tokenizer.json"))
    write(out / "llama_json_flags" / "tokenizer_config.json",
          {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": False, "add_eos_token": True,
           "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
    write(out / "llama_json_type" / "config.json", {"model_type": "llama"})
    # A tokenizer.json of today's SentencePiece conversions (Metaspace, prepend_scheme "first",
    # split false, byte fallback) named LlamaTokenizer with legacy false.
    (out / "spm_json_first").mkdir(exist_ok=True)
    build("mistral", corpus).save(str(out / "spm_json_first" / "tokenizer.json"))
    write(out / "spm_json_first" / "tokenizer_config.json",
          {"tokenizer_class": "LlamaTokenizer", "legacy": False, "bos_token": "<s>", "eos_token": "</s>",
           "unk_token": "<unk>"})

    for name in ["gpt2_vm", "gpt2_vm_type", "gpt2_vm_bos", "qwen2_vm", "llama_spm", "llama_spm_new",
                 "llama_json_flags", "llama_json_type", "spm_json_first"]:
        # A copy, so that nothing transformers writes while loading lands in the folder tightfit reads.
        scratch = out / (name + ".hf")
        shutil.copytree(out / name, scratch)
        tok = AutoTokenizer.from_pretrained(str(scratch))
        ids = [tok(line)["input_ids"] for line in test]
        decoded = [tok.decode(i, skip_special_tokens=False) for i in ids]
        write(out / f"{name}.ids.json", {"ids": ids, "decoded": decoded, "eos_token": tok.eos_token,
                                         "bos_token": tok.bos_token, "vocab_size": len(tok),
                                         "class": type(tok).__name__})
        shutil.rmtree(scratch)
    models(out, corpus)


PROMPT = "The memory budget"
PENALTY = 4.0  # repetition_penalty of the second greedy generation


def models(out: pathlib.Path, corpus: list) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    llama3 = build("llama3", corpus)
    (out / "llama3").mkdir(exist_ok=True)
    llama3.save(str(out / "llama3" / "tokenizer.json"))
    write(out / "llama3" / "tokenizer_config.json",
          {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
           "eos_token": "<|endoftext|>"})
    for name in ["llama_spm", "llama3", "gpt2_vm", "llama_json_type"]:
        folder = out / name
        tok = AutoTokenizer.from_pretrained(str(folder))
        torch.manual_seed(3)
        if name == "gpt2_vm":
            cfg = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=64)
            model = GPT2LMHeadModel(cfg)
        else:
            cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                              bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
            model = LlamaForCausalLM(cfg)
        # Larger weights than the initializer's, so that greedy decoding does not repeat one token.
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(20.0 if p.dim() > 1 else 1.0)
        model.eval()  # a model made by its constructor is in training mode (dropout)
        model.save_pretrained(str(folder), safe_serialization=True)
        enc = tok(PROMPT, return_tensors="pt")
        outp = model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], do_sample=False, max_new_tokens=16, min_new_tokens=16, eos_token_id=None,
                              pad_token_id=0)
        new = outp[0, enc["input_ids"].shape[1]:].tolist()
        # The same with transformers' repetition penalty (over the prompt and the output).
        outp = model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], do_sample=False,
                              max_new_tokens=16, min_new_tokens=16, eos_token_id=None, pad_token_id=0,
                              repetition_penalty=PENALTY)
        penalised = outp[0, enc["input_ids"].shape[1]:].tolist()
        write(out / f"{name}.generate.json", {"prompt": PROMPT, "prompt_ids": enc["input_ids"][0].tolist(),
                                              "new_ids": new, "text": tok.decode(new, skip_special_tokens=False),
                                              "repetition_penalty": PENALTY, "penalised_ids": penalised,
                                              "penalised_text": tok.decode(penalised, skip_special_tokens=False)})


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
