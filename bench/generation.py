"""Key/value-cache decoding against recomputing the context, side by side in
one run: `tightfit generate` on a LLaMA-shaped model (trained one step from
random weights, byte tokens) continues a 1,024-token prompt by 256 tokens, greedy, once with the
model's cache and once with --no-cache (every new token recomputes the whole
context, as generation did before the cache). The two must give the same
text; the pass mark is the speed-up.

usage: bench/generation.py [--prompt-tokens N] [--new-tokens N] [--check] [--json OUT]
"""
import argparse
import pathlib
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from tightfit_runs import TIGHTFIT, finish, report_marks  # noqa: E402

RECIPE = """[run]
name = "generation-bench"
steps = 1
eval_interval = 0
sample_tokens = 0
out_dir = "{out}"
[model]
plugin = "llama"
preset = "custom"
n_layer = 4
n_embd = 256
n_head = 4
n_kv_head = 2
intermediate_size = 688
max_positions = 2048
[data]
tokenizer = "byte"  # no weights: the byte tokenizer, said (no "auto" to resolve)
seq_len = {seq_len}
batch_size = 1
"""


def generate(recipe: pathlib.Path, prompt: str, n: int, cache: bool) -> tuple[float, bytes]:
    cmd = [str(TIGHTFIT), "generate", str(recipe), "--greedy", "-n", str(n), "--prompt", prompt]
    if not cache:
        cmd.append("--no-cache")
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True).stdout  # bytes: a random model
    return time.perf_counter() - t0, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    prompt = ("the memory budget of a checkpoint " * 64)[: args.prompt_tokens]  # byte tokens
    with tempfile.TemporaryDirectory() as d:
        recipe = pathlib.Path(d) / "recipe.toml"
        recipe.write_text(RECIPE.format(out=d, seq_len=args.prompt_tokens + args.new_tokens))
        # One training step first: `generate RECIPE` samples the run's checkpoint and refuses a
        # recipe that has none (never freshly initialized weights in a trained model's place).
        subprocess.run([str(TIGHTFIT), "run", str(recipe), "-q"], check=True, capture_output=True)
        print(f"LLaMA 4 x 256 (GQA 4:2), prompt {args.prompt_tokens} tokens, {args.new_tokens} new, greedy")
        cached_s, cached = generate(recipe, prompt, args.new_tokens, True)
        print(f"{'key/value cache':24}{cached_s:8.2f} s", flush=True)
        full_s, full = generate(recipe, prompt, args.new_tokens, False)
        print(f"{'recompute the context':24}{full_s:8.2f} s", flush=True)
    speedup = full_s / cached_s
    print(f"speed-up {speedup:.1f}x; same text: {cached == full}")
    met = report_marks([("cache >= 5x faster than recomputing, same text", speedup >= 5 and cached == full,
                         f"{speedup:.1f}x")])
    return finish(args, {"cached_s": cached_s, "recompute_s": full_s, "speedup": speedup,
                         "same_text": cached == full, "prompt_tokens": args.prompt_tokens,
                         "new_tokens": args.new_tokens}, met)


if __name__ == "__main__":
    sys.exit(main())
