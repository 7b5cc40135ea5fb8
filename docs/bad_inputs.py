#!/usr/bin/env python3
"""Runs `tightfit` on bad inputs and prints, as a Markdown table, the exit
code and the message each gets (docs/reliability.md quotes its output).

usage: docs/bad_inputs.py   (after scripts/setup; uses build/bin/tightfit)
"""
import os
import shutil
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIGHTFIT = os.path.join(ROOT, "build", "bin", "tightfit")
FIXTURES = os.path.join(ROOT, "build", "test-fixtures")

BASE = """[run]
name = "b"
steps = 4
out_dir = "{out}"
sample_tokens = 0
{run}
[model]
plugin = "gpt2"
preset = "custom"
n_layer = 2
n_embd = {embd}
n_head = 2
n_positions = 64
{model}
[data]
corpus = "{corpus}"
tokenizer = "byte"
seq_len = {seq}
batch_size = 4
[save]
every = 2
{strategies}
"""


def recipe(work, name, run="", model="", corpus="builtin:fortunes", seq=32, embd=64,
           strategies="", raw=None):
    path = os.path.join(work, name + ".toml")
    with open(path, "w") as f:
        f.write(raw if raw is not None else BASE.format(
            out=os.path.join(work, "runs", name), run=run, model=model, corpus=corpus, seq=seq,
            embd=embd, strategies=strategies))
    return path


def bpe_recipe(work, name, corpus, tokenizer):
    path = recipe(work, name, corpus=corpus, seq=16)
    with open(path) as f:
        text = f.read().replace('tokenizer = "byte"', f'tokenizer = "{tokenizer}"')
    with open(path, "w") as f:
        f.write(text)
    return path


