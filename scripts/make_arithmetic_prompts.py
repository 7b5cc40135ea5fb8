#!/usr/bin/env python3
"""Writes configs/data/arithmetic-prompts.jsonl: prompt rows for the GRPO
recipe (configs/grpo-smollm2.toml), made here and licence-clean. Each row
asks for a small sum or difference as a chat message and carries its
"answer" for the exact_answer reward. Deterministic (seeded).
usage: scripts/make_arithmetic_prompts.py [OUT]
"""
import json
import pathlib
import random
import sys

ASK = ["What is {a} plus {b}?", "Compute {a} + {b}.", "What is {a} minus {b}?", "Compute {a} - {b}.",
       "Add {a} and {b}.", "Subtract {b} from {a}."]


def main(out: pathlib.Path) -> None:
    rng = random.Random(66)
    rows = []
    for i in range(128):
        ask = ASK[i % len(ASK)]
        a, b = rng.randint(2, 40), rng.randint(1, 20)
        if "minus" in ask or "-" in ask or "Subtract" in ask:
            a, b = max(a, b), min(a, b)
            answer = a - b
        else:
            answer = a + b
        rows.append({"prompt": [{"role": "user", "content": ask.format(a=a, b=b) + " Reply with the number."}],
                     "answer": str(answer)})
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else
         pathlib.Path(__file__).resolve().parent.parent / "configs" / "data" / "arithmetic-prompts.jsonl")
