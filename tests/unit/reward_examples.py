"""Reward functions that misbehave, referenced by import path from tests (`tests.unit.reward_examples:…`)."""

import time


def hangs_on_loop(prompt: str, response: str, target: str) -> float:
    """Never returns when the response contains 'loop'."""
    while "loop" in response:
        time.sleep(0.05)
    return 1.0


def raises_on_boom(prompt: str, response: str, target: str) -> float:
    if "boom" in response:
        raise RuntimeError("boom")
    return 0.5


def hangs_on_some_prompts(prompt: str, response: str, target: str) -> float:
    """Sleeps a minute for prompts of even length (about half), else 0."""
    if len(prompt) % 2 == 0:
        time.sleep(60)
    return 0.0


def always_raises(prompt: str, response: str, target: str) -> float:
    """A verifier that cannot work at all (here: a missing dependency)."""
    raise ModuleNotFoundError("No module named 'sympy_verifier'")
