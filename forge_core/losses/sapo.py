"""SAPO: a smooth sigmoid gate on the importance ratio instead of a hard clip."""

from __future__ import annotations

import torch

from forge_core.losses.base import (
    PolicyLoss,
    broadcast_advantages,
    check_shapes,
    log_ratio,
    ratio_metrics,
    sampling_logprobs,
)


class SAPOLoss(PolicyLoss):
    """Per token -f(r)·A with f(r) = sigmoid(tau·(r-1))·4/tau, tau = tau_pos if A > 0 else tau_neg."""

    def __init__(self, tau_pos: float = 1.0, tau_neg: float = 1.05, beta: float = 0.0, kl_estimator: str = "k3",
                 aggregation: str = "seq-mean-token-mean", max_len: int | None = None,
                 kl_gradient: str = "standard") -> None:
        super().__init__(aggregation, max_len)
        self.check(tau_pos=tau_pos, tau_neg=tau_neg, kl_estimator=kl_estimator, kl_gradient=kl_gradient)
        self.tau_pos, self.tau_neg, self.beta, self.kl_estimator = tau_pos, tau_neg, beta, kl_estimator
        self.kl_gradient = kl_gradient

    @classmethod
    def check(cls, **hyperparams) -> None:
        """The shared checks, and the gate temperatures tau_pos/tau_neg > 0."""
        super().check(**hyperparams)
        taus = [hyperparams.get(k) for k in ("tau_pos", "tau_neg") if hyperparams.get(k) is not None]
        if any(t <= 0 for t in taus):
            raise ValueError(f"loss.tau_pos/tau_neg must be > 0; got {hyperparams.get('tau_pos')}, "
                             f"{hyperparams.get('tau_neg')}")

    def forward(self, logprobs, ref_logprobs, advantages, padding_mask, old_logprobs=None, *,
                num_tokens=None, num_seqs=None, token_weights=None, behaviour_logprobs=None) -> torch.Tensor:
        """Scalar loss from [B, T] inputs."""
        mask = check_shapes(logprobs, padding_mask, ref_logprobs=ref_logprobs, old_logprobs=old_logprobs,
                            behaviour_logprobs=behaviour_logprobs)
        adv = broadcast_advantages(advantages, logprobs)
        ratio = torch.exp(log_ratio(logprobs, old_logprobs, mask))
        tau = torch.where(adv > 0, torch.full_like(adv, self.tau_pos), torch.full_like(adv, self.tau_neg))
        gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
        self.metrics = {**ratio_metrics(ratio, mask), "clip_frac_low": 0.0, "clip_frac_high": 0.0}
        per_token = self.add_kl(self.weigh(-gate * adv, token_weights), logprobs, ref_logprobs, mask, self.beta,
                                self.kl_estimator, sampling_logprobs(old_logprobs, behaviour_logprobs))
        return self.reduce(per_token, mask, num_tokens, num_seqs)
