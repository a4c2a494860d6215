"""Supervised fine-tuning loss: masked token-mean cross-entropy of the target tokens."""

from __future__ import annotations

import torch

from forge_core.losses.base import PolicyLoss, check_shapes


class SFTLoss(PolicyLoss):
    """-mean(lp) over target tokens; `logprobs` are the model's logprobs of the reference tokens [B, T]."""

    def __init__(self, aggregation: str = "token-mean", max_len: int | None = None) -> None:
        super().__init__(aggregation, max_len)

    def forward(self, logprobs, ref_logprobs=None, advantages=None, padding_mask=None, old_logprobs=None, *,
                num_tokens=None, num_seqs=None) -> torch.Tensor:
        """Scalar cross-entropy; ref_logprobs, advantages and old_logprobs are ignored."""
        if padding_mask is None:
            padding_mask = torch.ones_like(logprobs, dtype=torch.bool)
        mask = check_shapes(logprobs, padding_mask)
        nll = -torch.where(mask, logprobs, torch.zeros_like(logprobs))
        loss = self.reduce(nll, mask, num_tokens, num_seqs)
        n = mask.sum().clamp(min=1)
        self.metrics = {"nll_mean": nll.detach().sum() / n}
        return loss
