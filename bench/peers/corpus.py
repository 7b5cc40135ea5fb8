"""The built-in corpus (Debian's fortunes) as byte tokens, as tightfit's
`builtin:fortunes` with `tokenizer = "byte"` reads it: what the Python peers
train on."""
import pathlib

import torch


def fortunes_bytes() -> torch.Tensor:
    text = b""
    for f in sorted(pathlib.Path("/usr/share/games/fortunes").iterdir()):
        if f.is_file() and not f.suffix:
            text += f.read_bytes()
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
