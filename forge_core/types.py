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
    # multi-turn episodes: 1 on the tokens the model generated, 0 on those an environment inserted (tool results);
    # None: every token was generated
    loss_mask: list[int] | None = None


@dataclass
class Episode:
    """A prompt, its target and one completion, plus what later phases attach (reward, advantage, reference and
    teacher logprobs)."""

    prompt: str
    target: str
    prompt_ids: list[int]
    completion: Completion
    reward: float = 0.0
    reward_breakdown: dict[str, float] = field(default_factory=dict)
    advantage: float = 0.0
    token_advantages: list[float] | None = None  # [T] per completion token, when rewards are credited per turn
    ref_logprobs: list[float] | None = None
    teacher_logprobs: list[float] | None = None  # [T] on-policy distillation: the teacher's logprob of each token
    # a later sample of the episode before it in its group (a chat template could not extend that one's prefix):
    # it trains with that episode's advantage and is left out of the group's statistics
    continues: bool = False


@dataclass
class Group:
    """All episodes sampled for one prompt (GRPO group)."""

    prompt: str
    target: str
    episodes: list[Episode]
    question: str = ""  # the problem as the user asked it (the prompt renders it in a template)

    @property
    def rewards(self) -> list[float]:
        """One reward per episode (an episode's continuation samples are not counted again)."""
        return [e.reward for e in self.episodes if not e.continues]
