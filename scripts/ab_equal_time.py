#!/usr/bin/env python3
"""The first variant's held-out loss at the moment each other variant's run
finished, from a `tightfit ab` ab.json: the loss gap at equal wall time
(paired by seed), for variants that trade steps for speed.

usage: scripts/ab_equal_time.py OUT/ab.json
"""
import json
import sys


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    report = json.load(open(sys.argv[1]))
    base = report["variants"][0]
    for variant in report["variants"][1:]:
        gaps = []
        for run_base, run in zip(base["runs"], variant["runs"]):
            curve = run_base["curve"]
            elapsed = curve["elapsed_s"]
            finished = run["curve"]["elapsed_s"][-1]
            at_time = None
            for step, loss in zip(curve["eval_step"], curve["eval_loss"]):
                if elapsed[int(step) - 1] <= finished:
                    at_time = loss
            if at_time is not None and run["final_eval_loss"] is not None:
                gaps.append(run["final_eval_loss"] - at_time)
        if not gaps:
            print(f"{variant['name']}: no held-out loss of {base['name']} before it finished")
            continue
        mean = sum(gaps) / len(gaps)
        print(f"{variant['name']}: held-out loss minus {base['name']}'s at the same wall time: "
              f"{mean:+.4f} (seeds: {', '.join(f'{g:+.4f}' for g in gaps)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
