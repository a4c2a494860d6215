"""Environments for multi-turn and tool-calling episodes: the contract (base.py), tool calls (tool_calls.py),
built-in environments and the token layer that turns episodes into training samples (episodes.py)."""

from __future__ import annotations

from collections.abc import Callable

from forge_core.envs.base import STATUSES, EnvConfig, Environment, StepResult
from forge_core.envs.calculator import CalculatorEnvironment
from forge_core.envs.guess import GuessEnvironment
from forge_core.imports import import_object


def make_openenv(**options):
    from forge_core.envs.openenv import OpenEnvEnvironment  # lazy: needs openenv-core

    return OpenEnvEnvironment(**options)


ENVIRONMENTS: dict[str, Callable[..., Environment]] = {
    "calculator": CalculatorEnvironment,
    "guess": GuessEnvironment,
    "openenv": make_openenv,
}


def environment_factory(name: str) -> Callable[..., Environment]:
    """The constructor of env.name: a registered name or an import path (allowed by the caller's plugin check)."""
    if name in ENVIRONMENTS:
        return ENVIRONMENTS[name]
    if ":" in name:
        return import_object(name, "env.name")
    raise ValueError(f"unknown env.name {name!r}; choose one of {sorted(ENVIRONMENTS)} or 'module.path:ClassName' "
                     "(listed under plugins:)")


def make_environment(config: EnvConfig) -> Environment:
    """A fresh environment of the configured kind (one per episode in flight)."""
    try:
        return environment_factory(config.name)(**config.options)
    except TypeError as exc:
        raise ValueError(f"env.options {sorted(config.options)} do not fit env.name {config.name!r}: {exc}") from exc


__all__ = ["ENVIRONMENTS", "STATUSES", "CalculatorEnvironment", "EnvConfig", "Environment", "GuessEnvironment",
           "StepResult", "environment_factory", "make_environment"]
