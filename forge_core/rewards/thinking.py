"""Format rewards: a <think> block, and DAPO's soft overlong punishment."""

from __future__ import annotations

import re
from collections.abc import Callable

THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


class ThinkingReward:
    """`full` for a non-empty <think>…</think> block, `partial` for an empty or unclosed one, 0 without one."""

    def __init__(self, full: float = 1.0, partial: float = 0.5) -> None:
        self.full, self.partial = full, partial

    def __call__(self, prompt: str, response: str, target: str) -> float:
        """Score the thinking format of one response."""
        match = THINK_BLOCK.search(response)
        if match:
            return self.full if match.group(1).strip() else self.partial
        if "<think>" in response or "</think>" in response:
            return self.partial
        return 0.0


def soft_overlong_punishment(length: int, max_len: int, cache_len: int) -> float:
    """DAPO: 0 up to max_len - cache_len, linear down to -1 at max_len, -1 beyond."""
    if cache_len <= 0 or cache_len > max_len:
        raise ValueError(f"overlong cache_len must be in (0, max_len={max_len}]; got {cache_len}")
    threshold = max_len - cache_len
    if length <= threshold:
        return 0.0
    if length <= max_len:
        return (threshold - length) / cache_len
    return -1.0


class OverlongPenalty:
    """Reward function form of the soft overlong punishment; `length_fn` counts tokens (default: characters)."""

    def __init__(self, max_len: int, cache_len: int, length_fn: Callable[[str], int] = len) -> None:
        soft_overlong_punishment(0, max_len, cache_len)  # validate the settings once
        self.max_len, self.cache_len, self.length_fn = max_len, cache_len, length_fn

    def __call__(self, prompt: str, response: str, target: str) -> float:
        """Penalty in [-1, 0] for the response's length."""
        return soft_overlong_punishment(self.length_fn(response), self.max_len, self.cache_len)
