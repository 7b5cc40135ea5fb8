"""Reference for the chat template test: transformers' apply_chat_template
on the families' templates (chat_templates.py) over conversations that reach
their branches (system prompts, multi-turn, reasoning, tool calls, odd text),
with and without the generation prompt. Records the text, the token ids and,
for templates with {% generation %}, the assistant-token mask.

Also the loss mask of multi-turn conversations for templates without
{% generation %} marks, by tightfit's definition computed the slow, plain way
with transformers' renderer: each assistant turn's tokens are what rendering
the conversation through it adds after rendering the conversation before it
with the generation prompt (refused when a turn's rendering is not a prefix
of the next). tightfit finds them from a few renderings; this is the check.

Writes OUT/tokenizer.json, OUT/cases.json, OUT/expected.json and OUT/turns.json.
usage: chat_template_parity.py OUT_DIR
"""
import json
import pathlib
import random
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from chat_templates import TEMPLATES  # noqa: E402

SPECIAL = ["<s>", "</s>", "<|im_start|>", "<|im_end|>", "[INST]", "[/INST]", "<|begin_of_text|>",
           "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|user|>", "<|assistant|>", "<|system|>",
           "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "<think>", "</think>", "<tool_call>",
           "</tool_call>"]

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "description": "the city"}},
                                               "required": ["city"]}}}]

CASES = [
    {"messages": [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi, how can I help?"}]},
    {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4"}, {"role": "user", "content": "  and 3+3? \n"},
                  {"role": "assistant", "content": " 6 \n"}]},
    {"messages": [{"role": "user", "content": "Write a haiku\nabout memory."},
                  {"role": "assistant", "content": "Weights on the disk,\n  streamed in layer by layer —\nthe GPU breathes."},
                  {"role": "user", "content": "Another, in 日本語 🙂"}]},
    {"messages": [{"role": "user", "content": "Think first: 17 * 3?"},
                  {"role": "assistant", "content": "<think>\n17*3 = 51\n</think>\n\n51"},
                  {"role": "user", "content": "And 17 * 4?"},
                  {"role": "assistant", "content": "<think>add 17</think>68"}]},
    {"messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                                    "arguments": {"city": "Paris"}}}]},
                  {"role": "tool", "content": "{\"temp\": 21}"},
                  {"role": "assistant", "content": "21 °C in Paris."}],
     "tools": TOOLS},
    {"messages": [{"role": "system", "content": "S"}, {"role": "assistant", "content": "out of order"}]},
    {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "{\"json\": [1, 2]} 'quotes' \"dq\""}],
     "date_string": "24 Nov 2026", "enable_thinking": False},
]


def _chat(turns, system=None, **extra):
    messages = [{"role": "system", "content": system}] if system else []
    for user, answer in turns:
        messages.append({"role": "user", "content": user})
        messages.append(answer if isinstance(answer, dict) else {"role": "assistant", "content": answer})
    return {"messages": messages, **extra}


LONG_TURNS = [
    _chat([("Hello!", "Hi."), ("2+2?", "4"), ("  and 3+3? \n", " 6 \n"), ("日本語 🙂?", "はい 🙂"),
           ("bye", "Bye!")], system="You are terse."),
    _chat([("a", "b"), ("c", "d"), ("e", "f")]),
    _chat([("Think: 17*3?", "<think>\n17*3 = 51\n</think>\n\n51"), ("17*4?", "<think>add 17</think>68"),
           ("17*5?", "<think>add 17</think>85")]),
    _chat([("Weather in Paris?", {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}),
           ("thanks", "You are welcome."), ("more?", "No more."), ("ok", "ok")], tools=TOOLS),
    _chat([("q%d" % i, "answer %d" % i) for i in range(12)], system="S"),
]


def turn_masks(tok, template):
    """tightfit's loss mask by its definition, one prefix rendering per turn."""
    rows = []
    for c, case in enumerate(LONG_TURNS):
        messages, tools = case["messages"], case.get("tools")

        def render(msgs, gen):
            return tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=gen,
                                           chat_template=template)
        row = {"case": c}
        try:
            full = render(messages, False)
            spans = []
            for k, m in enumerate(messages):
                if m["role"] != "assistant":
                    continue
                prompt = render(messages[:k], True) if k else ""
                turn = render(messages[:k + 1], False)
                if not turn.startswith(prompt) or not full.startswith(turn):
                    raise ValueError("turn %d renders differently once later turns follow" % k)
                spans.append((len(prompt), len(turn)))
        except Exception as e:  # the template raised, or the definition finds no turn: tightfit refuses
            row["refused"] = str(e)
            rows.append(row)
            continue
        enc = tok(full, add_special_tokens=False)
        mask = [0] * len(enc["input_ids"])
        for begin, end in spans:  # as transformers' return_assistant_tokens_mask
            if end <= begin:
                continue
            first, last = enc.char_to_token(begin), enc.char_to_token(end - 1)
            if first is None:
                break
            for t in range(first, last + 1 if last else len(mask)):
                mask[t] = 1
        row.update(ids=enc["input_ids"], mask=mask)
        rows.append(row)
    return rows


def tokenizer(out: pathlib.Path) -> PreTrainedTokenizerFast:
    rng = random.Random(3)
    words = ["hello", "memory", "assistant", "user", "system", "think", "weather", "Paris", "the", "a", "is",
             "haiku", "disk", "layer", "streamed", "GPU", "日本語", "🙂", "17", "3", "51", "json", "tools"]
    corpus = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 20))) + rng.choice(["\n", ".\n\n", " "])
              for _ in range(2000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIAL, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(out / "tokenizer.json"))
    return PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"), bos_token="<s>", eos_token="</s>")


def main(out: pathlib.Path) -> None:
    tok = tokenizer(out)
    expected = []
    for name, template in TEMPLATES.items():
        for c, case in enumerate(CASES):
            extra = {k: v for k, v in case.items() if k not in ("messages", "tools")}
            for gen in (False, True):
                row = {"template": name, "case": c, "add_generation_prompt": gen}
                has_marks = "{% generation %}" in template
                try:
                    row["text"] = tok.apply_chat_template(case["messages"], tools=case.get("tools"), tokenize=False,
                                                          add_generation_prompt=gen, chat_template=template, **extra)
                    ids = tok.apply_chat_template(case["messages"], tools=case.get("tools"), tokenize=True,
                                                  add_generation_prompt=gen, chat_template=template,
                                                  return_dict=True, return_assistant_tokens_mask=has_marks,
                                                  **extra)
                    row["ids"] = ids["input_ids"]
                    if has_marks:
                        row["assistant_mask"] = ids["assistant_masks"]
                except Exception as e:  # the template raised: tightfit must raise too
                    row["error"] = str(e)
                expected.append(row)
    turns = {name: turn_masks(tok, template) for name, template in TEMPLATES.items()
             if "{% generation %}" not in template}
    (out / "turns.json").write_text(json.dumps({"cases": LONG_TURNS, "templates": turns}, ensure_ascii=False))
    (out / "templates.json").write_text(json.dumps(TEMPLATES))
    (out / "cases.json").write_text(json.dumps(CASES, ensure_ascii=False))
    (out / "expected.json").write_text(json.dumps(expected, ensure_ascii=False))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
