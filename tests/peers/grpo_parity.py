"""Reference for the grpo schedule's parity test: TRL 0.24's GRPOTrainer runs
one step on the completions tightfit reads from its completions file (the
trainer's sampling replaced by them; its prompt tokenization kept), with
reward functions written as tightfit's reward plugins compute them.

Reads OUT/base (transformers folder); OUT/adapter (PEFT, the policy is the
base with it; the reference the base with it disabled) or, without it, a full
fine-tune of OUT/base (TRL loads the reference from the same folder);
OUT/tokenizer; OUT/prompts.jsonl (every row in one batch); OUT/completions.jsonl
({"row": i, "completion_ids": [[ids], ...]}); OUT/options.json (GRPOConfig's
values, and "rewards": [{"plugin", "name", "weight", ...keys}]; a
"scorer_model" reward is its "model" folder loaded as the reward model).
Writes OUT/expected.safetensors: "loss", "metric.<TRL's name>" and
"grad.<name>" of every trained parameter (PEFT keys without ".default").
usage: grpo_parity.py OUT
"""
import copy
import json
import logging
import pathlib
import re
import sys
import tempfile

import torch
from datasets import Dataset, disable_progress_bars
from peft import PeftModel
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.data_utils import maybe_apply_chat_template


def text_of(completion):
    return completion if isinstance(completion, str) else completion[0]["content"]


def length_reward(spec):
    target, tokens = spec.get("target", 50), spec.get("unit", "chars") == "tokens"

    def reward(completions, completion_ids, **kwargs):
        return [-abs((len(ids) if tokens else len(text_of(c))) - target)
                for c, ids in zip(completions, completion_ids)]
    return reward


def last_number(text):
    found = re.findall(r"-?\d[\d,]*(?:\.\d+)?", text)
    return found[-1] if found else text.strip()


def as_number(text):
    t = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        return float(t)
    except ValueError:
        return None


def exact_answer_reward(spec):
    field = spec.get("field", "answer")

    def final(text, reference):
        if "####" in text:
            return text.rsplit("####", 1)[1].strip()
        return text.strip() if reference else last_number(text)

    def reward(completions, **kwargs):
        out = []
        for c, want in zip(completions, kwargs[field]):
            got, ref = final(text_of(c), False), final(str(want), True)
            a, b = as_number(got), as_number(ref)
            same = abs(a - b) <= 1e-6 * max(1.0, abs(b)) if a is not None and b is not None else got == ref
            out.append(1.0 if same else 0.0)
        return out
    return reward


