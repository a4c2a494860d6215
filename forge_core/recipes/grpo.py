"""The in-process GRPO run: local components (forge_core.recipes.local) driven by the iteration spine
(forge_core.recipes.iteration), the same spine the Prefect flow drives with tasks over worker clients."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from forge_core.data.problems import Problem
from forge_core.generation import SamplingParams, TorchGenerator
from forge_core.recipes.iteration import Roles, run_grpo_steps, run_iteration
from forge_core.recipes.local import (
    HistoryRecorder,
    LocalGenerator,
    LocalReferenceScorer,
    LocalRewardScorer,
    LocalTrainer,
    ScoredDuringRollout,
)
from forge_core.rewards import CombinedReward
from forge_core.schedule import Schedule
from forge_core.training import Trainer
from forge_core.training.correction import RolloutCorrection


@dataclass
class GRPOSettings:
    """What one GRPO run needs besides its components."""

    steps: int = 200
    prompts_per_step: int = 16
    group_size: int = 8
    seed: int = 0
    advantage: dict = field(default_factory=lambda: {"name": "grpo"})
    filter_groups: bool = False
    fill_rounds: int = 1  # with filter_groups: sampling rounds to refill dropped groups (DAPO dynamic sampling)
    eval_every: int = 10
    eval_samples: int = 0
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_policy_age: int = 0  # N >= 1: N rollouts sampled ahead of the trainer (with the weights of then)
    correction: RolloutCorrection = field(default_factory=RolloutCorrection)


@dataclass
class GRPOLoop:
    """Components of an in-process run, driven by the iteration spine; `run_step(step)` performs step → step+1."""

    generator: TorchGenerator
    trainer: Trainer
    reward: CombinedReward
    train_problems: Sequence[Problem]
    train_prompts: Sequence[str]
    eval_problems: Sequence[Problem]
    eval_prompts: Sequence[str]
    settings: GRPOSettings
    pad_id: int
    ref_model: object | None = None

    def __post_init__(self) -> None:
        s = self.settings
        local = LocalGenerator(self.generator, self.train_problems, self.train_prompts, self.eval_problems,
                               self.eval_prompts, s.prompts_per_step, s.group_size, s.seed, s.sampling,
                               eval_samples=s.eval_samples, fill_rounds=s.fill_rounds if s.filter_groups else 1,
                               reward=self.reward, trainer=self.trainer)
        reference = None
        if self.ref_model is not None:
            reference = LocalReferenceScorer(self.ref_model, self.pad_id, s.sampling.temperature)
        self.roles = Roles(local, ScoredDuringRollout() if local.refills else LocalRewardScorer(self.reward),
                           LocalTrainer(self.trainer, self.pad_id, dict(s.advantage), s.filter_groups, s.seed,
                                        s.correction), reference)
        # one process, one model: the generator sees every version (a rollout ahead samples before the step
        # trains, so with the weights of then), no checkpoints but the final one
        self.schedule = Schedule(steps=s.steps, eval_every=s.eval_every, max_policy_age=s.max_policy_age)

    def evaluate(self) -> dict[str, float]:
        """Held-out greedy (and optionally sampled) accuracy of the current policy."""
        return self.roles.generator.evaluate(self.generator.policy_version)

    def run_step(self, step: int) -> dict[str, float]:
        """One GRPO iteration; returns all metrics of the step."""
        recorder = HistoryRecorder()
        run_iteration(self.roles, self.schedule, step, [], recorder)
        return recorder.history[-1]

    def run(self, start_step: int = 0, on_step: Callable[[int, dict], None] | None = None) -> list[dict]:
        """Steps start_step..settings.steps-1; `on_step(step, metrics)` after each. Returns the metric history."""
        recorder = HistoryRecorder(on_step)
        run_grpo_steps(self.roles, self.schedule, start_step, recorder)
        return recorder.history
