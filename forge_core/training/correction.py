"""Rollout correction: reweigh (TIS) or mask (MIS) tokens by proximal/behaviour, the generator/trainer mismatch.

The behaviour policy sampled a batch (the generator's logprobs, maybe another engine, dtype or an older version); the
proximal policy is the trainer's weights at the start of the step. Their ratio w = π_prox / π_behav per token (or
per sequence, the product over its tokens) corrects the gradient for the mismatch:

    tis: the loss of each token (sequence) is multiplied by the detached min(w, cap)
    mis: tokens (sequences) whose w falls outside [1/cap, cap] are dropped from the loss
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MODES = ("none", "tis", "mis")
LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class RolloutCorrection:
    """Config section `rollout_correction`: mode none | tis | mis, level token | sequence, cap > 1."""

    mode: str = "none"
    level: str = "token"
    cap: float = 2.0

    def validate(self, where: str = "rollout_correction") -> None:
        if self.mode not in MODES:
            raise ValueError(f"{where}.mode {self.mode!r} unknown; choose one of {MODES}")
        if self.level not in LEVELS:
            raise ValueError(f"{where}.level {self.level!r} unknown; choose one of {LEVELS}")
        if not (isinstance(self.cap, (int, float)) and math.isfinite(self.cap) and self.cap > 1.0):
            raise ValueError(f"{where}.cap must be a number > 1 (weights are capped at cap, MIS keeps [1/cap, cap]), "
                             f"e.g. 2.0; got {self.cap!r}")

    @property
    def enabled(self) -> bool:
        return self.mode != "none"


@dataclass
class Correction:
    """What the loss gets: per-token weights [B, T] (TIS) or None, and the mask of tokens that stay [B, T]."""

    token_weights: torch.Tensor | None
    mask: torch.Tensor
    metrics: dict[str, float]


def mismatch_metrics(proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The behaviour/proximal mismatch over real tokens: k3 KL(behav || prox) and the max |Δ logprob|."""
    mask = mask.bool()
    if not mask.any():
        return {"rollout/behaviour_kl_k3": 0.0, "rollout/behaviour_logprob_diff_max": 0.0}
    delta = (proximal.double() - behaviour.double())[mask]  # log(π_prox / π_behav) per token
    # k3 estimate of KL(behav || prox) from samples of behav: E[w - 1 - log w], w = π_prox / π_behav
    k3 = torch.expm1(delta) - delta
    return {"rollout/behaviour_kl_k3": k3.mean().item(), "rollout/behaviour_logprob_diff_max": delta.abs().max().item()}


def log_weights(proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """log(π_prox / π_behav) per token [B, T], or per sequence (the sum over its tokens) broadcast to [B, T]."""
    delta = torch.where(mask, proximal.double() - behaviour.double(), torch.zeros((), dtype=torch.float64))
    if level == "sequence":
        delta = delta.sum(-1, keepdim=True).expand_as(delta)
    return delta


def correct_rollout(proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor,
                    rc: RolloutCorrection) -> Correction:
    """Weights or mask for proximal/behaviour logprobs [B, T] (both detached); metrics rollout/is_*."""
    mask = mask.bool()
    metrics = mismatch_metrics(proximal, behaviour, mask)
    if not rc.enabled:
        return Correction(None, mask, metrics)
    lw = log_weights(proximal, behaviour, mask, rc.level)
    # in log space: a sequence's product of ratios overflows a float long before its log does
    w = torch.exp(lw.clamp(max=math.log(rc.cap) + 1.0))
    real = w[mask]
    n = max(int(mask.sum()), 1)
    metrics["rollout/is_weight_mean"] = real.mean().item() if real.numel() else 1.0
    metrics["rollout/is_weight_max"] = real.max().item() if real.numel() else 1.0
    if rc.mode == "tis":
        truncated = (lw > math.log(rc.cap)) & mask
        metrics["rollout/is_truncated_frac"] = truncated.sum().item() / n
        return Correction(torch.clamp(w, max=rc.cap).to(proximal.dtype), mask, metrics)
    inside = (lw >= -math.log(rc.cap)) & (lw <= math.log(rc.cap))
    metrics["rollout/is_masked_frac"] = (mask & ~inside).sum().item() / n
    return Correction(None, mask & inside, metrics)
