"""Checking a loss's hyperparameters without building it (the controller's check; only the trainer builds the loss):
the names its constructor accepts, and the values its own `check` classmethod refuses."""

from __future__ import annotations

import inspect

from forge_core.losses.base import PolicyLoss


def constructor_signature(factory) -> tuple[set[str] | None, dict]:
    """(the keyword arguments a loss accepts, their defaults), following `**kwargs` up to the parent constructor
    (the subclass's defaults win); names are None when it takes any keyword (a `**kwargs` with no parent to follow)."""
    names: set[str] = set()
    defaults: dict = {}
    for cls in (inspect.getmro(factory) if inspect.isclass(factory) else (factory,)):
        if inspect.isclass(cls) and "__init__" not in vars(cls):
            continue
        params = inspect.signature(cls.__init__ if inspect.isclass(cls) else cls).parameters.values()
        named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"]
        names |= {p.name for p in named}
        for p in named:
            if p.default is not p.empty:
                defaults.setdefault(p.name, p.default)
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return names, defaults
        if not inspect.isclass(cls) or cls.__mro__[1] is object:
            return None, defaults
    return None, defaults


def check_hyperparameters(name: str, factory, hyperparams: dict) -> None:
    """Unknown hyperparameter names and bad values of loss `name` (with its defaults), found without building it."""
    names, defaults = constructor_signature(factory)
    unknown = sorted(set(hyperparams) - names) if names is not None else []
    if unknown:
        raise ValueError(f"loss {name!r} rejected hyperparameters {unknown}: it accepts {sorted(names)}")
    if isinstance(factory, type) and issubclass(factory, PolicyLoss):  # a custom loss's values are its own to check
        factory.check(**{**defaults, **hyperparams})