def main(out: pathlib.Path) -> None:
    logging.disable(logging.WARNING)
    disable_progress_bars()
    torch.use_deterministic_algorithms(True)
    o = json.loads((out / "options.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    rows = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines() if line.strip()]
    given = {}
    for line in (out / "completions.jsonl").read_text().splitlines():
        if line.strip():
            j = json.loads(line)
            given[j["row"]] = j["completion_ids"]
    G = o["num_generations"]

    funcs, weights = [], []
    for spec in o["rewards"]:
        if spec["plugin"] == "scorer_model":  # a reward model: TRL names it by its folder
            funcs.append(AutoModelForSequenceClassification.from_pretrained(spec["model"],
                                                                            torch_dtype=torch.float32))
        else:
            f = {"length": length_reward, "exact_answer": exact_answer_reward}[spec["plugin"]](spec)
            f.__name__ = spec.get("name", spec["plugin"])
            funcs.append(f)
        weights.append(spec.get("weight", 1.0))

    # A resumed step: a full fine-tune's policy after the first update
    # ("policy"), its reference the starting weights ("base"); LoRA's
    # adapter after it ("adapter"), its reference the base with it off.
    policy = out / "policy"
    base = AutoModelForCausalLM.from_pretrained(str(policy if policy.exists() else out / "base"),
                                                torch_dtype=torch.float32)
    peft = (out / "adapter").exists()
    model = PeftModel.from_pretrained(base, str(out / "adapter"), is_trainable=True) if peft else base

    accumulation = o.get("gradient_accumulation_steps", 1)
    if accumulation > 1:
        return train_step(out, o, tok, rows, given, funcs, weights, model, peft)
    # Each a copy, as TRL's dataloader gives them: its rewards pop a continued
    # assistant message from each prompt.
    inputs = [copy.deepcopy(row) for row in rows for _ in range(G)]
    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(
            output_dir=tmp, report_to="none", bf16=False, use_cpu=True, per_device_train_batch_size=len(inputs),
            num_generations=G, max_completion_length=o["max_completion_length"],
            temperature=o["temperature"], beta=o["beta"], loss_type=o["loss_type"],
            importance_sampling_level=o["importance_sampling_level"], scale_rewards=o["scale_rewards"],
            mask_truncated_completions=o["mask_truncated_completions"], epsilon=o["epsilon"],
            epsilon_high=o.get("epsilon_high"), reward_weights=weights, logging_steps=1)
        trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=config,
                              train_dataset=Dataset.from_list([{"prompt": "x"}]), processing_class=tok)

        def given_completions(prompts, images):
            texts = [maybe_apply_chat_template({"prompt": p}, tok)["prompt"] for p in prompts]
            enc = tok(text=texts, padding=True, padding_side="left", max_length=config.max_prompt_length,
                      truncation=True, add_special_tokens=False)
            prompt_ids = [[t for t, m in zip(ids, mask) if m]
                          for ids, mask in zip(enc["input_ids"], enc["attention_mask"])]
            completion_ids = [given[k // G][k % G] for k in range(len(prompts))]
            return prompt_ids, completion_ids, None, {}

        trainer._generate_single_turn = given_completions
        if policy.exists() and o["beta"] != 0:  # TRL's copy at init would be the moved policy
            trainer.ref_model = AutoModelForCausalLM.from_pretrained(str(out / "base"), torch_dtype=torch.float32)
            trainer.ref_model.eval()
        trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop
        model.train()
        processed = trainer._generate_and_score_completions(inputs)
        model.zero_grad()
        loss = trainer.compute_loss(model, processed)
        loss.backward()
        metrics = {k: sum(v) / len(v) for k, v in trainer._metrics["train"].items() if v}

    save(out, loss.detach().reshape(1), metrics, model, peft)


def train_step(out, o, tok, rows, given, funcs, weights, model, peft):
    """One optimizer step of trainer.train() over gradient_accumulation_steps
    micro-batches (one prompt's group each, the rows in their order), the
    gradients taken before the (lr 0) update, the logged loss and metrics.
    The dataset holds each row's index as its prompt (a column cannot mix
    text and messages); the replaced sampling renders the row's own."""
    G = o["num_generations"]
    grads = {}

    class Grab(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            for name, p in model.named_parameters():
                if p.grad is not None:
                    grads[name] = p.grad.detach().clone()

    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(
            output_dir=tmp, report_to="none", bf16=False, use_cpu=True, per_device_train_batch_size=G,
            gradient_accumulation_steps=o["gradient_accumulation_steps"], num_generations=G,
            steps_per_generation=o.get("steps_per_generation") or None,
            max_completion_length=o["max_completion_length"], temperature=o["temperature"], beta=o["beta"],
            loss_type=o["loss_type"], importance_sampling_level=o["importance_sampling_level"],
            scale_rewards=o["scale_rewards"], mask_truncated_completions=o["mask_truncated_completions"],
            epsilon=o["epsilon"], epsilon_high=o.get("epsilon_high"), reward_weights=weights, logging_steps=1,
            learning_rate=0.0, max_grad_norm=0.0, max_steps=1, shuffle_dataset=False, save_strategy="no",
            disable_tqdm=True)
        indexed = [dict(row, prompt=str(i)) for i, row in enumerate(rows)]
        trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=config, train_dataset=Dataset.from_list(indexed),
                              processing_class=tok, callbacks=[Grab()])

        def given_completions(prompts, images):
            texts = [maybe_apply_chat_template({"prompt": rows[int(p)]["prompt"]}, tok)["prompt"] for p in prompts]
            enc = tok(text=texts, padding=True, padding_side="left", max_length=config.max_prompt_length,
                      truncation=True, add_special_tokens=False)
            prompt_ids = [[t for t, m in zip(ids, mask) if m]
                          for ids, mask in zip(enc["input_ids"], enc["attention_mask"])]
            seen = {}
            completion_ids = []
            for p in prompts:
                completion_ids.append(given[int(p)][seen.get(p, 0) % G])
                seen[p] = seen.get(p, 0) + 1
            return prompt_ids, completion_ids, None, {}

        trainer._generate_single_turn = given_completions
        trainer.train()
        log = next(h for h in trainer.state.log_history if "loss" in h)
    metrics = {k: v for k, v in log.items() if isinstance(v, (int, float))}
    for name, p in model.named_parameters():
        if p.requires_grad:
            p.grad = grads[name]
    save(out, torch.tensor([float(log["loss"])]), metrics, model, peft)


def save(out, loss, metrics, model, peft):
    tensors = {"loss": loss}
    for name, value in metrics.items():
        tensors["metric." + name] = torch.tensor([float(value)])
    for name, p in model.named_parameters():
        if p.requires_grad:
            tensors["grad." + (name.replace(".default", "") if peft else name)] = p.grad.detach().clone()
    save_file({k: v.contiguous().float() for k, v in tensors.items()}, str(out / "expected.safetensors"))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
