"""REINFORCE with an optional truncated importance weight."""

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


class ReinforceLoss(PolicyLoss):
    """Per token -A·lp (times sg(min(r, clip_ratio)) when clip_ratio is set), token-mean."""

    def __init__(self, clip_ratio: float | None = None, beta: float = 0.0, kl_estimator: str = "k3",
                 aggregation: str = "token-mean", max_len: int | None = None, kl_gradient: str = "standard") -> None:
        super().__init__(aggregation, max_len)
        self.check(clip_ratio=clip_ratio, kl_estimator=kl_estimator, kl_gradient=kl_gradient)
        self.clip_ratio, self.beta, self.kl_estimator, self.kl_gradient = clip_ratio, beta, kl_estimator, kl_gradient

    @classmethod
    def check(cls, **hyperparams) -> None:
        """The shared checks, and clip_ratio > 0 (or None)."""
        super().check(**hyperparams)
        if hyperparams.get("clip_ratio") is not None and hyperparams["clip_ratio"] <= 0:
            raise ValueError(f"loss.clip_ratio must be > 0 (e.g. 2.0) or null; got {hyperparams['clip_ratio']}")

    def forward(self, logprobs, ref_logprobs, advantages, padding_mask, old_logprobs=None, *,
                num_tokens=None, num_seqs=None, token_weights=None, behaviour_logprobs=None) -> torch.Tensor:
        """Scalar loss from [B, T] inputs."""
        mask = check_shapes(logprobs, padding_mask, ref_logprobs=ref_logprobs, old_logprobs=old_logprobs,
                            behaviour_logprobs=behaviour_logprobs)
        adv = broadcast_advantages(advantages, logprobs)
        ratio = torch.exp(log_ratio(logprobs, old_logprobs, mask)).detach()
        lp = torch.where(mask, logprobs, torch.zeros_like(logprobs))
        per_token = -adv * lp
        self.metrics = {**ratio_metrics(ratio, mask), "clip_frac_low": 0.0, "clip_frac_high": 0.0}
        if self.clip_ratio is not None:
            per_token = per_token * torch.clamp(ratio, max=self.clip_ratio)
            self.metrics["clip_frac_high"] = masked_fraction(ratio > self.clip_ratio, mask)
        per_token = self.weigh(per_token, token_weights)
        per_token = self.add_kl(per_token, logprobs, ref_logprobs, mask, self.beta, self.kl_estimator,
                                sampling_logprobs(old_logprobs, behaviour_logprobs))
        return self.reduce(per_token, mask, num_tokens, num_seqs)
