"""A reward function that raises on every episode, step after step, ends the run with its error.

Without this, a broken verifier scores every episode `fallback` (0): every group is equal, DAPO filters them all,
nothing trains, and the run still "succeeds". Scoring records, per function, the share of episodes it raised on
(`reward/failed/<name>`) and the first error on each episode's metadata (`reward_errors`); the spine shows every
step's scores to a RewardFailureWatch, which stops the run after `reward.max_failed_steps` steps in a row with a
function that failed on all of them.
"""

from __future__ import annotations

from forge_core.types import Group

FAILED = "reward/failed/"


class RewardFunctionFailed(RuntimeError):
    """A reward function raised on every episode of `steps` consecutive steps."""


class RewardFailureWatch:
    """Counts, per reward function, the consecutive steps on which it raised on every episode; 0 disables."""

    def __init__(self, max_failed_steps: int = 3):
        assert max_failed_steps >= 0, max_failed_steps  # checked with the config (infra/config_checks.py)
        self.max_failed_steps = max_failed_steps
        self.streaks: dict[str, int] = {}

    def see(self, step: int, metrics: dict[str, float], groups: list[Group]) -> None:
        """Step `step`'s scoring (its reward/* metrics and scored groups); RewardFunctionFailed at the limit."""
        if not self.max_failed_steps:
            return
        failed = {k[len(FAILED):] for k, v in metrics.items() if k.startswith(FAILED) and v >= 1.0}
        self.streaks = {name: self.streaks.get(name, 0) + 1 for name in failed}
        for name, streak in sorted(self.streaks.items()):
            if streak >= self.max_failed_steps:
                raise RewardFunctionFailed(
                    f"reward function {name!r} raised on every episode of {streak} steps in a row (steps "
                    f"{step - streak + 1}..{step}), so nothing could be learned; its error: {first_error(groups, name)}. "
                    f"Fix the function (rewards: in the config) and resume the run; reward.max_failed_steps "
                    f"({self.max_failed_steps}) sets how many such steps end a run (0: never)")


def first_error(groups: list[Group], name: str) -> str:
    """The error `name` raised on the first episode that records one (the scored groups may all have been dropped
    by dynamic sampling: then the reward worker's log has it)."""
    for g in groups:
        for e in g.episodes:
            error = e.completion.metadata.get("reward_errors", {}).get(name)
            if error:
                return error
    return "not kept with the step's groups (all were dropped); the reward worker's log shows it"
