"""Policy losses by name: `get_loss(name, **hyperparams)`; a custom loss is named by `module.path:ClassName`."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from forge_core.imports import import_object
from forge_core.losses.base import PolicyLoss
from forge_core.losses.checks import check_hyperparameters, constructor_signature
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

__all__ = ["LOSSES", "PolicyLoss", "check_loss", "complete_hyperparameters", "get_loss", "implied_advantage",
           "import_object", "resolve_loss"] + [c.__name__ for c in LOSSES.values()]


def resolve_loss(name: str) -> Callable[..., nn.Module]:
    """The constructor behind loss `name`: a registered name or `module.path:ClassName`."""
    if name in LOSSES:
        return LOSSES[name]
    if ":" in name:
        return import_object(name, "loss.name")
    raise ValueError(f"unknown loss.name {name!r}; choose one of {sorted(LOSSES)} or 'module.path:ClassName'")


def complete_hyperparameters(name: str, hyperparams: dict, max_new_tokens: int) -> dict:
    """`hyperparams` with max_len set to the generator's token budget when the loss's aggregation (given, or its
    default, as Dr. GRPO's) normalises by it and no max_len is given."""
    _, defaults = constructor_signature(resolve_loss(name))
    if {**defaults, **hyperparams}.get("aggregation") == "seq-mean-token-sum-norm":
        return {"max_len": max_new_tokens, **hyperparams}
    return dict(hyperparams)


def implied_advantage(name: str) -> str | None:
    """The advantage estimator a registered loss implies when a config names none (no import happens here)."""
    return getattr(LOSSES.get(name), "implied_advantage", None)


def check_loss(name: str, **hyperparams) -> None:
    """Refuse an unknown loss, hyperparameter name or bad value without building the loss (the controller checks
    a config; the trainer builds the loss once). A custom loss's values are its constructor's to check."""
    check_hyperparameters(name, resolve_loss(name), hyperparams)


def get_loss(name: str, **hyperparams) -> nn.Module:
    """Build a loss module by registered name or `module.path:ClassName` with the given hyperparameters."""
    factory = resolve_loss(name)
    try:
        loss = factory(**hyperparams)
    except TypeError as exc:
        raise ValueError(f"loss {name!r} rejected hyperparameters {sorted(hyperparams)}: {exc}") from exc
    if not isinstance(loss, nn.Module):
        raise ValueError(f"loss {name!r} must build a torch.nn.Module; got {type(loss).__name__}")
    if not hasattr(loss, "metrics"):
        loss.metrics = {}
    return loss
