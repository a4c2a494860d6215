"""In-process implementations of the role Protocols: one TorchGenerator, one Trainer, reward functions and
optional frozen reference and teacher models, all in this process (the model is shared by generator and trainer)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from forge_core.data.problems import Problem
from forge_core.distill import DistillConfig
from forge_core.envs.base import EnvConfig
from forge_core.generation import SamplingParams, TorchGenerator
from forge_core.protocols import Batch, ReadyBatch
from forge_core.recipes import steps
from forge_core.rewards import CombinedReward
from forge_core.training import Trainer
from forge_core.training.correction import RolloutCorrection
from forge_core.training.update import train_on_episodes
from forge_core.types import Group


@dataclass
class LocalGenerator:
    """Rollouts of `prompts_per_step` training prompts × `group_size` samples; with `fill_rounds` > 1 (and a
    reward) uninformative groups are replaced by fresh prompts until the batch is full (DAPO dynamic sampling)."""

    generator: TorchGenerator
    problems: Sequence[Problem]
    prompts: Sequence[str]
    eval_problems: Sequence[Problem]
    eval_prompts: Sequence[str]
    prompts_per_step: int
    group_size: int
    seed: int
    sampling: SamplingParams
    eval_samples: int = 0
    fill_rounds: int = 1
    reward: CombinedReward | None = None  # used only to refill (fill_rounds > 1)
    trainer: Trainer | None = None  # whose weights `sync` loads (nothing to copy when it shares the model)
    env: EnvConfig | None = None  # multi-turn episodes in this environment (env.name set)

    def rollout(self, step: int) -> Batch:
        """Sample the step's groups; (groups, rollout/* and timing/rollout metrics)."""
        t0 = time.perf_counter()

        def sample(indices: list[int], seed: int) -> list[Group]:
            return steps.rollout(self.generator, [self.problems[i] for i in indices],
                                 [self.prompts[i] for i in indices], self.group_size, seed, self.sampling,
                                 env=self.env)

        score = steps.round_scorer(self.refills, self.env_enabled,
                                   lambda groups: (groups, steps.score_rewards(groups, self.reward)))
        groups, metrics = steps.sample_batch(step, len(self.problems), self.prompts_per_step, self.seed, sample, score,
                                             self.fill_rounds)
        metrics.update(steps.rollout_metrics(groups, step, time.perf_counter() - t0))
        return groups, metrics

    @property
    def refills(self) -> bool:
        """Whether rollouts refill uninformative groups (dynamic sampling), scoring each round."""
        return self.fill_rounds > 1 and (self.reward is not None or self.env_enabled)

    @property
    def env_enabled(self) -> bool:
        return self.env is not None and self.env.enabled

    @property
    def scored_in_rollout(self) -> bool:
        """Whether rollouts come back rewarded (refills, or an environment): then ScoredDuringRollout scores."""
        return self.refills or self.env_enabled

    def rollout_ahead(self, step: int) -> ReadyBatch:
        """Sampled now, with the weights held now (before the current step trains)."""
        return ReadyBatch(self.rollout(step))

    def resume_ahead(self, step: int, count: int) -> list[ReadyBatch]:
        return [self.rollout_ahead(step + i) for i in range(count)]

    def sync(self, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        steps.sync_weights(self.generator, self.trainer, version)
        return {"timing/sync": time.perf_counter() - t0}

    def evaluate(self, version: int) -> dict[str, float]:
        """Held-out greedy (and optionally sampled) accuracy of the current policy."""
        return steps.evaluate(self.generator, self.eval_problems, self.eval_prompts, self.sampling.max_new_tokens,
                              samples=self.eval_samples, temperature=self.sampling.temperature, seed=self.seed,
                              env=self.env)


@dataclass
class LocalRewardScorer:
    reward: CombinedReward

    def score(self, step: int, groups: list[Group]) -> Batch:
        t0 = time.perf_counter()
        metrics = steps.score_rewards(groups, self.reward)
        metrics["timing/reward"] = time.perf_counter() - t0
        return groups, metrics


class ScoredDuringRollout:
    """The reward role when rollouts come back rewarded (refills, or an environment's episodes)."""

    def score(self, step: int, groups: list[Group]) -> Batch:
        return groups, {}


@dataclass
class LocalModelScorer:
    """A frozen model in this process scoring the sampled tokens: the reference (`role` reference: ref_logprobs, for
    the KL term) or the teacher (`role` teacher: teacher_logprobs, on-policy distillation)."""

    model: object  # a frozen causal LM
    pad_id: int
    temperature: float = 1.0
    role: str = "reference"

    def score(self, step: int, groups: list[Group]) -> Batch:
        t0 = time.perf_counter()
        steps.attach_logprobs(groups, steps.model_logprobs(self.model, groups, self.pad_id, self.temperature),
                              steps.LOGPROB_FIELDS[self.role])
        return groups, steps.scorer_metrics(self.role, groups, time.perf_counter() - t0)


@dataclass
class LocalTrainer:
    """Advantages (with the optional DAPO filter) and the step's policy update on the in-process Trainer."""

    trainer: Trainer
    pad_id: int
    advantage: dict = field(default_factory=lambda: {"name": "grpo"})
    filter_groups: bool = False
    seed: int = 0  # shuffles the mini-batches of each step
    correction: RolloutCorrection = field(default_factory=RolloutCorrection)
    distill: DistillConfig | None = None  # on-policy distillation: the teacher's per-token advantage

    def train(self, step: int, groups: list[Group]) -> dict[str, float]:
        t0 = time.perf_counter()
        adv = dict(self.advantage)
        episodes, metrics = steps.compute_advantages(groups, adv.pop("name"), self.filter_groups, self.distill, **adv)
        metrics.update(train_on_episodes(self.trainer, episodes, self.pad_id, step=step, seed=self.seed,
                                         correction=self.correction))
        metrics["timing/train"] = time.perf_counter() - t0
        return metrics

    def checkpoint(self, version: int, ahead: list) -> str:
        raise RuntimeError("the in-process loop runs with checkpoint_every 0 (it saves the final model only); "
                           "checkpoints during training are the Prefect flow's")


@dataclass
class HistoryRecorder:
    """Step metrics kept in memory (and handed to `on_step(step, metrics)`, step 0-based)."""

    on_step: Callable[[int, dict], None] | None = None
    history: list[dict] = field(default_factory=list)

    def step(self, version: int, metrics: dict[str, float]) -> None:
        # groups the refill replaced count as dropped too, beside those the trainer's filter dropped
        metrics["rollout/dropped_groups"] = metrics.get("rollout/dropped_groups", 0.0) + \
            metrics.pop("rollout/refill_dropped", 0.0)
        self.history.append(metrics)
        if self.on_step:
            self.on_step(version - 1, metrics)

    def samples(self, version: int, groups: list[Group]) -> None:
        return None  # the in-process loop shows its progress line only

    def checkpoint(self, version: int, path: str) -> None:
        return None

    def rollback(self, step: int) -> None:
        del self.history[step:]
