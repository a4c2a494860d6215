"""`guess`: find a secret number in as few turns as possible, with "higher" / "lower" feedback.

    user:      Guess my number between 1 and 100.
    assistant: 50          user: higher
    assistant: 75          user: lower  …   assistant: 63   → done, reward 1.0 (per-turn reward -step_cost each miss)
"""

from __future__ import annotations

import random
import re

from forge_core.envs.base import Message, StepResult

NUMBER = re.compile(r"-?\d+")


class GuessEnvironment:
    """The secret is drawn from (task, seed): every episode of a group plays the same secret."""

    def __init__(self, low: int = 1, high: int = 100, step_cost: float = 0.0):
        if low >= high:
            raise ValueError(f"env.options.low ({low}) must be below env.options.high ({high})")
        self.low, self.high, self.step_cost = low, high, step_cost

    def reset(self, task, seed: int) -> tuple[list[Message], list[dict]]:
        question = getattr(task, "question", str(task))
        self.secret = random.Random(f"{question}:{seed}").randint(self.low, self.high)
        self.solved = False
        return [{"role": "user", "content": f"Guess my number between {self.low} and {self.high}."}], []

    def step(self, message: Message) -> StepResult:
        found = NUMBER.findall(message.get("content", ""))
        if not found:
            return StepResult([{"role": "user", "content": "Say a number."}], reward=-self.step_cost)
        guess = int(found[-1])
        if guess == self.secret:
            self.solved = True
            return StepResult(done=True, info={"status": "completed", "solved": True})
        hint = "higher" if guess < self.secret else "lower"
        return StepResult([{"role": "user", "content": hint}], reward=-self.step_cost)

    def final_reward(self) -> float:
        return 1.0 if self.solved else 0.0

    def close(self) -> None:
        pass
