"""GSPO: sequence-level importance ratios (and the GSPO-token variant with per-token gradients)."""

from __future__ import annotations

from typing import ClassVar

import torch

from forge_core.losses.base import (
    PolicyLoss,
    broadcast_advantages,
    check_shapes,
    log_ratio,
    masked_fraction,
    masked_sum,
    ratio_metrics,
    sampling_logprobs,
)


def sequence_log_ratio(logprobs, old_logprobs, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked mean of (lp - old) per sequence [B] (gradient flows through the mean) and lengths [B]."""
    lengths = mask.sum(-1)
    return masked_sum(log_ratio(logprobs, old_logprobs, mask), mask, dim=-1) / lengths.clamp(min=1), lengths


def sequence_advantages(advantages, logprobs, mask) -> torch.Tensor:
    """One advantage per sequence [B] from [B], [B, 1] or [B, T] advantages; ValueError when a [B, T] row varies
    over its real tokens (per-turn credit, which one ratio per sequence cannot carry: averaging it would drop it)."""
    adv = broadcast_advantages(advantages, logprobs)
    if advantages.dim() == 2 and advantages.shape[-1] > 1:
        high = torch.where(mask, adv, float("-inf")).amax(-1)
        low = torch.where(mask, adv, float("inf")).amin(-1)
        if bool(((high - low) > 0).any()):
            raise ValueError("GSPO weighs a whole sequence by one importance ratio and one advantage, and got "
                             "per-token advantages that vary within a sequence (env.credit: turn): use loss.name "
                             "gspo_token (per-token advantages) or env.credit: episode")
    return masked_sum(adv, mask, dim=-1) / mask.sum(-1).clamp(min=1)


class GSPOLoss(PolicyLoss):
    """Per sequence max(-A·s, -A·clip(s, 1-clip_low, 1+clip_high)), s = exp(mean token log-ratio); seq mean."""

    # one advantage per sequence: per-token advantages (env.credit: turn) are refused at config load
    # (infra/config_checks.py reads this with getattr(loss_class, "sequence_level", False))
    sequence_level: ClassVar[bool] = True

    def __init__(self, clip_low: float = 3e-4, clip_high: float = 4e-4, beta: float = 0.0,
                 kl_estimator: str = "k3", kl_gradient: str = "standard") -> None:
        super().__init__("seq-mean-token-mean")
        self.check(clip_low=clip_low, clip_high=clip_high, kl_estimator=kl_estimator, kl_gradient=kl_gradient)
        self.clip_low, self.clip_high, self.beta, self.kl_estimator = clip_low, clip_high, beta, kl_estimator
        self.kl_gradient = kl_gradient

    def forward(self, logprobs, ref_logprobs, advantages, padding_mask, old_logprobs=None, *,
                num_tokens=None, num_seqs=None, token_weights=None, behaviour_logprobs=None) -> torch.Tensor:
        """Scalar loss from [B, T] inputs; sequences without real tokens are excluded from the mean."""
        mask = check_shapes(logprobs, padding_mask, ref_logprobs=ref_logprobs, old_logprobs=old_logprobs,
                            behaviour_logprobs=behaviour_logprobs)
        seq_lr, lengths = sequence_log_ratio(logprobs, old_logprobs, mask)
        adv = sequence_advantages(advantages, logprobs, mask)
        s = torch.exp(seq_lr)
        per_seq = torch.maximum(-adv * s, -adv * torch.clamp(s, 1.0 - self.clip_low, 1.0 + self.clip_high))
        if token_weights is not None:  # a sequence's weight: the mean of its tokens' (one value with level sequence)
            per_seq = per_seq * (masked_sum(token_weights.detach(), mask, dim=-1) / lengths.clamp(min=1))
        valid = lengths > 0
        self.metrics = {
            **ratio_metrics(s.unsqueeze(-1), valid.unsqueeze(-1)),
            "clip_frac_low": masked_fraction((s < 1.0 - self.clip_low) & (adv < 0), valid),
            "clip_frac_high": masked_fraction((s > 1.0 + self.clip_high) & (adv > 0), valid),
        }
        denom = num_seqs if num_seqs is not None else valid.sum().clamp(min=1)
        loss = masked_sum(per_seq, valid) / denom
        if ref_logprobs is not None or self.beta != 0.0:
            kl = self.add_kl(torch.zeros_like(logprobs), logprobs, ref_logprobs, mask, self.beta, self.kl_estimator,
                             sampling_logprobs(old_logprobs, behaviour_logprobs))
            loss = loss + self.reduce(kl, mask, num_tokens, num_seqs)
        return loss


class GSPOTokenLoss(GSPOLoss):
    """GSPO-token: s_i,t = sg(s_i)·exp(lp - sg(lp)); same value as GSPO, gradient per token; seq-mean-token-mean."""

    sequence_level: ClassVar[bool] = False  # each token's term takes its own advantage (GSPO paper, GSPO-token)

    def forward(self, logprobs, ref_logprobs, advantages, padding_mask, old_logprobs=None, *,
                num_tokens=None, num_seqs=None, token_weights=None, behaviour_logprobs=None) -> torch.Tensor:
        """Scalar loss; advantages may be per token [B, T]."""
        mask = check_shapes(logprobs, padding_mask, ref_logprobs=ref_logprobs, old_logprobs=old_logprobs,
                            behaviour_logprobs=behaviour_logprobs)
        seq_lr, lengths = sequence_log_ratio(logprobs, old_logprobs, mask)
        s_tok = torch.exp(seq_lr.detach()).unsqueeze(-1) * torch.exp(log_ratio(logprobs, None, mask))
        adv = broadcast_advantages(advantages, logprobs)
        clipped = torch.clamp(s_tok, 1.0 - self.clip_low, 1.0 + self.clip_high)
        per_token = torch.maximum(-adv * s_tok, -adv * clipped)
        self.metrics = {
            **ratio_metrics(s_tok, mask),
            "clip_frac_low": masked_fraction((s_tok < 1.0 - self.clip_low) & (adv < 0), mask),
            "clip_frac_high": masked_fraction((s_tok > 1.0 + self.clip_high) & (adv > 0), mask),
        }
        per_token = self.weigh(per_token, token_weights)
        per_token = self.add_kl(per_token, logprobs, ref_logprobs, mask, self.beta, self.kl_estimator,
                                sampling_logprobs(old_logprobs, behaviour_logprobs))
        return self.reduce(per_token, mask, num_tokens, num_seqs)
