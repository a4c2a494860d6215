"""RewardWorker: scores episodes with the configured reward functions (CPU-only; can be replicated)."""

from __future__ import annotations

from forge_core.recipes import steps
from forge_core.rewards.sandbox import TimeLimitedReward
from forge_core.types import Group
from infra import components as C
from infra.config import RunConfig
from workers.base import Worker


class RewardWorker(Worker):
    role = "reward"

    def __init__(self, cfg: RunConfig, store=None, init_path: str | None = None, threads: int | None = None):
        super().__init__(cfg, threads)
        limit = cfg.reward.timeout_s
        self.reward = TimeLimitedReward(C.reward_entries(cfg), limit) if limit > 0 else C.build_reward(cfg)

    def score(self, groups: list[Group]) -> tuple[list[list[tuple[float, dict, dict]]], dict[str, float]]:
        """Per-episode (reward, breakdown, errors) for each group, and the reward/* metrics (incl. reward/timeouts)."""
        self.calls += 1
        before = getattr(self.reward, "timeouts", 0)
        metrics = steps.score_rewards(groups, self.reward)
        metrics["reward/timeouts"] = float(getattr(self.reward, "timeouts", 0) - before)
        rows = [[(e.reward, e.reward_breakdown, e.completion.metadata.get("reward_errors", {})) for e in g.episodes]
                for g in groups]
        return rows, metrics

    def shutdown(self) -> bool:
        if isinstance(self.reward, TimeLimitedReward):
            self.reward.close()
        return True
