"""A user-defined loss used by tests through `loss.name: tests.unit.custom_loss_example:ScaledReinforceLoss`."""

import torch
from torch import nn


class ScaledReinforceLoss(nn.Module):
    def __init__(self, scale: float = 1.0):
        super().__init__()
        self.scale = scale
        self.metrics = {}

    def forward(self, logprobs, ref_logprobs, advantages, padding_mask, old_logprobs=None, **_):
        mask = padding_mask.bool()
        adv = advantages.reshape(-1, 1) if advantages.dim() == 1 else advantages
        loss = -(self.scale * adv * torch.where(mask, logprobs, 0.0)).sum() / mask.sum().clamp(min=1)
        self.metrics = {"scale": self.scale}
        return loss


class NaNAtCallLoss(ScaledReinforceLoss):
    """Returns NaN from its `at`-th call on (one call per step with one micro-batch): a diverging run."""

    calls = 0

    def __init__(self, at: int = 3):
        super().__init__()
        self.at = at

    def forward(self, *args, **kwargs):
        NaNAtCallLoss.calls += 1
        loss = super().forward(*args, **kwargs)
        return loss * float("nan") if NaNAtCallLoss.calls >= self.at else loss


class NaNOnOneRankLoss(ScaledReinforceLoss):
    """NaN on rank `rank` of a multi-rank trainer only (one shard of the batch diverges)."""

    def __init__(self, rank: int = 1):
        super().__init__()
        self.rank = rank

    def forward(self, *args, **kwargs):
        import torch.distributed as dist

        loss = super().forward(*args, **kwargs)
        return loss * float("nan") if dist.is_initialized() and dist.get_rank() == self.rank else loss
