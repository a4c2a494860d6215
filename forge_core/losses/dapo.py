"""DAPO loss: GRPO with clip-higher and token-mean over every token of the whole batch."""

from __future__ import annotations

from forge_core.losses.grpo import GRPOLoss


class DAPOLoss(GRPOLoss):
    """Clip-higher (0.2 / 0.28), token-level mean over the batch (normaliser = the batch's total token count)."""

    def __init__(self, clip_low: float = 0.2, clip_high: float = 0.28, beta: float = 0.0,
                 aggregation: str = "token-mean", **kwargs) -> None:
        super().__init__(clip_low=clip_low, clip_high=clip_high, beta=beta, aggregation=aggregation, **kwargs)
