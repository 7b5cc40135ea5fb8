"""Reference for the GPT-2 parity test: Hugging Face transformers' GPT-2 on
random weights. Writes OUT/model.safetensors (the weights, Hugging Face names)
and OUT/reference.safetensors (tokens, targets, logits, loss, gradients).

usage: gpt2_parity.py OUT_DIR
"""
import pathlib
import sys

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel


def main(out: pathlib.Path) -> None:
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=256, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     activation_function="gelu_new", layer_norm_epsilon=1e-5)
    model = GPT2LMHeadModel(cfg)
    model.config._attn_implementation = "eager"
    model.train()
    with torch.no_grad():  # make norms and biases non-trivial
        for name, p in model.named_parameters():
            if "ln_" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    params = dict(model.named_parameters())  # tied lm_head.weight is listed once, as wte
    save_file({k: v.detach().contiguous() for k, v in params.items()}, str(out / "model.safetensors"))

    tokens = torch.randint(0, 256, (2, 16))
    targets = torch.randint(0, 256, (2, 16))
    logits = model(tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1))
    loss.backward()
    ref = {"tokens": tokens, "targets": targets, "logits": logits.detach().contiguous(),
           "loss": loss.detach().reshape(1)}
    for k, p in params.items():
        ref["grad." + k] = p.grad.contiguous()
    save_file(ref, str(out / "reference.safetensors"))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
