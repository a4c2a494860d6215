"""Supervised warm-up: masked cross-entropy on prompt → answer pairs, with the same Trainer as RL."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from forge_core.data.problems import Problem
from forge_core.training import Trainer


@dataclass(frozen=True)
class SFTExample:
    """Token ids of one prompt and its reference response (response ends with EOS)."""

    prompt_ids: list[int]
    response_ids: list[int]


def make_sft_examples(problems: Sequence[Problem], prompts: Sequence[str], tokenizer,
                      response: str = "target") -> list[SFTExample]:
    """Tokenize (prompt, answer) pairs; `response` is 'target' (the final answer) or 'solution' (full text)."""
    if response not in ("target", "solution"):
        raise ValueError(f"sft.response must be 'target' or 'solution'; got {response!r}")
    out = []
    for problem, prompt in zip(problems, prompts, strict=True):
        text = problem.target if response == "target" else problem.solution
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        resp = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        out.append(SFTExample(ids, resp))
    return out


def sft_batch(examples: Sequence[SFTExample], pad_id: int) -> tuple[list[dict], dict]:
    """Trainer contract (inputs, targets) for SFT: the response tokens are the targets, advantages unused."""
    t = max(len(e.response_ids) for e in examples)
    response = torch.full((len(examples), t), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), t), dtype=torch.bool)
    inputs = []
    for i, e in enumerate(examples):
        response[i, : len(e.response_ids)] = torch.tensor(e.response_ids)
        mask[i, : len(e.response_ids)] = True
        inputs.append({"tokens": torch.tensor(e.prompt_ids + e.response_ids)})
    targets = {"response": response, "padding_mask": mask, "advantages": torch.zeros(len(examples)),
               "ref_logprobs": None, "old_logprobs": None}
    return inputs, targets


def run_sft(trainer: Trainer, examples: Sequence[SFTExample], steps: int, batch_size: int, seed: int,
            pad_id: int, on_step: Callable[[int, dict], None] | None = None) -> None:
    """`steps` SFT optimizer steps over shuffled epochs of `examples`; `on_step(step, metrics)` after each."""
    rng = random.Random(seed)
    order: list[int] = []
    for step in range(steps):
        if len(order) < batch_size:
            fresh = list(range(len(examples)))
            rng.shuffle(fresh)
            order.extend(fresh)
        idx, order = order[:batch_size], order[batch_size:]
        inputs, targets = sft_batch([examples[i] for i in idx], pad_id)
        trainer.train_step(inputs, targets)
        if on_step:
            on_step(step, trainer.metrics)
