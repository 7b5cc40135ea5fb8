#!/usr/bin/env python3
"""Writes configs/data/persona-preference.jsonl: preference pairs made from
the persona chat rows (scripts/make_persona_data.py), for the DPO example
(docs/preference.md). Each pair asks the same question; the chosen answer
is the persona's ("In short: ... -- Tightfit"), the rejected one says the
same thing plainly, so what DPO learns is the preference for the format and
the name, not a fact.

And configs/data/persona-kto.jsonl, the same answers as unpaired rows for
the KTO example ({"prompt", "completion", "label"}): KTO trains rows in
their order and takes each batch's KL rows from neighbours, so the labels
alternate and neighbours never share a question — question k's persona
answer (desirable) when k is even and its plain answer (undesirable) when
odd, then every question again with the other answer.

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
    with open(ROOT / "configs/data/persona-kto.jsonl", "w") as f:
        for flip in (False, True):
            for k, row in enumerate(rows):
                desirable = (k % 2 == 0) != flip
                f.write(json.dumps({"prompt": row["prompt"],
                                    "completion": row["chosen" if desirable else "rejected"],
                                    "label": desirable}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
