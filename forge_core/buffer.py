"""Replay buffer of rollout groups with a maximum policy age; sampling/eviction policies are plain functions."""

from __future__ import annotations

import random
from collections.abc import Callable

from forge_core.types import Group


def group_version(group: Group) -> int:
    """The oldest policy version that produced any episode of the group."""
    return min(e.completion.policy_version for e in group.episodes)


def is_fresh(version: int, current_version: int, max_age: int) -> bool:
    """A rollout from `version` may train policy `current_version` when it is at most `max_age` versions old."""
    return current_version - version <= max_age


def evict_stale(items: list[Group], current_version: int, max_age: int) -> tuple[list[Group], int]:
    """(fresh items, number evicted)."""
    kept = [g for g in items if is_fresh(group_version(g), current_version, max_age)]
    return kept, len(items) - len(kept)


def sample_fifo(items: list[Group], n: int, rng: random.Random | None = None) -> tuple[list[Group], list[Group]]:
    """Oldest first: (batch, rest)."""
    return items[:n], items[n:]


def sample_uniform(items: list[Group], n: int, rng: random.Random | None = None) -> tuple[list[Group], list[Group]]:
    """Uniformly without replacement: (batch, rest in original order)."""
    rng = rng or random.Random(0)
    chosen = set(rng.sample(range(len(items)), min(n, len(items))))
    return [g for i, g in enumerate(items) if i in chosen], [g for i, g in enumerate(items) if i not in chosen]


def sample_freshest(items: list[Group], n: int, rng: random.Random | None = None) -> tuple[list[Group], list[Group]]:
    """Newest policy version first: (batch, rest)."""
    order = sorted(range(len(items)), key=lambda i: -group_version(items[i]))
    chosen = set(order[:n])
    return [items[i] for i in order[:n]], [g for i, g in enumerate(items) if i not in chosen]


SAMPLERS: dict[str, Callable] = {"fifo": sample_fifo, "uniform": sample_uniform, "freshest": sample_freshest}


class ReplayBuffer:
    """Holds groups until they are sampled or become older than `max_policy_age` versions."""

    def __init__(self, max_policy_age: int = 0, sampler: str = "fifo", capacity: int = 100_000, seed: int = 0) -> None:
        if max_policy_age < 0:
            raise ValueError(f"max_policy_age must be >= 0; got {max_policy_age}")
        if sampler not in SAMPLERS:
            raise ValueError(f"unknown buffer sampler {sampler!r}; choose one of {sorted(SAMPLERS)}")
        self.max_policy_age, self.sampler, self.capacity = max_policy_age, sampler, capacity
        self.items: list[Group] = []
        self.evicted = 0
        self.rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.items)

    def add(self, groups: list[Group]) -> None:
        """Append groups; the oldest are dropped beyond capacity (and counted as evicted)."""
        self.items.extend(groups)
        overflow = len(self.items) - self.capacity
        if overflow > 0:
            self.items = self.items[overflow:]
            self.evicted += overflow

    def sample(self, n: int, current_version: int) -> list[Group]:
        """Up to n fresh groups for training policy `current_version`; stale groups are evicted first."""
        self.items, dropped = evict_stale(self.items, current_version, self.max_policy_age)
        self.evicted += dropped
        batch, self.items = SAMPLERS[self.sampler](self.items, n, self.rng)
        return batch

    def state_dict(self) -> dict:
        """Contents and sampler RNG, for exact resume."""
        return {"items": list(self.items), "evicted": self.evicted, "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self.items, self.evicted = list(state["items"]), state["evicted"]
        self.rng.setstate(state["rng"])
