"""Supervised warm-up: masked cross-entropy on prompt → answer pairs, with the same Trainer as RL."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from forge_core.data.problems import Problem
from forge_core.envs import make_environment
from forge_core.envs.base import EnvConfig
from forge_core.envs.episodes import ScriptedTurns, sample_env_groups
from forge_core.generation.sampling import SamplingParams
from forge_core.training import Trainer


@dataclass(frozen=True)
class SFTExample:
    """Token ids of one prompt and its reference response (response ends with EOS); `loss_mask`: 1 on the
    response tokens to learn (a demonstrated episode's environment messages are 0), None: all of them."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int] | None = None


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


def make_env_sft_examples(problems: Sequence[Problem], config: EnvConfig, tokenizer, end_ids: Sequence[int],
                          tool_use: float = 1.0, seed: int = 0) -> list[SFTExample]:
    """Demonstrated episodes in `config`'s environment (its `demonstrate(task, use_tools)` writes the assistant
    turns; a share `tool_use` of them, drawn from `seed`, call tools), played through the multi-turn token layer:
    the model learns the exact tokens it will see and write in RL, never the environment's."""
    env = make_environment(config)
    if not hasattr(env, "demonstrate"):
        raise ValueError(f"env.name {config.name!r} has no demonstrate(task, use_tools) method, so SFT has no "
                         "demonstrations: set sft.steps 0 or give the environment one")
    rng = random.Random(f"tool-use:{seed}")
    scripts = {i: env.demonstrate(p, rng.random() < tool_use) for i, p in enumerate(problems)}
    groups = sample_env_groups(ScriptedTurns(tokenizer, end_ids, scripts), problems, 1, seed, SamplingParams(
        max_new_tokens=config.max_tokens), config)
    examples = []
    for g in groups:
        e = g.episodes[0]
        if e.continues or len(g.episodes) > 1 or e.completion.metadata["status"] != "completed":
            meta = e.completion.metadata
            why = f"{meta['status']}: {meta['error']}" if meta.get("error") else meta["status"]
            raise ValueError(f"the demonstration of {g.question!r} did not complete as one sample ({why}); "
                             "raise env.max_tokens or env.max_turns if it was cut, else fix the environment")
        examples.append(SFTExample(e.prompt_ids, e.completion.token_ids, e.completion.loss_mask))
    return examples


def sft_batch(examples: Sequence[SFTExample], pad_id: int) -> tuple[list[dict], dict]:
    """Trainer contract (inputs, targets) for SFT: the response tokens are the targets, advantages unused."""
    t = max(len(e.response_ids) for e in examples)
    response = torch.full((len(examples), t), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), t), dtype=torch.bool)
    keep = torch.zeros((len(examples), t), dtype=torch.bool)
    inputs = []
    for i, e in enumerate(examples):
        n = len(e.response_ids)
        response[i, :n] = torch.tensor(e.response_ids)
        mask[i, :n] = True
        keep[i, :n] = torch.tensor(e.loss_mask, dtype=torch.bool) if e.loss_mask is not None else True
        inputs.append({"tokens": torch.tensor(e.prompt_ids + e.response_ids)})
    targets = {"response": response, "padding_mask": mask, "advantages": torch.zeros(len(examples)),
               "ref_logprobs": None, "old_logprobs": None}
    if any(e.loss_mask is not None for e in examples):
        targets["loss_mask"] = keep  # demonstrated tool results are context, not targets
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
