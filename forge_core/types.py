"""Small dataclasses that cross boundaries between generation, reward, reference scoring and training."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Completion:
    """One sampled response. `token_ids`/`logprobs`: [T] (behaviour-policy logprob of each sampled token)."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    metadata: dict[str, Any] = field(default_factory=dict)
    policy_version: int = 0
    stop_reason: str = "length"  # "eos" | "length"


@dataclass
class Episode:
    """A prompt, its target and one completion, plus what later phases attach (reward, advantage, ref logprobs)."""

    prompt: str
    target: str
    prompt_ids: list[int]
    completion: Completion
    reward: float = 0.0
    reward_breakdown: dict[str, float] = field(default_factory=dict)
    advantage: float = 0.0
    ref_logprobs: list[float] | None = None


@dataclass
class Group:
    """All episodes sampled for one prompt (GRPO group)."""

    prompt: str
    target: str
    episodes: list[Episode]
    question: str = ""  # the problem as the user asked it (the prompt renders it in a template)

    @property
    def rewards(self) -> list[float]:
        return [e.reward for e in self.episodes]
