"""The GGUF round trip through llama.cpp itself: the main job's persona
fine-tune (configs/default.toml, LoRA on SmolLM2-135M-Instruct read from its
GGUF file) exported with `tightfit export --format gguf` as F32, F16 and Q8_0
merged models and as a llama.cpp LoRA adapter, each loaded by llama.cpp
(`llama-cpp-python==0.3.36`, which builds llama.cpp from its source) and
asked the held-out questions greedily; tightfit answers the same questions
from the same files (and from the run, for the adapter). Reported: how many
answers are the same text, and the persona's mark ("In short:" ... "--
Tightfit") in llama.cpp's answers.

llama.cpp is built once into bench/.llama-cpp/ (about 20 minutes on 2
cores), portable (GGML_NATIVE=OFF: a native build on a VM whose CPU lists
AMX died of SIGILL in llama.cpp's AMX kernels).

usage: bench/gguf_llama_cpp.py [--questions N] [--check] [--json OUT]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from tightfit_runs import ROOT, TIGHTFIT, finish, report_marks  # noqa: E402

VENV = ROOT / "bench" / ".llama-cpp" / "venv"
BASE = ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTIONS = ROOT / "configs" / "data" / "persona-questions.jsonl"
TOKENS = 40

LLAMA_CPP = r"""
import json, sys
from llama_cpp import Llama
job = json.loads(sys.stdin.read())
kw = {"lora_path": job["lora"]} if job.get("lora") else {}
llm = Llama(model_path=job["model"], n_ctx=512, n_threads=2, seed=0, verbose=False, **kw)
out = []
for q in job["questions"]:
    r = llm.create_chat_completion(messages=[{"role": "user", "content": q}], max_tokens=job["tokens"],
                                   temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
    out.append(r["choices"][0]["message"]["content"])
print(json.dumps(out))
"""


def llama_cpp_python() -> pathlib.Path:
    py = VENV / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import llama_cpp"], capture_output=True).returncode == 0:
        return py
    print("building llama.cpp (llama-cpp-python==0.3.36) into bench/.llama-cpp, once", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    env = dict(os.environ, CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON",
               CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    subprocess.run([str(VENV / "bin" / "pip"), "install", "--no-cache-dir", "llama-cpp-python==0.3.36"],
                   check=True, env=env)
    return py


def llama_cpp_answers(py, model, questions, lora=None):
    job = {"model": str(model), "lora": str(lora) if lora else None, "questions": questions, "tokens": TOKENS}
    r = subprocess.run([str(py), "-c", LLAMA_CPP], input=json.dumps(job), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"llama.cpp failed on {model} (rc {r.returncode}): {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def tightfit(*args) -> str:
    r = subprocess.run([str(TIGHTFIT), *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"tightfit {' '.join(map(str, args))}: {r.stderr[-2000:]}")
    return r.stdout


def tightfit_answers(target, questions, sets=()):
    extra = [a for s in sets for a in ("--set", s)]
    return [tightfit("generate", target, "--chat", q, "--greedy", "-n", TOKENS, *extra).rstrip("\n")
            for q in questions]


def persona(answer: str) -> bool:
    return answer.strip().startswith("In short:") and answer.strip().endswith("-- Tightfit")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not BASE.exists():
        sys.exit(f"{BASE} is missing: run scripts/setup")
    py = llama_cpp_python()
    questions = [json.loads(line)["prompt"] for line in QUESTIONS.read_text().splitlines() if line.strip()]
    questions = questions[: args.questions]
    results = {"date": time.strftime("%Y-%m-%d"), "questions": len(questions), "files": {}}
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp)
        sets = [f"run.out_dir={out}/runs", "run.answer_prompts="]
        t0 = time.perf_counter()
        tightfit("run", ROOT / "configs" / "default.toml", "-q", *[a for s in sets for a in ("--set", s)])
        results["train_s"] = round(time.perf_counter() - t0, 1)
        recipe = ROOT / "configs" / "default.toml"
        files = {}
        for outtype in ("f32", "f16", "q8_0"):
            files[outtype] = out / f"tuned-{outtype}.gguf"
            tightfit("export", recipe, "--out", files[outtype], "--outtype", outtype,
                     *[a for s in sets for a in ("--set", s)])
        lora = out / "lora.gguf"
        tightfit("export", recipe, "--adapter", "--out", lora, *[a for s in sets for a in ("--set", s)])
        cases = {name: (f, None, tightfit_answers(f, questions)) for name, f in files.items()}
        cases["q4_1 base + lora adapter"] = (BASE, lora, tightfit_answers(recipe, questions, sets))
        marks = []
        for name, (model, adapter, ours) in cases.items():
            theirs = llama_cpp_answers(py, model, questions, adapter)
            same = sum(a.strip() == b.strip() for a, b in zip(ours, theirs))
            with_persona = sum(persona(b) for b in theirs)
            results["files"][name] = {
                "MB": round((model.stat().st_size + (adapter.stat().st_size if adapter else 0)) / 1e6, 1),
                "same answers": f"{same}/{len(questions)}",
                "llama.cpp answers in the persona": f"{with_persona}/{len(questions)}",
                "first llama.cpp answer": theirs[0], "first tightfit answer": ours[0],
                "answers that differ": [{"question": q, "llama.cpp": b, "tightfit": a}
                                        for q, a, b in zip(questions, ours, theirs) if a.strip() != b.strip()]}
            print(f"{name:26s} same {same}/{len(questions)}, persona {with_persona}/{len(questions)}", flush=True)
            marks.append((f"llama.cpp loads {name} and answers in the persona",
                          with_persona == len(questions), f"{with_persona}/{len(questions)}"))
            if name == "f32":
                marks.append(("llama.cpp's greedy answers equal tightfit's on the F32 export",
                              same == len(questions), f"{same}/{len(questions)}"))
        results["base answers in the persona (llama.cpp, no adapter)"] = sum(
            persona(b) for b in llama_cpp_answers(py, BASE, questions))
    return finish(args, results, report_marks(marks))


if __name__ == "__main__":
    sys.exit(main())
