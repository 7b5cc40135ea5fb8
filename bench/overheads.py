#!/usr/bin/env python3
"""What tightfit's strategies cost in step time, side by side in one run:
GPT-2 124M, batch 4 x seq 256, AdamW, fp32, a few steps of each recipe.

  checkpoint        recomputing every block in backward, against plain
  fused_update      updating each block as its gradients arrive, against plain
  fused AdamW       [optimizer] fused = true (LibTorch's fused kernel, one pass
                    over each parameter), against plain's multi-tensor update
  offload prefetch  LoRA with the frozen block weights on disk, read back
                    0, 1 or 2 stages ahead on a background thread, against the
                    same LoRA recipe with them in memory (compute-bound: the
                    reads are 57 MiB a block, the block's compute ~0.4 s)
  weights on disk   every trained block weight and its AdamW state on disk
                    (offload trainable = true, prefetch 2), against the
                    optimizer state on disk alone

Files just written sit in the OS page cache (this machine has 24 GiB), so a
tier read is a memory copy unless --cold drops the cache every 0.5 s while
the disk cases run (root only): then the reads come from the disk.
(tightfit's own time outside LibTorch per step is in `bench/run throughput`.)
Each figure is the fastest step after the first; this shared CPU moves
±20% between minutes, so read ratios near a mark with that in mind.

Pass mark (--check exits 1 when missed):
  disk-offloaded parameters with prefetch 2: step time <= 1.15 x in memory

usage: bench/overheads.py [--steps N] [--cold] [--check] [--json OUT]
"""
import argparse
import os
import pathlib
import sys
import threading

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from tightfit_runs import finish, report_marks, run  # noqa: E402

BASE = ["data.seq_len=256", "data.batch_size=4", "data.tokenizer=byte"]
RECIPE = (pathlib.Path(__file__).resolve().parent.parent / "configs" / "gpt2-124m.toml").read_text()


def strategy(plugin: str, **keys) -> str:
    lines = [f'\n[[strategy]]\nplugin = "{plugin}"']
    for k, v in keys.items():
        lines.append(f"{k} = " + (f'"{v}"' if isinstance(v, str) else str(v).lower()))
    return "\n".join(lines) + "\n"


LORA = strategy("lora", rank=16)
CASES = [  # name, strategies, the case it is compared with[, keys set]
    ("plain", "", None),
    ("checkpoint", strategy("checkpoint"), "plain"),
    ("fused_update", strategy("fused_update"), "plain"),
    ("fused AdamW", "", "plain", ["optimizer.fused=true"]),
    ("lora", LORA, None),
    ("lora + base on disk, prefetch 0", LORA + strategy("offload", params="disk", prefetch=0), "lora"),
    ("lora + base on disk, prefetch 1", LORA + strategy("offload", params="disk", prefetch=1), "lora"),
    ("lora + base on disk, prefetch 2", LORA + strategy("offload", params="disk", prefetch=2), "lora"),
    ("optimizer on disk", strategy("offload", params="none", optimizer="disk"), None),
    ("+ trained weights on disk, prefetch 2",
     strategy("offload", params="disk", optimizer="disk", trainable=True, prefetch=2), "optimizer on disk"),
]


class ColdCache:
    """Drops the OS page cache every `period` seconds while on (root only), so
    that tier reads come from the disk, not from the RAM the cache holds."""

    def __init__(self, period: float = 0.5):
        self.period, self.stop = period, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self.stop.wait(self.period):
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--cold", action="store_true",
                    help="drop the page cache every 0.5 s during the offload cases (needs root)")
    ap.add_argument("--json")
    args = ap.parse_args()
    results = {}
    print(f"GPT-2 124M, batch 4 x 256, AdamW, fp32, {args.steps} steps each; fastest step after the first")
    print(f"{'recipe':46}{'step s':>8}{'ratio':>8}  against")
    for name, strategies, against, *keys in CASES:
        sets = BASE + (keys[0] if keys else [])
        cold = args.cold and "disk" in name
        if cold:
            with ColdCache():
                r = run("", sets, steps=args.steps, text=RECIPE + strategies)
        else:
            r = run("", sets, steps=args.steps, text=RECIPE + strategies)
        ratio = r["best_step_s"] / results[against]["best_step_s"] if against else 1.0
        results[name] = {"best_step_s": r["best_step_s"], "times": r["times"], "ratio": ratio,
                         "against": against, "peak_without_data": r["peak_without_data"], "loss": r["loss"],
                         "cold_cache": cold}
        shown = name + (" (cold cache)" if cold else "")
        print(f"{shown:46}{r['best_step_s']:8.2f}{ratio:8.3f}  {against or ''}", flush=True)
    prefetched = results["lora + base on disk, prefetch 2"]["ratio"]
    met = report_marks([("disk-offloaded parameters, prefetch 2 <= 1.15 x in memory", prefetched <= 1.15,
                         f"{prefetched:.3f}")])
    return finish(args, results, met)


if __name__ == "__main__":
    sys.exit(main())
