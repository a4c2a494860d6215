"""Small dataclasses that cross boundaries between generation, reward, reference scoring and training."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


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

    @property
    def rewards(self) -> list[float]:
        return [e.reward for e in self.episodes]


@dataclass
class TrainBatch:
    """Padded tensors for one optimizer step.

    tokens: [B, L] prompt+response ids (right-padded); response_start: [B] index of the first response token;
    response_mask/old_logprobs/ref_logprobs: [B, T] aligned to response positions; advantages: [B].
    """

    tokens: torch.Tensor
    response_start: torch.Tensor
    response_mask: torch.Tensor
    advantages: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    policy_versions: list[int] = field(default_factory=list)
