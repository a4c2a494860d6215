"""Environments for multi-turn and tool-calling episodes: the contract (base.py), tool calls (tool_calls.py),
built-in environments and the token layer that turns episodes into training samples (episodes.py)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from forge_core.envs.base import STATUSES, EnvConfig, Environment, StepResult
from forge_core.envs.calculator import CalculatorEnvironment
from forge_core.envs.guess import GuessEnvironment
from forge_core.imports import import_object


def make_openenv(**options):
    from forge_core.envs.openenv import OpenEnvEnvironment  # lazy: needs openenv-core

    check_options(OpenEnvEnvironment, options, "openenv")
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


def check_options(factory: Callable[..., Any], options: dict[str, Any], name: str) -> None:
    """ValueError when env.options do not fit the constructor's signature (checked before it runs, so that a
    TypeError raised inside a constructor surfaces as the bug it is, never as a config error)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a callable without an introspectable signature: its call is the check
        return
    try:
        signature.bind(**options)
    except TypeError as exc:
        raise ValueError(f"env.options {sorted(options)} do not fit env.name {name!r} {signature}: {exc}; "
                         "fix the keys under env.options") from exc


def make_environment(config: EnvConfig) -> Environment:
    """A fresh environment of the configured kind (one per episode in flight)."""
    factory = environment_factory(config.name)
    check_options(factory, config.options, config.name)
    return factory(**config.options)


__all__ = ["ENVIRONMENTS", "STATUSES", "CalculatorEnvironment", "EnvConfig", "Environment", "GuessEnvironment",
           "StepResult", "check_options", "environment_factory", "make_environment"]
