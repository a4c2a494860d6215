"""CISPO: clipped, detached importance-sampling weights on a REINFORCE objective (no token's gradient is zeroed)."""

from __future__ import annotations

import torch

from forge_core.losses.base import (
    PolicyLoss,
    broadcast_advantages,
    check_shapes,
    log_ratio,
    masked_fraction,
    ratio_metrics,
    sampling_logprobs,
)


class CISPOLoss(PolicyLoss):
    """Per token -sg(clip(r, 1-clip_low, 1+clip_high))·A·lp, token-mean over the batch."""

    def __init__(self, clip_low: float | None = None, clip_high: float = 4.0, beta: float = 0.0,
                 kl_estimator: str = "k3", aggregation: str = "token-mean", max_len: int | None = None,
                 kl_gradient: str = "standard") -> None:
        super().__init__(aggregation, max_len)
        self.check(clip_low=clip_low, clip_high=clip_high, kl_estimator=kl_estimator, kl_gradient=kl_gradient)
        self.clip_low, self.clip_high, self.beta, self.kl_estimator = clip_low, clip_high, beta, kl_estimator
        self.kl_gradient = kl_gradient

    def forward(self, logprobs, ref_logprobs, advantages, padding_mask, old_logprobs=None, *,
                num_tokens=None, num_seqs=None, token_weights=None, behaviour_logprobs=None) -> torch.Tensor:
        """Scalar loss from [B, T] inputs and advantages [B]|[B, 1]|[B, T]."""
        mask = check_shapes(logprobs, padding_mask, ref_logprobs=ref_logprobs, old_logprobs=old_logprobs,
                            behaviour_logprobs=behaviour_logprobs)
        adv = broadcast_advantages(advantages, logprobs)
        ratio = torch.exp(log_ratio(logprobs, old_logprobs, mask)).detach()
        low = None if self.clip_low is None else 1.0 - self.clip_low
        weight = torch.clamp(ratio, min=low, max=1.0 + self.clip_high)
        lp = torch.where(mask, logprobs, torch.zeros_like(logprobs))
        per_token = -weight * adv * lp
        self.metrics = {
            **ratio_metrics(ratio, mask),
            "clip_frac_low": 0.0 if low is None else masked_fraction(ratio < low, mask),
            "clip_frac_high": masked_fraction(ratio > 1.0 + self.clip_high, mask),
        }
        per_token = self.weigh(per_token, token_weights)
        per_token = self.add_kl(per_token, logprobs, ref_logprobs, mask, self.beta, self.kl_estimator,
                                sampling_logprobs(old_logprobs, behaviour_logprobs))
        return self.reduce(per_token, mask, num_tokens, num_seqs)
