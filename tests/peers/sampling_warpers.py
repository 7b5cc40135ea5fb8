"""Reference for the sampler's distribution test: the probabilities with
which transformers' generate samples the next token from `logits` after its
RepetitionPenaltyLogitsProcessor (over "context", the row's ids so far),
TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper and
MinPLogitsWarper (in generate's order). Reads OUT/rule.json ({"logits":
[...], "temperature", "top_k", "top_p", "min_p", "repetition_penalty",
"context"}); writes OUT/probs.json, a list of probabilities.
usage: sampling_warpers.py OUT
"""
import json
import pathlib
import sys

import torch
from transformers.generation.logits_process import (LogitsProcessorList, MinPLogitsWarper,
                                                    RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)


def main(out: pathlib.Path) -> None:
    r = json.loads((out / "rule.json").read_text())
    warpers = LogitsProcessorList()
    if r.get("repetition_penalty", 1.0) != 1.0:
        warpers.append(RepetitionPenaltyLogitsProcessor(r["repetition_penalty"]))
    if r["temperature"] != 1.0:
        warpers.append(TemperatureLogitsWarper(r["temperature"]))
    if r["top_k"] > 0:
        warpers.append(TopKLogitsWarper(r["top_k"]))
    if r["top_p"] < 1.0:
        warpers.append(TopPLogitsWarper(r["top_p"]))
    if r.get("min_p", 0.0) > 0:
        warpers.append(MinPLogitsWarper(r["min_p"]))
    logits = torch.tensor([r["logits"]], dtype=torch.float32)
    context = torch.tensor([r.get("context", [0])], dtype=torch.long)
    scores = warpers(context, logits)
    (out / "probs.json").write_text(json.dumps(torch.softmax(scores, -1)[0].tolist()))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
