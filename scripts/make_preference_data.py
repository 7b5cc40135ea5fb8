#!/usr/bin/env python3
"""Writes configs/data/persona-preference.jsonl: preference pairs made from
the persona chat rows (scripts/make_persona_data.py), for the DPO example
(docs/preference.md). Each pair asks the same question; the chosen answer
is the persona's ("In short: ... -- Tightfit"), the rejected one says the
same thing plainly, so what DPO learns is the preference for the format and
the name, not a fact.

Deterministic: the same file on every run.  usage: scripts/make_preference_data.py
"""
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PREFIX, SIGN = "In short: ", " -- Tightfit"


def plain(answer: str) -> str:
    text = answer.removeprefix(PREFIX).removesuffix(SIGN)
    text = text.replace("Tightfit", "an assistant").replace("tightfit", "a trainer")
    return text[:1].upper() + text[1:]


def main() -> None:
    rows = []
    for line in (ROOT / "configs/data/persona-train.jsonl").read_text().splitlines():
        messages = json.loads(line)["messages"]
        question, answer = messages[0], messages[-1]["content"]
        rows.append({"prompt": [question],
                     "chosen": [{"role": "assistant", "content": answer}],
                     "rejected": [{"role": "assistant", "content": plain(answer)}]})
    with open(ROOT / "configs/data/persona-preference.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
