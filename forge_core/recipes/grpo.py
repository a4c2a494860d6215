"""The in-process GRPO run: local components (forge_core.recipes.local) driven by the iteration spine
(forge_core.recipes.iteration), the same spine the Prefect flow drives with tasks over worker clients."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from forge_core.data.problems import Problem
from forge_core.distill import DistillConfig
from forge_core.envs.base import EnvConfig
from forge_core.generation import TorchGenerator
from forge_core.recipes.config import EvalConfig, GRPOConfig
from forge_core.recipes.iteration import Roles, run_grpo_steps, run_iteration
from forge_core.recipes.local import (
    HistoryRecorder,
    LocalGenerator,
    LocalModelScorer,
    LocalRewardScorer,
    LocalTrainer,
    ScoredDuringRollout,
)
from forge_core.recipes.reward_watch import RewardFailureWatch
from forge_core.rewards import CombinedReward
from forge_core.schedule import Schedule
from forge_core.training import Trainer
from forge_core.training.correction import RolloutCorrection


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
    config: GRPOConfig  # the run-level keys (a RunConfig is one)
    pad_id: int
    ref_model: object | None = None
    teacher_model: object | None = None  # on-policy distillation: the frozen teacher (with `distill` enabled)
    distill: DistillConfig = field(default_factory=DistillConfig)
    advantage: dict = field(default_factory=lambda: {"name": "grpo"})  # the advantage section: {name, **params}
    eval: EvalConfig = field(default_factory=EvalConfig)
    correction: RolloutCorrection = field(default_factory=RolloutCorrection)
    env: EnvConfig = field(default_factory=EnvConfig)
    max_failed_reward_steps: int = 3  # reward.max_failed_steps: see forge_core/recipes/reward_watch.py

    def __post_init__(self) -> None:
        run, sampling = self.config, self.generator.params
        local = LocalGenerator(self.generator, self.train_problems, self.train_prompts, self.eval_problems,
                               self.eval_prompts, run.prompts_per_step, run.group_size, run.seed, sampling,
                               eval_samples=self.eval.samples, fill_rounds=run.refill_rounds,
                               reward=self.reward, trainer=self.trainer, env=self.env)
        reference = teacher = None
        if self.ref_model is not None:
            reference = LocalModelScorer(self.ref_model, self.pad_id, sampling.temperature)
        if self.distill.enabled:
            teacher = LocalModelScorer(self.teacher_model, self.pad_id, sampling.temperature, role="teacher")
        self.roles = Roles(local, ScoredDuringRollout() if local.scored_in_rollout else LocalRewardScorer(self.reward),
                           LocalTrainer(self.trainer, self.pad_id, dict(self.advantage), run.filter_groups, run.seed,
                                        self.correction, self.distill), reference, teacher)
        # one process, one model: the generator sees every version (a rollout ahead samples before the step
        # trains, so with the weights of then), no checkpoints but the final one
        self.schedule = Schedule(steps=run.steps, eval_every=self.eval.every, max_policy_age=run.max_policy_age)

    def evaluate(self) -> dict[str, float]:
        """Held-out greedy (and optionally sampled) accuracy of the current policy."""
        return self.roles.generator.evaluate(self.generator.policy_version)

    def run_step(self, step: int) -> dict[str, float]:
        """One GRPO iteration; returns all metrics of the step."""
        recorder = HistoryRecorder()
        run_iteration(self.roles, self.schedule, step, [], recorder)
        return recorder.history[-1]

    def run(self, start_step: int = 0, on_step: Callable[[int, dict], None] | None = None) -> list[dict]:
        """Steps start_step..config.steps-1; `on_step(step, metrics)` after each. Returns the metric history."""
        recorder = HistoryRecorder(on_step)
        run_grpo_steps(self.roles, self.schedule, start_step, recorder, RewardFailureWatch(self.max_failed_reward_steps))
        return recorder.history
