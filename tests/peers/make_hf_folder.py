"""A small Hugging Face model folder as a user downloads one: a Qwen2 (q/k/v
biases, untied head) on random weights saved by save_pretrained, with a
byte-level BPE tokenizer, its tokenizer_config.json (special tokens and a
ChatML chat template) and generation_config.json; and a chat JSONL file.
Then (check mode) loads what tightfit exported and checks transformers reads
it: the model, its logits against tightfit's, and the tokenizer's template.

usage: make_hf_folder.py make MODEL_DIR DATA_FILE
       make_hf_folder.py check EXPORTED_DIR
"""
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))


def make(model_dir: pathlib.Path, data_file: pathlib.Path) -> None:
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM
    from chat_template_parity import tokenizer
    from chat_templates import CHATML
    model_dir.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(model_dir)
    tok.chat_template = CHATML
    tok.pad_token = "</s>"
    tok.save_pretrained(str(model_dir))
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(str(model_dir), safe_serialization=True, max_shard_size="100KB")
    GenerationConfig(eos_token_id=[tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")],
                     max_new_tokens=32).save_pretrained(str(model_dir))
    with open(data_file, "w") as f:
        for i in range(48):
            f.write(json.dumps({"messages": [
                {"role": "user", "content": f"What is {i} plus one?"},
                {"role": "assistant", "content": f"{i} plus one is {i + 1}."}]}) + "\n")


def check(folder: pathlib.Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(str(folder))
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n"), text
    expected = load_file(str(folder / "expected.safetensors"))
    with torch.no_grad():
        logits = model(expected["tokens"]).logits
    err = (logits - expected["logits"]).abs().max().item()
    print(f"{model.config.model_type}: max |logit difference| = {err:.3e}; tokenizer and chat template load")
    sys.exit(0 if err <= 1e-4 else 1)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3]))
    else:
        check(pathlib.Path(sys.argv[2]))
