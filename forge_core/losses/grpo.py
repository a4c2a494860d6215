"""GRPO family: clipped surrogate (PPO-style) with optional KL to a reference, Dr. GRPO, and the simple on-policy form."""

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


class GRPOLoss(PolicyLoss):
    """Per token max(-A·r, -A·clip(r, 1-clip_low, 1+clip_high)) (+ dual clip for A<0) + beta·KL, aggregated."""

    def __init__(
        self,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        beta: float = 0.0,
        kl_estimator: str = "k3",
        aggregation: str = "seq-mean-token-mean",
        max_len: int | None = None,
        clip_ratio_c: float | None = None,
        kl_gradient: str = "standard",
    ) -> None:
        super().__init__(aggregation, max_len)
        self.check(kl_estimator=kl_estimator, clip_low=clip_low, clip_high=clip_high, clip_ratio_c=clip_ratio_c,
                   kl_gradient=kl_gradient)
        self.clip_low, self.clip_high, self.beta = clip_low, clip_high, beta
        self.kl_estimator, self.clip_ratio_c, self.kl_gradient = kl_estimator, clip_ratio_c, kl_gradient

    @classmethod
    def check(cls, **hyperparams) -> None:
        """The shared checks, and clip_ratio_c (dual clip) > 1."""
        super().check(**hyperparams)
        if hyperparams.get("clip_ratio_c") is not None and hyperparams["clip_ratio_c"] <= 1.0:
            raise ValueError(f"loss.clip_ratio_c must be > 1 (dual clip, e.g. 3.0); got {hyperparams['clip_ratio_c']}")

    def forward(
        self,
        logprobs: torch.Tensor,
        ref_logprobs: torch.Tensor | None,
        advantages: torch.Tensor,
        padding_mask: torch.Tensor,
        old_logprobs: torch.Tensor | None = None,
        *,
        num_tokens: float | None = None,
        num_seqs: float | None = None,
        token_weights: torch.Tensor | None = None,
        behaviour_logprobs: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Scalar loss from logprobs/old/ref/mask [B, T] and advantages [B]|[B, 1]|[B, T]; behaviour_logprobs [B, T]:
        the sampler's, which the unbiased KL weighs by (old_logprobs when None)."""
        mask = check_shapes(logprobs, padding_mask, ref_logprobs=ref_logprobs, old_logprobs=old_logprobs,
                            behaviour_logprobs=behaviour_logprobs)
        adv = broadcast_advantages(advantages, logprobs)
        ratio = torch.exp(log_ratio(logprobs, old_logprobs, mask))
        unclipped = -adv * ratio
        clipped = -adv * torch.clamp(ratio, 1.0 - self.clip_low, 1.0 + self.clip_high)
        per_token = torch.maximum(unclipped, clipped)
        self.metrics = {
            **ratio_metrics(ratio, mask),
            "clip_frac_low": masked_fraction((ratio < 1.0 - self.clip_low) & (adv < 0), mask),
            "clip_frac_high": masked_fraction((ratio > 1.0 + self.clip_high) & (adv > 0), mask),
        }
        if self.clip_ratio_c is not None:
            capped = torch.minimum(per_token, -adv * self.clip_ratio_c)
            self.metrics["clip_frac_dual"] = masked_fraction((per_token > capped) & (adv < 0), mask)
            per_token = torch.where(adv < 0, capped, per_token)
        per_token = self.weigh(per_token, token_weights)
        per_token = self.add_kl(per_token, logprobs, ref_logprobs, mask, self.beta, self.kl_estimator,
                                sampling_logprobs(old_logprobs, behaviour_logprobs))
        return self.reduce(per_token, mask, num_tokens, num_seqs)


class DrGRPOLoss(GRPOLoss):
    """Dr. GRPO: GRPO with token sums normalised by batch × max_len (no length bias), on mean-only advantages."""

    implied_advantage = "dr_grpo"

    def __init__(self, max_len: int | None = None, aggregation: str = "seq-mean-token-sum-norm", **kwargs) -> None:
        super().__init__(max_len=max_len, aggregation=aggregation, **kwargs)


class SimpleGRPOLoss(PolicyLoss):
    """On-policy GRPO: -(exp(lp - sg(lp))·A - beta·k3), seq-mean-token-mean."""

    def __init__(self, beta: float = 0.1, kl_estimator: str = "k3", aggregation: str = "seq-mean-token-mean",
                 max_len: int | None = None, kl_gradient: str = "standard") -> None:
        super().__init__(aggregation, max_len)
        self.check(kl_estimator=kl_estimator, kl_gradient=kl_gradient)
        self.beta, self.kl_estimator, self.kl_gradient = beta, kl_estimator, kl_gradient

    def forward(self, logprobs, ref_logprobs, advantages, padding_mask, old_logprobs=None, *,
                num_tokens=None, num_seqs=None, token_weights=None, behaviour_logprobs=None) -> torch.Tensor:
        """Scalar loss; old_logprobs is ignored (this form is on-policy by definition); the unbiased KL weighs by
        behaviour_logprobs [B, T] when given (the sampler's), else by the current policy (weight 1)."""
        mask = check_shapes(logprobs, padding_mask, ref_logprobs=ref_logprobs, behaviour_logprobs=behaviour_logprobs)
        adv = broadcast_advantages(advantages, logprobs)
        ratio = torch.exp(log_ratio(logprobs, None, mask))
        self.metrics = {**ratio_metrics(ratio, mask), "clip_frac_low": 0.0, "clip_frac_high": 0.0}
        per_token = self.add_kl(self.weigh(-ratio * adv, token_weights), logprobs, ref_logprobs, mask, self.beta,
                                self.kl_estimator, behaviour_logprobs)
        return self.reduce(per_token, mask, num_tokens, num_seqs)
