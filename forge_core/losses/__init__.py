"""Policy losses by name: `get_loss(name, **hyperparams)`; a custom loss is named by `module.path:ClassName`."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from forge_core.imports import import_object
from forge_core.losses.base import PolicyLoss
from forge_core.losses.cispo import CISPOLoss
from forge_core.losses.dapo import DAPOLoss
from forge_core.losses.grpo import DrGRPOLoss, GRPOLoss, SimpleGRPOLoss
from forge_core.losses.gspo import GSPOLoss, GSPOTokenLoss
from forge_core.losses.reinforce import ReinforceLoss
from forge_core.losses.sapo import SAPOLoss
from forge_core.losses.sft import SFTLoss

LOSSES: dict[str, Callable[..., nn.Module]] = {
    "grpo": GRPOLoss,
    "dr_grpo": DrGRPOLoss,
    "dapo": DAPOLoss,
    "gspo": GSPOLoss,
    "gspo_token": GSPOTokenLoss,
    "cispo": CISPOLoss,
    "sapo": SAPOLoss,
    "reinforce": ReinforceLoss,
    "simple_grpo": SimpleGRPOLoss,
    "sft": SFTLoss,
}

__all__ = ["LOSSES", "PolicyLoss", "get_loss", "import_object"] + [c.__name__ for c in LOSSES.values()]


def get_loss(name: str, **hyperparams) -> nn.Module:
    """Build a loss module by registered name or `module.path:ClassName` with the given hyperparameters."""
    if name in LOSSES:
        factory = LOSSES[name]
    elif ":" in name:
        factory = import_object(name, "loss.name")
    else:
        raise ValueError(f"unknown loss.name {name!r}; choose one of {sorted(LOSSES)} or 'module.path:ClassName'")
    try:
        loss = factory(**hyperparams)
    except TypeError as exc:
        raise ValueError(f"loss {name!r} rejected hyperparameters {sorted(hyperparams)}: {exc}") from exc
    if not isinstance(loss, nn.Module):
        raise ValueError(f"loss {name!r} must build a torch.nn.Module; got {type(loss).__name__}")
    if not hasattr(loss, "metrics"):
        loss.metrics = {}
    return loss
