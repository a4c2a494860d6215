"""The in-process GRPO loop: rollout → reward → (reference) → advantages → train → sync, one call per step.

Readable in one sitting on purpose; the Prefect flow calls the same step functions from `steps.py`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from forge_core.advantages import collect_informative_groups
from forge_core.data.problems import Problem
from forge_core.generation import SamplingParams, TorchGenerator
from forge_core.recipes import steps
from forge_core.rewards import CombinedReward
from forge_core.training import Trainer


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


def sample_prompt_indices(num_problems: int, k: int, seed: int, step: int) -> list[int]:
    """The problem indices of `step`: a pure function of (seed, step), so a re-run step sees the same prompts."""
    if k > num_problems:
        raise ValueError(f"prompts_per_step={k} exceeds the {num_problems} training problems; lower prompts_per_step")
    return random.Random(steps.step_seed(seed, step, salt=1)).sample(range(num_problems), k)


@dataclass
class GRPOLoop:
    """Components of an in-process run; `run_step(step)` performs policy update step → step+1."""

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

    def evaluate(self) -> dict[str, float]:
        """Held-out greedy (and optionally sampled) accuracy of the current policy."""
        s = self.settings
        return steps.evaluate(self.generator, self.eval_problems, self.eval_prompts, s.sampling.max_new_tokens,
                              samples=s.eval_samples, temperature=s.sampling.temperature, seed=s.seed)

    def run_step(self, step: int) -> dict[str, float]:
        """One GRPO iteration; returns all metrics of the step."""
        s, timings = self.settings, {}
        t0 = time.perf_counter()
        groups, metrics = self.sample_groups(step)
        timings["timing/reward"] = metrics.pop("timing/reward")
        timings["timing/rollout"] = time.perf_counter() - t0 - timings["timing/reward"]
        metrics.update(steps.rollout_metrics(groups))
        if self.ref_model is not None:
            t2 = time.perf_counter()
            steps.score_reference(self.ref_model, groups, self.pad_id, s.sampling.temperature)
            timings["timing/reference"] = time.perf_counter() - t2
        adv = dict(s.advantage)
        episodes, adv_metrics = steps.compute_advantages(groups, adv.pop("name"), s.filter_groups, **adv)
        adv_metrics["rollout/dropped_groups"] += metrics.pop("rollout/refill_dropped", 0.0)
        metrics.update(adv_metrics)
        t3 = time.perf_counter()
        metrics.update(steps.train_on_episodes(self.trainer, episodes, self.pad_id))
        timings["timing/train"] = time.perf_counter() - t3
        steps.sync_weights(self.generator, self.trainer, step + 1)
        if s.eval_every and (step + 1) % s.eval_every == 0:
            metrics.update(self.evaluate())
        timings["timing/step"] = time.perf_counter() - t0
        tokens = sum(len(e.completion.token_ids) for g in groups for e in g.episodes)
        metrics["rollout/tokens_per_s"] = tokens / max(timings["timing/rollout"], 1e-9)
        metrics["rollout/policy_staleness"] = 0.0
        return {**metrics, **timings}

    def sample_groups(self, step: int) -> tuple[list, dict[str, float]]:
        """Rollout + reward for `step`; with filter_groups and fill_rounds > 1, uninformative groups are replaced
        by fresh prompts until the batch is full or the rounds run out. Returns (groups, metrics)."""
        s = self.settings
        reward_time, calls = 0.0, []

        def sample(n: int) -> list:
            nonlocal reward_time
            salt = len(calls)
            calls.append(n)
            idx = sample_prompt_indices(len(self.train_problems), n, s.seed + 7919 * salt, step)
            groups = steps.rollout(self.generator, [self.train_problems[i] for i in idx],
                                   [self.train_prompts[i] for i in idx], s.group_size,
                                   steps.step_seed(s.seed, step, salt), s.sampling)
            t = time.perf_counter()
            calls[-1] = steps.score_rewards(groups, self.reward)
            reward_time += time.perf_counter() - t
            return groups

        if s.filter_groups and s.fill_rounds > 1:
            groups, stats = collect_informative_groups(sample, s.prompts_per_step, s.fill_rounds)
            metrics = dict(calls[0])
            metrics.update({"rollout/fill_rounds": float(stats.rounds), "rollout/sampled_groups": float(stats.sampled),
                            "rollout/refill_dropped": float(stats.dropped)})
        else:
            groups = sample(s.prompts_per_step)
            metrics = dict(calls[0])
        metrics["timing/reward"] = reward_time
        return groups, metrics

    def run(self, start_step: int = 0, on_step: Callable[[int, dict], None] | None = None) -> list[dict]:
        """Steps start_step..settings.steps-1; `on_step(step, metrics)` after each. Returns the metric history."""
        history = []
        for step in range(start_step, self.settings.steps):
            metrics = self.run_step(step)
            history.append(metrics)
            if on_step:
                on_step(step, metrics)
        return history
