"""Rollout correction: reweigh (TIS) or mask (MIS) tokens by proximal/behaviour, the generator/trainer mismatch.

The behaviour policy sampled a batch (the generator's logprobs, maybe another engine, dtype or an older version); the
proximal policy is the trainer's weights at the start of the step. Their ratio w = π_prox / π_behav per token (or
per sequence, the product over its tokens) corrects the gradient for the mismatch:

    tis:       the loss of each token (sequence) is multiplied by the detached clamp(w, cap_low, cap)
    mis:       tokens (sequences) whose w falls outside [cap_low, cap] leave the loss, and the ones kept are
               multiplied by their detached w (masked importance sampling, as IcePop and verl define it)
    rejection: the same mask, without the weight on the tokens kept (rejection sampling: biased on the survivors)

Level geometric (mis, rejection): a sequence is kept or dropped by the geometric mean of its token ratios,
exp(mean log w), and the tokens of a kept sequence carry their own token-level weights (mis).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MODES = ("none", "tis", "mis", "rejection")
LEVELS = ("token", "sequence", "geometric")
WEIGHTED = ("tis", "mis")  # modes that hand the loss token_weights


@dataclass(frozen=True)
class RolloutCorrection:
    """Config section `rollout_correction`: mode none | tis | mis | rejection, level token | sequence | geometric,
    cap > 1, cap_low in [0, 1) (None: 1/cap for mis and rejection, no lower bound for tis)."""

    mode: str = "none"
    level: str = "token"
    cap: float = 2.0
    cap_low: float | None = None

    def validate(self, where: str = "rollout_correction") -> None:
        if self.mode not in MODES:
            raise ValueError(f"{where}.mode {self.mode!r} unknown; choose one of {MODES}")
        if self.level not in LEVELS:
            raise ValueError(f"{where}.level {self.level!r} unknown; choose one of {LEVELS}")
        if not (isinstance(self.cap, (int, float)) and math.isfinite(self.cap) and self.cap > 1.0):
            raise ValueError(f"{where}.cap must be a number > 1 (weights are capped at cap, MIS keeps [1/cap, cap]), "
                             f"e.g. 2.0; got {self.cap!r}")
        low = self.cap_low
        if low is not None and not (isinstance(low, (int, float)) and math.isfinite(low) and 0.0 <= low < 1.0):
            raise ValueError(f"{where}.cap_low must be a number in [0, 1) (the lowest weight kept), e.g. 0.5, or "
                             f"null for the default; got {low!r}")
        if self.level == "geometric" and self.mode == "tis":
            raise ValueError(f"{where}.level geometric masks whole sequences: use it with mode mis or rejection, or "
                             "use level token or sequence with tis")

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    @property
    def weighted(self) -> bool:
        """Whether the loss gets token_weights (its forward must take them)."""
        return self.mode in WEIGHTED

    @property
    def low(self) -> float:
        """The lowest weight kept (mis, rejection) or the floor of the weights (tis; 0: none)."""
        if self.cap_low is not None:
            return float(self.cap_low)
        return 0.0 if self.mode == "tis" else 1.0 / self.cap


@dataclass
class Correction:
    """What the loss gets: per-token weights [B, T] (TIS) or None, and the mask of tokens that stay [B, T]."""

    token_weights: torch.Tensor | None
    mask: torch.Tensor
    metrics: dict[str, float]


def mismatch_tensors(proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The behaviour/proximal mismatch over real tokens as 0-dim tensors (no host synchronisation): k3 KL(behav ||
    prox) and the max |Δ logprob| (0 with no real token)."""
    mask = mask.bool()
    delta = torch.where(mask, proximal.double() - behaviour.double(), 0.0)  # log(π_prox / π_behav) per token
    # k3 estimate of KL(behav || prox) from samples of behav: E[w - 1 - log w], w = π_prox / π_behav
    k3 = torch.where(mask, torch.expm1(delta) - delta, 0.0)
    return {"rollout/behaviour_kl_k3": k3.sum() / mask.sum().clamp(min=1),
            "rollout/behaviour_logprob_diff_max": delta.abs().amax() if delta.numel() else delta.new_zeros(())}


def mismatch_metrics(proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """mismatch_tensors as floats."""
    found = mismatch_tensors(proximal, behaviour, mask)
    return dict(zip(found, torch.stack(list(found.values())).tolist(), strict=True))


def log_weights(proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """log(π_prox / π_behav) per token [B, T]; level sequence: the sum over the sequence's tokens, geometric: their
    mean, broadcast to [B, T] (float64)."""
    delta = torch.where(mask, proximal.double() - behaviour.double(), torch.zeros((), dtype=torch.float64))
    if level == "sequence":
        delta = delta.sum(-1, keepdim=True).expand_as(delta)
    elif level == "geometric":
        delta = (delta.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)).expand_as(delta)
    return delta


def correct_rollout(proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor,
                    rc: RolloutCorrection) -> Correction:
    """Weights and mask for proximal/behaviour logprobs [B, T] (both detached); metrics rollout/is_*."""
    mask = mask.bool()
    metrics = mismatch_metrics(proximal, behaviour, mask)
    if not rc.enabled:
        return Correction(None, mask, metrics)
    lw = log_weights(proximal, behaviour, mask, rc.level)
    # the weight a kept token is multiplied by: its own ratio (geometric keeps or drops whole sequences by their
    # mean, then weighs tokens one by one); in log space, as a sequence's product of ratios overflows a float
    weight_lw = log_weights(proximal, behaviour, mask, "token") if rc.level == "geometric" else lw
    w = torch.exp(weight_lw.clamp(max=math.log(rc.cap) + 1.0))
    real = w[mask]
    n = max(int(mask.sum()), 1)
    metrics["rollout/is_weight_mean"] = real.mean().item() if real.numel() else 1.0
    metrics["rollout/is_weight_max"] = real.max().item() if real.numel() else 1.0
    if rc.mode == "tis":
        truncated = (lw > math.log(rc.cap)) & mask
        metrics["rollout/is_truncated_frac"] = truncated.sum().item() / n
        return Correction(torch.clamp(w, min=rc.low, max=rc.cap).to(proximal.dtype), mask, metrics)
    low = math.log(rc.low) if rc.low > 0 else -math.inf
    inside = (lw >= low) & (lw <= math.log(rc.cap))
    kept = mask & inside
    metrics["rollout/is_masked_frac"] = (mask & ~inside).sum().item() / n
    if rc.mode == "rejection":
        return Correction(None, kept, metrics)
    # mis: on a kept token w ≤ cap already at token level; a geometric-kept sequence's tokens may exceed it: cap them
    return Correction(torch.where(kept, torch.clamp(w, max=rc.cap), 0.0).to(proximal.dtype), kept, metrics)
