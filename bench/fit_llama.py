"""`tightfit fit` on LLaMA 1B, 7B and 13B shapes (full fine-tune recipes,
batch 8 x 512, AdamW) for 8, 16 and 24 GiB budgets on this machine: the
stack it picks, the planned peak and the predicted step time against the
plain recipe of the same training target. Optionally `--verify-model` runs
`fit --verify --verify-spread` on a small recipe and prints the rank
correlation of predicted and measured step time.

    bench/run fit [--objective speed|quality] [--verify-model]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIGHTFIT = os.path.join(ROOT, "build", "bin", "tightfit")

RECIPE = """[run]
name = "fit-{shape}"
steps = 20
out_dir = "{out}"
[model]
plugin = "llama"
preset = "{shape}"
[data]
corpus = "builtin:fortunes"
tokenizer = "byte"  # no weights: the byte tokenizer, said (no "auto" to resolve)
seq_len = 512
batch_size = 8
[optimizer]
name = "adamw"
lr = 2e-5
[schedule]
plugin = "standard"
warmup_steps = 2
"""


def fit(recipe, budget, objective, out, extra=()):
    cmd = [TIGHTFIT, "fit", recipe, "--budget", budget, "--objective", objective, "--json",
           "--out", out, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode == 3:
        return {"none": p.stderr.strip().splitlines()[-1]}
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--objective", default="speed")
    ap.add_argument("--shapes", default="1B,7B,13B")
    ap.add_argument("--budgets", default="8GiB,16GiB,24GiB")
    ap.add_argument("--verify-model", action="store_true",
                    help="also fit --verify --verify-spread on configs/fortunes-gpt2.toml")
    args = ap.parse_args()
    results = {"objective": args.objective, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'shape':6} {'budget':7} {'peak':>9} {'s/step':>8} {'x plain':>8}  stack")
        for shape in args.shapes.split(","):
            recipe = os.path.join(tmp, f"llama-{shape}.toml")
            with open(recipe, "w") as f:
                f.write(RECIPE.format(shape=shape, out=os.path.join(tmp, "runs")))
            for budget in args.budgets.split(","):
                r = fit(recipe, budget, args.objective,
                        os.path.join(tmp, f"llama-{shape}-{budget}.fit.toml"))
                row = {"shape": shape, "budget": budget}
                if "none" in r:
                    row["result"] = r["none"]
                    print(f"{shape:6} {budget:7} {'-':>9} {'-':>8} {'-':>8}  {r['none']}")
                else:
                    b = r["best"][0]
                    row.update(b)
                    row["plain"] = r["plain"]["stack"]
                    print(f"{shape:6} {budget:7} {b['planned_peak'] / 2**30:8.2f}G "
                          f"{b['predicted_step_s']:8.1f} {b['slowdown']:8.3f}  {b['stack']} "
                          f"(against {r['plain']['stack']})")
                results["rows"].append(row)
        if args.verify_model:
            r = fit(os.path.join(ROOT, "configs", "fortunes-gpt2.toml"), "1GiB", "quality",
                    os.path.join(tmp, "default.fit.toml"),
                    ["--verify", "--verify-spread", "--verify-top", "8", "--verify-steps", "8",
                     "--set", f"run.out_dir={os.path.join(tmp, 'runs')}"])
            results["verify"] = r.get("verify")
            results["verify_rank_correlation"] = r.get("verify_rank_correlation")
            print("\nfit --verify --verify-spread on configs/fortunes-gpt2.toml (1GiB, quality):")
            for v in r.get("verify", []):
                if v.get("failed"):
                    print(f"  {v['stack']}: failed")
                    continue
                print(f"  {v['stack'][:48]:48} peak {v['planned_peak'] / 2**20:6.1f} planned "
                      f"{v['measured_peak'] / 2**20:6.1f} measured MiB; s/step "
                      f"{v['predicted_step_s']:.3f} predicted {v['measured_step_s']:.3f} measured")
            print(f"rank correlation (Spearman) of step time: "
                  f"{results['verify_rank_correlation']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
