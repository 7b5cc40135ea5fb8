"""Reference for tightfit's GRPO maths (plugins/sdk/tightfit/rl/grpo_loss.hpp):
TRL 0.24's GRPOTrainer._compute_loss itself, run on given per-token
log-probabilities instead of a model's (the trainer's
_get_per_token_logps_and_entropies answers with them), so that the loss,
its gradient with respect to those log-probabilities and the metrics TRL
logs come from TRL's own code. The group advantages are computed with the
lines of GRPOTrainer._generate_and_score_completions that make them (that
method samples with the model; its advantage lines are repeated here as
they are there).

Reads OUT/inputs.safetensors (logps [B, T], mask [B, T], rewards [B], and
old / ref when given) and OUT/options.json (loss_type,
importance_sampling_level, epsilon, epsilon_high, delta, beta,
max_completion_length, accumulation_steps, tokens_in_update,
num_generations, scale_rewards). Writes OUT/expected.safetensors:
advantages, group_std, std_is_zero, loss, grad (d loss / d logps) and
metric.<name> for kl and the clip ratios.
usage: grpo_loss_parity.py OUT
"""
import json
import os
import pathlib
import sys
from collections import defaultdict
from types import SimpleNamespace

import torch
from safetensors.torch import load_file, save_file

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from trl import GRPOTrainer  # noqa: E402


def advantages_as_trl(rewards: torch.Tensor, num_generations: int, scale_rewards: str):
    # GRPOTrainer._generate_and_score_completions (TRL 0.24), one process.
    mean_grouped_rewards = rewards.view(-1, num_generations).mean(dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards in ["group", "none"]:
        std_rewards = rewards.view(-1, num_generations).std(dim=1)
        std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
    elif scale_rewards == "batch":
        std_rewards = rewards.std().expand_as(rewards)
    else:
        raise ValueError(scale_rewards)
    is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    return advantages, std_rewards, is_std_zero


def main(out: pathlib.Path) -> None:
    torch.use_deterministic_algorithms(True)
    o = json.loads((out / "options.json").read_text())
    t = load_file(str(out / "inputs.safetensors"))
    logps = t["logps"].clone().requires_grad_(True)
    mask = t["mask"]
    advantages, std, zero = advantages_as_trl(t["rewards"], o["num_generations"], o["scale_rewards"])

    rows, width = logps.shape
    trainer = SimpleNamespace(
        top_entropy_quantile=1.0,
        beta=o["beta"],
        importance_sampling_level=o["importance_sampling_level"],
        epsilon_low=o["epsilon"],
        epsilon_high=o["epsilon_high"],
        args=SimpleNamespace(delta=o.get("delta")),
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        loss_type=o["loss_type"],
        current_gradient_accumulation_steps=o["accumulation_steps"],
        max_completion_length=o["max_completion_length"],
        accelerator=SimpleNamespace(num_processes=1, gather=lambda x: x.reshape(-1)),
        model=SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros_like(logps)),
    )
    inputs = {
        "prompt_ids": torch.zeros(rows, 1, dtype=torch.long),
        "prompt_mask": torch.ones(rows, 1, dtype=torch.long),
        "completion_ids": torch.zeros(rows, width, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "num_items_in_batch": torch.tensor(o["tokens_in_update"]),
    }
    if "old" in t:
        inputs["old_per_token_logps"] = t["old"]
    if "ref" in t:
        inputs["ref_per_token_logps"] = t["ref"]
    loss = GRPOTrainer._compute_loss(trainer, None, inputs)
    loss.backward()
    metrics = trainer._metrics["train"]
    expected = {
        "advantages": advantages.contiguous(),
        "group_std": std.contiguous(),
        "std_is_zero": zero.to(torch.float32),
        "loss": loss.detach().reshape(1),
        "grad": logps.grad.contiguous(),
    }
    for name in ["kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"]:
        if name in metrics:
            expected["metric." + name] = torch.tensor([float(metrics[name][0])])
    save_file(expected, str(out / "expected.safetensors"))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
