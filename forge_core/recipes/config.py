"""The run-level keys of a GRPO run (top of the YAML) and the `eval` section, declared and checked here once."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GRPOConfig:
    """What a GRPO run samples and trains each step; the top-level keys of a run's YAML (RunConfig inherits them)."""

    seed: int = 0
    steps: int = 200
    prompts_per_step: int = 16
    group_size: int = 8
    max_policy_age: int = 0  # N >= 1: N rollouts sampled ahead of the trainer (with the weights of then)
    filter_groups: bool = False  # DAPO dynamic sampling: drop groups whose rewards are all equal
    fill_rounds: int = 1  # with filter_groups: sampling rounds that refill the dropped groups (1: no refill)

    def check(self, where: str = "") -> None:
        """ValueError naming the key and the fix (keys are top-level: `where` is empty in a run's YAML)."""
        at = f"{where}." if where else ""
        if self.steps < 0:
            raise ValueError(f"{at}steps must be >= 0 (0 skips RL), got {self.steps}")
        for key in ("prompts_per_step", "fill_rounds"):
            if getattr(self, key) < 1:
                raise ValueError(f"{at}{key} must be >= 1, got {getattr(self, key)}")
        if self.group_size < 2:
            raise ValueError(f"{at}group_size must be >= 2 for group-relative advantages, got {self.group_size}")
        if self.max_policy_age < 0:
            raise ValueError(f"{at}max_policy_age must be >= 0 (0: on-policy), got {self.max_policy_age}")
        if self.fill_rounds > 1 and not self.filter_groups:
            raise ValueError(f"{at}fill_rounds = {self.fill_rounds} refills the groups filter_groups drops; set "
                             "filter_groups: true (or fill_rounds: 1)")

    @property
    def refill_rounds(self) -> int:
        """Sampling rounds per step: fill_rounds with filter_groups, else one."""
        return self.fill_rounds if self.filter_groups else 1


@dataclass
class EvalConfig:
    """Config section `eval`: held-out greedy accuracy every N steps (0: only at the start and the end)."""

    every: int = 10
    num_prompts: int = 200
    samples: int = 0  # extra sampled completions per prompt for eval/sampled_accuracy

    def check(self, where: str = "eval") -> None:
        """ValueError naming the key and the fix."""
        if self.num_prompts < 1:
            raise ValueError(f"{where}.num_prompts must be >= 1, got {self.num_prompts}")
        if self.every < 0 or self.samples < 0:
            raise ValueError(f"{where}.every and {where}.samples must be >= 0, got {self.every}, {self.samples}")