def tightfit(*args, env=None, shell_prefix=None):
    cmd = [TIGHTFIT, *args]
    if shell_prefix:
        cmd = ["sh", "-c", shell_prefix + " exec " + " ".join(cmd)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    # The error: from the last line the host starts with "tightfit" to the
    # end (the plan and the fit command follow a budget refusal).
    lines = [l for l in p.stderr.splitlines() if l.strip() and not l.startswith("[")]
    starts = [i for i, l in enumerate(lines) if l.startswith("tightfit") and " -> " not in l]
    if not starts:
        return p.returncode, "(no message)"
    return p.returncode, " ".join(l.strip() for l in lines[starts[-1]:])


def negate_second_moment(path):
    """Sets the first value of the first exp_avg_sq tensor of a safetensors file to -1."""
    import json
    import struct
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        name = next(k for k in header if k.endswith(".exp_avg_sq"))
        f.seek(8 + n + header[name]["data_offsets"][0])
        f.write(struct.pack("<f", -1.0))


def main():
    work = tempfile.mkdtemp()
    rows = []

    def case(what, rc_msg):
        rows.append((what, *rc_msg))

    with open(os.path.join(work, "empty.txt"), "w"):
        pass
    with open(os.path.join(work, "utf8.txt"), "wb") as f:
        f.write(b"caf\xc3\xa9 \xff\xfe broken bytes\n" * 200)
    case("malformed TOML", tightfit("run", recipe(work, "toml", raw="[run\nname = 1\n")))
    case("unknown key", tightfit("run", recipe(work, "key", model="n_layers = 3")))
    case("wrong type", tightfit("run", recipe(work, "type", run='log_every = "ten"')))
    case("value out of range", tightfit("run", recipe(work, "range", run="log_every = 0")))
    case("missing recipe", tightfit("run", os.path.join(work, "nothing.toml")))
    case("missing corpus file", tightfit("run", recipe(work, "corpus", corpus=work + "/no.txt")))
    case("empty corpus", tightfit("run", recipe(work, "empty", corpus=work + "/empty.txt")))
    case("sequence longer than the model allows", tightfit("run", recipe(work, "seq", seq=128)))
    case("unknown plugin", tightfit("run", recipe(work, "plugin",
                                                  strategies='[[strategy]]\nplugin = "chekpoint"')))
    case("CUDA device on a machine without one",
         tightfit("run", recipe(work, "cuda", run='device = "cuda:0"')))
    case("plugin built for ABI 2.0",
         tightfit("plugins", "check", os.path.join(FIXTURES, "fixture_abi_major.so")))
    case("plugin needing a newer ABI minor",
         tightfit("plugins", "check", os.path.join(FIXTURES, "fixture_abi_minor.so")))
    case("plugin built against another LibTorch",
         tightfit("plugins", "check", os.path.join(FIXTURES, "fixture_wrong_libtorch.so")))
    case("library that is not a plugin",
         tightfit("plugins", "check", os.path.join(FIXTURES, "fixture_no_entry.so")))
    case("pinned plugin whose file changed",
         tightfit("run", recipe(work, "pin", strategies='[[strategy]]\nplugin = "checkpoint"\n'
                                'sha256 = "' + "0" * 64 + '"')))
    dup = os.path.join(work, "dup")
    os.makedirs(dup)
    shutil.copy(os.path.join(ROOT, "build", "plugins", "libtightfit_checkpoint.so"),
                os.path.join(dup, "libtightfit_checkpoint_copy.so"))
    case("two plugins with one name",
         tightfit("run", recipe(work, "dup", run=f'plugin_paths = ["{dup}"]',
                                strategies='[[strategy]]\nplugin = "checkpoint"')))
    # Checkpoints: another shape, a damaged newest one.
    shape = recipe(work, "shape")
    tightfit("run", shape, "-q", "--stop-after", "2")
    recipe(work, "shape", embd=128)
    case("resume with a checkpoint of another shape", tightfit("run", shape, "--resume", "-q"))
    damaged = recipe(work, "damaged")
    tightfit("run", damaged, "-q")
    with open(os.path.join(work, "runs", "damaged", "b", "checkpoints", "step-00000004",
                           "model.safetensors"), "r+b") as f:
        f.truncate(100)
    p = subprocess.run([TIGHTFIT, "run", damaged, "--resume", "-q", "--set", "run.steps=6"],
                       capture_output=True, text=True)
    warn = [l for l in p.stderr.splitlines() if "cannot be used" in l]
    rows.append(("damaged newest checkpoint (truncated)", p.returncode,
                 (warn[0] if warn else "(no warning)") + " — and it resumed from the one before"))
    edited = recipe(work, "manifest")
    tightfit("run", edited, "-q", "--stop-after", "2")
    with open(os.path.join(work, "runs", "manifest", "b", "checkpoints", "manifest.json"),
              "w") as f:
        f.write('{"format": 1, "checkpoints": ["../../../elsewhere"]}')
    case("manifest naming a folder outside the checkpoints",
         tightfit("run", edited, "--resume", "-q"))
    only = recipe(work, "trainer")
    tightfit("run", only, "-q", "--stop-after", "2")
    tj = os.path.join(work, "runs", "trainer", "b", "checkpoints", "step-00000002",
                      "trainer.json")
    with open(tj) as f:
        text = f.read().replace('"world_size": 1', '"world_size": 99999999')
    with open(tj, "w") as f:
        f.write(text)
    case("edited trainer.json (a value out of range), no older checkpoint",
         tightfit("run", only, "--resume", "-q"))
    shutil.copy(os.path.join(ROOT, "fuzz", "corpus", "gguf", "k_quants.gguf"),
                os.path.join(work, "model.gguf"))
    case("a GGUF model as [model] weights with tokenizer = \"byte\"",
         tightfit("run", recipe(work, "gguf", model=f'weights = "{work}/model.gguf"')))
    case("the corpus alone over memory_budget",
         tightfit("run", recipe(work, "data", run='memory_budget = "4MiB"')))
    case("out of memory_budget",
         tightfit("run", recipe(work, "oom", run='memory_budget = "24MiB"', embd=256)))
    case("NaN loss with on_non_finite = \"stop\"",
         tightfit("run", recipe(work, "nan", run='on_non_finite = "stop"\n'
                                'debug_nan_at_steps = [1]')))
    full = recipe(work, "full", embd=128)
    tightfit("run", full, "-q", "--stop-after", "2")
    case("disk full during a save (file size limit)",
         tightfit("run", full, "--resume", "-q", shell_prefix="ulimit -f 1000; trap '' XFSZ;"))
    rc, msg = tightfit("run", recipe(work, "utf8", corpus=work + "/utf8.txt", seq=16))
    rows.append(("corpus with invalid UTF-8, byte tokenizer", rc,
                 "(trains: the byte tokenizer reads bytes, any bytes are valid)"))
    # A tokenizer.json (the fuzz seed's, less its first line: the text to encode).
    with open(os.path.join(ROOT, "fuzz", "corpus", "tokenizer", "gpt2.json")) as f:
        f.readline()
        tok = os.path.join(work, "tokenizer.json")
        with open(tok, "w") as out:
            out.write(f.read())
    case("corpus with invalid UTF-8, tokenizer.json",
         tightfit("run", bpe_recipe(work, "utf8bpe", work + "/utf8.txt", tok)))

    # Tokenizers: never a stand-in for the model's own (docs/fine-tune.md, section 5).
    case("tokenizer = \"auto\" and no [model] weights",
         tightfit("run", bpe_recipe(work, "auto", "builtin:fortunes", "auto")))
    base = recipe(work, "base")
    tightfit("run", base, "-q")
    folder = os.path.join(work, "exported")
    tightfit("export", base, "--out", folder)
    os.remove(os.path.join(folder, "tokenizer.json"))
    os.remove(os.path.join(folder, "tokenizer_config.json"))
    case("model folder without a tokenizer, tokenizer = \"auto\"",
         tightfit("generate", folder, "-p", "Hello"))
    shutil.copy(tok, os.path.join(folder, "tokenizer.json"))
    case("tokenizer = \"byte\" for weights with a tokenizer of their own",
         tightfit("run", recipe(work, "bytes", model=f'config = "{folder}"\nweights = "{folder}"')))
    os.remove(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer.model"), "wb") as f:
        # A SentencePiece ModelProto: one piece "<unk>" (type UNKNOWN), trainer_spec model_type 1.
        piece = b"\x0a\x05<unk>\x18\x02"
        f.write(b"\x0a" + bytes([len(piece)]) + piece + b"\x12\x02\x18\x01")
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        f.write('{"tokenizer_class": "LlamaTokenizer"}')
    case("SentencePiece Unigram tokenizer.model", tightfit("generate", folder, "-p", "Hello"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        f.write('{"tokenizer_class": "T5Tokenizer"}')
    case("tokenizer class tightfit does not reproduce", tightfit("generate", folder, "-p", "Hi"))
    # Commands that would otherwise use freshly initialized weights.
    fresh = recipe(work, "fresh")
    case("generate RECIPE with no checkpoint", tightfit("generate", fresh, "-p", "Hello"))
    case("export RECIPE with no checkpoint",
         tightfit("export", fresh, "--out", os.path.join(work, "out")))
    case("plugins info of a name not installed", tightfit("plugins", "info", "lorra"))
    # An optimizer state with a negative second moment, in the newest checkpoint only.
    opt = recipe(work, "opt")
    tightfit("run", opt, "-q", "--stop-after", "2")
    tightfit("run", opt, "-q", "--resume", "--stop-after", "2")
    negate_second_moment(os.path.join(work, "runs", "opt", "b", "checkpoints", "step-00000004",
                                      "optimizer.safetensors"))
    p = subprocess.run([TIGHTFIT, "run", opt, "--resume", "-q"], capture_output=True, text=True)
    warn = [l for l in p.stderr.splitlines() if "cannot be used" in l]
    rows.append(("negative second moment in the newest checkpoint's optimizer state", p.returncode,
                 (warn[0] if warn else "(no warning)") + " — and it resumed from the one before"))

    print("| bad input | exit | message |")
    print("|---|---|---|")
    for what, rc, msg in rows:
        msg = msg.replace(work, "…").replace("|", "\\|")
        print(f"| {what} | {rc} | {msg} |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
