"""Reward functions: any callable (prompt, response, target) -> float, combined with weights by `CombinedReward`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from forge_core.rewards.math import DigitMatchReward, MathReward, extract_answer, parse_number, parse_target
from forge_core.rewards.thinking import OverlongPenalty, ThinkingReward, soft_overlong_punishment

log = logging.getLogger(__name__)

RewardFn = Callable[[str, str, str], float]

REWARDS: dict[str, Callable[..., RewardFn]] = {
    "math": MathReward,
    "digits": DigitMatchReward,
    "thinking": ThinkingReward,
    "overlong": OverlongPenalty,
}

__all__ = [
    "REWARDS", "CombinedReward", "DigitMatchReward", "MathReward", "OverlongPenalty", "RewardScore", "ThinkingReward",
    "build_reward", "extract_answer", "parse_number", "parse_target", "soft_overlong_punishment",
]


def build_reward(name: str, **kwargs) -> RewardFn:
    """A reward function by registered name (with kwargs) or by import path `module.path:name`."""
    if name in REWARDS:
        return REWARDS[name](**kwargs)
    if ":" in name:
        from forge_core.imports import import_object

        obj = import_object(name, "rewards[].name")
        fn = obj(**kwargs) if isinstance(obj, type) else obj
        if kwargs and not isinstance(obj, type):
            raise ValueError(f"reward {name!r} is a function; it takes no options, got {sorted(kwargs)}")
        if not callable(fn):
            raise ValueError(f"reward {name!r} is not callable")
        return fn
    raise ValueError(f"unknown reward {name!r}; choose one of {sorted(REWARDS)} or 'module.path:name'")


@dataclass
class RewardScore:
    """Weighted total plus each function's raw score; `errors` maps the functions that raised to their error."""

    total: float
    breakdown: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


class CombinedReward:
    """Weighted sum of named reward functions; a function that raises scores `fallback` and is counted."""

    def __init__(self, functions: list[tuple[str, RewardFn, float]], fallback: float = 0.0) -> None:
        if not functions:
            raise ValueError("rewards: at least one reward function is needed, e.g. [{name: math, weight: 1.0}]")
        names = [n for n, _, _ in functions]
        if len(set(names)) != len(names):
            raise ValueError(f"rewards: duplicate names {names}; give each entry a distinct `key`")
        self.functions, self.fallback = functions, fallback
        self.error_count = 0

    @classmethod
    def from_config(cls, entries: list[dict], fallback: float = 0.0) -> CombinedReward:
        """Build from config entries like {name: math, weight: 1.0, key: optional, ...kwargs}."""
        functions = []
        for i, entry in enumerate(entries):
            entry = dict(entry)
            if "name" not in entry:
                raise ValueError(f"rewards[{i}] has no 'name'; e.g. {{name: math, weight: 1.0}}")
            name, weight = entry.pop("name"), float(entry.pop("weight", 1.0))
            key = entry.pop("key", name.rsplit(":", 1)[-1])
            functions.append((key, build_reward(name, **entry), weight))
        return cls(functions, fallback)

    def score(self, prompt: str, response: str, target: str) -> RewardScore:
        """Score one episode with every function."""
        result = RewardScore(0.0)
        for name, fn, weight in self.functions:
            try:
                value = float(fn(prompt, response, target))
            except Exception as exc:  # a user's reward must not crash the run; it is logged and counted
                log.warning("reward %s raised %s: %s; scoring %s", name, type(exc).__name__, exc, self.fallback)
                self.error_count += 1
                result.errors[name] = f"{type(exc).__name__}: {exc}"
                value = self.fallback
            result.breakdown[name] = value
            result.total += weight * value
        return result

    def score_batch(self, episodes: list[tuple[str, str, str]]) -> list[RewardScore]:
        """`score` for each (prompt, response, target)."""
        return [self.score(*e) for e in episodes]

    def __call__(self, prompt: str, response: str, target: str) -> float:
        return self.score(prompt, response, target).total
