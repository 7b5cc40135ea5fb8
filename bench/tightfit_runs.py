"""What the benchmarks share: running tightfit for a few steps (read back
from its metrics.jsonl), printing pass marks, and the --json/--check ending."""
import json
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
TIGHTFIT = ROOT / "build" / "bin" / "tightfit"


# QLoRA as the field notes set it up and the benches compare it: LoRA r16 on
# q/k/v/o over an NF4 double-quantized base, bf16 compute.
QLORA_STRATEGIES = """
[[strategy]]
plugin = "lora"
targets = ["q", "k", "v", "o"]
rank = 16
alpha = 32.0
[[strategy]]
plugin = "quantize"
format = "nf4"
double_quant = true
[[strategy]]
plugin = "precision"
mode = "autocast"
"""


def step_times(rows: list[dict]) -> list[float]:
    """Each step's seconds after the first, from a run's metrics rows."""
    return [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])]


def run_args(recipe: str, out: str, steps: int, sets: list[str], keep_budget: bool = False) -> list[str]:
    """`tightfit run` of a recipe for a few steps into `out`/m, quiet, nothing
    sampled, evaluated or saved; the recipe's memory budget off unless kept."""
    args = [str(TIGHTFIT), "run", recipe, "--quiet",
            "--set", f"run.steps={steps}", "--set", f"run.out_dir={out}", "--set", "run.name=m",
            "--set", "run.sample_tokens=0", "--set", "run.eval_batches=0",
            "--set", "save.final=false", "--set", "save.every=0", "--set", "save.hf=false"]
    if not keep_budget:
        args += ["--set", "run.memory_budget=0"]
    for s in sets:
        args += ["--set", s]
    return args


# Runs a command and prints its peak resident set in bytes (Linux: ru_maxrss
# in KiB): the child's alone, as the parent wrapper has no other.
_CHILD_RSS = r"""
import resource, subprocess, sys
p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
if p.returncode != 0:
    sys.stderr.write(p.stderr)
    sys.exit(p.returncode)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""


def run_with_peak_rss(args: list[str]) -> tuple[int, float]:
    """Runs `args` in a process of its own: its peak resident set in bytes
    and its wall seconds. A failure raises RuntimeError with its stderr."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", _CHILD_RSS] + args, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return int(p.stdout.strip().splitlines()[-1]), wall


def run(recipe: str, sets: list[str], steps: int = 3, text: str = "") -> dict:
    """Runs a recipe (a configs/ file, or `text` when given) for a few steps
    with nothing saved; its last metrics row, plus the peak less the data
    (`peak_without_data`), the step times after the first (`times`), their
    median (`step_s`) and fastest (`best_step_s`)."""
    with tempfile.TemporaryDirectory() as out:
        if text:
            recipe = str(pathlib.Path(out) / "recipe.toml")
            pathlib.Path(recipe).write_text(text)
        args = run_args(str(ROOT / "configs" / recipe), out, steps, sets)
        p = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed:\n{p.stderr[-4000:]}")
        rows = [json.loads(line) for line in (pathlib.Path(out) / "m" / "metrics.jsonl").open()]
    last = rows[-1]
    last["peak_without_data"] = last["peak_total"] - last["at_peak"].get("other", 0)
    times = step_times(rows) or [last["elapsed_s"]]
    last["times"] = times
    last["step_s"] = sorted(times)[len(times) // 2]
    last["best_step_s"] = min(times)
    return last


def plan(text: str) -> str:
    """`tightfit plan`'s output for a recipe's text."""
    with tempfile.TemporaryDirectory() as d:
        (pathlib.Path(d) / "recipe.toml").write_text(text)
        return subprocess.run([str(TIGHTFIT), "plan", str(pathlib.Path(d) / "recipe.toml")], check=True,
                              capture_output=True, text=True).stdout


def report_marks(marks) -> bool:
    """Prints each pass mark (what, met, the figure as text); True when all are met."""
    for what, ok, got in marks:
        print(f"pass mark: {what}: {got} — {'met' if ok else 'MISSED'}")
    return all(ok for _, ok, _ in marks)


def finish(args, results: dict, all_met: bool) -> int:
    """Writes --json and returns the exit code --check asks for."""
    if args.json:
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 1 if getattr(args, "check", False) and not all_met else 0
