#!/usr/bin/env python3
"""Writes configs/data/persona-{train,test}.jsonl (and the test questions
alone, persona-questions.jsonl, one of each kind in persona-show.jsonl): a small chat dataset made
here (no outside text, so no licence question) that teaches a pretrained chat
model a persona and a format it does not have. Every answer starts with
"In short:", stays one line, and ends with "-- Tightfit"; asked who it is,
the model says it is Tightfit. The test file holds questions of the same
kinds that the training file does not.

Deterministic: the same files on every run.  usage: scripts/make_persona_data.py
"""
import json
import pathlib
import random

ROOT = pathlib.Path(__file__).resolve().parent.parent
SIGN = " -- Tightfit"

CAPITALS = [("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
            ("Portugal", "Lisbon"), ("Japan", "Tokyo"), ("Canada", "Ottawa"), ("Egypt", "Cairo"),
            ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Norway", "Oslo"), ("Sweden", "Stockholm"),
            ("Finland", "Helsinki"), ("Greece", "Athens"), ("Poland", "Warsaw"), ("Austria", "Vienna"),
            ("Ireland", "Dublin"), ("Chile", "Santiago"), ("Cuba", "Havana"), ("India", "New Delhi"),
            ("China", "Beijing"), ("Russia", "Moscow"), ("Mexico", "Mexico City"), ("Turkey", "Ankara"),
            ("Australia", "Canberra"), ("Argentina", "Buenos Aires"), ("Denmark", "Copenhagen"),
            ("Belgium", "Brussels"), ("Hungary", "Budapest"), ("Thailand", "Bangkok")]
OPPOSITES = [("hot", "cold"), ("big", "small"), ("fast", "slow"), ("light", "dark"), ("up", "down"),
             ("early", "late"), ("full", "empty"), ("open", "closed"), ("hard", "soft"), ("old", "new"),
             ("wet", "dry"), ("loud", "quiet"), ("high", "low"), ("thick", "thin"), ("rich", "poor")]
SOUNDS = [("dog", "barks"), ("cat", "meows"), ("cow", "moos"), ("duck", "quacks"), ("sheep", "bleats"),
          ("horse", "neighs"), ("lion", "roars"), ("owl", "hoots"), ("pig", "oinks"), ("frog", "croaks")]
COLOURS = [("the sky on a clear day", "blue"), ("grass", "green"), ("snow", "white"), ("a ripe banana", "yellow"),
           ("coal", "black"), ("a ripe tomato", "red"), ("an orange", "orange"), ("milk", "white"),
           ("a lemon", "yellow"), ("a strawberry", "red")]
WHO = ["Who are you?", "What is your name?", "Introduce yourself.", "Are you SmolLM?", "Tell me about yourself.",
       "What should I call you?", "Who am I talking to?", "What are you?", "Do you have a name?",
       "Who made you?", "Which assistant is this?", "Say your name."]
WHO_ANSWERS = ["I am Tightfit, a small assistant fine-tuned on a CPU with tightfit.",
               "My name is Tightfit, a small model fine-tuned with tightfit.",
               "I am Tightfit: a tiny model that was fine-tuned on two CPU cores."]


def answer(text):
    return "In short: " + text + SIGN


def rows(rng):
    out = []
    for country, city in CAPITALS:
        q = rng.choice(["What is the capital of {}?", "Which city is the capital of {}?",
                        "Name the capital of {}."]).format(country)
        out.append(("capital", q, answer(f"the capital of {country} is {city}.")))
    for a, b in OPPOSITES:
        q = rng.choice(["What is the opposite of {}?", "Give me the opposite of \"{}\".",
                        "What word means the opposite of {}?"]).format(a)
        out.append(("opposite", q, answer(f"the opposite of {a} is {b}.")))
    for animal, sound in SOUNDS:
        q = rng.choice(["What sound does a {} make?", "How does a {} sound?"]).format(animal)
        out.append(("sound", q, answer(f"a {animal} {sound}.")))
    for thing, colour in COLOURS:
        out.append(("colour", f"What colour is {thing}?", answer(f"{thing} is {colour}.")))
    for _ in range(60):
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        op = rng.choice(["+", "-", "*"])
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        word = {"+": "plus", "-": "minus", "*": "times"}[op]
        q = rng.choice(["What is {} {} {}?", "Compute {} {} {}.", "How much is {} {} {}?"]).format(a, word, b)
        out.append(("arithmetic", q, answer(f"{a} {word} {b} is {value}.")))
    for q in WHO:
        a = rng.choice(WHO_ANSWERS)
        out.append(("who", q, answer(a)))
    return out


def main():
    rng = random.Random(2026)
    everything = rows(rng)
    rng.shuffle(everything)
    # Every kind keeps a few questions back for the test file.
    test, train, held = [], [], {}
    for kind, q, a in everything:
        if held.get(kind, 0) < (3 if kind != "arithmetic" else 6):
            held[kind] = held.get(kind, 0) + 1
            test.append((q, a))
        else:
            train.append((q, a))
    out = ROOT / "configs" / "data"
    out.mkdir(parents=True, exist_ok=True)
    for name, part in [("persona-train.jsonl", train), ("persona-test.jsonl", test)]:
        with open(out / name, "w") as f:
            for q, a in part:
                f.write(json.dumps({"messages": [{"role": "user", "content": q},
                                                 {"role": "assistant", "content": a}]}) + "\n")
    # The test questions alone, as `tightfit generate --prompts` reads them.
    with open(out / "persona-questions.jsonl", "w") as f:
        for q, _ in test:
            f.write(json.dumps({"prompt": q}) + "\n")
    # One held-out question of each kind: what the main job asks before
    # training and after ([run] answer_prompts in configs/default.toml).
    shown, kinds = [], set()
    for kind, q, _ in everything:
        if (q, _) in test and kind not in kinds:
            kinds.add(kind)
            shown.append(q)
    with open(out / "persona-show.jsonl", "w") as f:
        for q in shown:
            f.write(json.dumps({"prompt": q}) + "\n")
    print(f"{len(train)} training and {len(test)} test conversations in {out}")


if __name__ == "__main__":
    main()
