"""The role Protocols of forge_core.protocols over a WorkerPool: each method is one call (or one fan-out) to the
workers of its role. Prefect tasks call these (tasks/phases.py); the pool and fault tests drive the iteration spine
with them directly.

    RemoteGenerator ─ rollout: prompts split round-robin over the generator replicas, which sample concurrently;
                      version pinned by the Schedule
    RemoteRewardScorer ─ the batch split over the reward workers, scored concurrently
    RemoteModelScorer ─ the batch split over the reference (or teacher) workers, scored concurrently
    RemoteTrainer ─ train and checkpoints on the trainer worker (all its ranks)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from forge_core.data.problems import Problem
from forge_core.protocols import Batch, PendingBatch, ReadyBatch, RolledBack
from forge_core.recipes.steps import (
    LOGPROB_FIELDS,
    attach_logprobs,
    evaluate,
    reward_metrics,
    rollout_metrics,
    round_scorer,
    sample_batch,
    scorer_metrics,
    set_reward_errors,
)
from forge_core.schedule import Schedule
from forge_core.training.trainer import save_atomically
from forge_core.types import Group
from infra import checkpoints as ckpt
from infra.components import ProblemSplits
from workers.episodes import RemoteEnvs, RemoteTurns, remote_episodes


def remote_rollout(pool, problems: Sequence[Problem], prompts: Sequence[str], group_size: int,
                   seed: int, version: int | None = None) -> list[Group]:
    """Split the prompts over the generator replicas (round-robin), which sample at the same time, and gather their
    groups in the prompts' order. Prompt i is seeded with seed + i on whichever replica samples it, so the groups
    do not depend on the number of replicas. `version` pins the policy version (a generator holding another one
    loads it first)."""
    replicas = len(pool.clients("generator"))
    shards = {i: (probs, prs, group_size, seed, version, keys)
              for i, (probs, prs, keys) in round_robin(problems, prompts, replicas).items()}
    results = pool.call_each("generator", "rollout", shards)
    groups: list[Group] = [None] * len(problems)  # type: ignore[list-item]
    for i, part in results.items():  # interleave back into the prompts' order
        groups[i::replicas] = part
    return groups


def round_robin(problems: Sequence[Problem], prompts: Sequence[str], replicas: int) -> dict[int, tuple]:
    """{replica: (its problems, prompts, their indices in the call)}: item i goes to replica i % replicas (replicas
    with nothing to do are left out); the indices are the prompt keys that seed each prompt as one generator would."""
    keys = list(range(len(problems)))
    return {i: (list(problems[i::replicas]), list(prompts[i::replicas]), keys[i::replicas])
            for i in range(min(replicas, len(problems)))}


def remote_evaluate(pool, problems: Sequence[Problem], prompts: Sequence[str], samples: int) -> dict[str, float]:
    """Held-out accuracy with the prompts split over the generator replicas, evaluated at the same time; the
    accuracies are those of one generator evaluating them all (counts are summed, not means averaged)."""
    t0 = time.perf_counter()
    shards = {i: (probs, prs, samples, keys)
              for i, (probs, prs, keys) in round_robin(problems, prompts, len(pool.clients("generator"))).items()}
    results = pool.call_each("generator", "evaluate", shards)
    metrics = {"eval/accuracy": sum_rates(results, "eval/accuracy", shards, 1) / len(problems)}
    if samples:
        metrics["eval/sampled_accuracy"] = sum_rates(results, "eval/sampled_accuracy", shards, samples) / (
            len(problems) * samples)
        key = f"eval/pass_at_{samples}"
        metrics[key] = sum_rates(results, key, shards, 1) / len(problems)
    metrics["timing/eval"] = time.perf_counter() - t0
    return metrics


def sum_rates(results: dict[int, dict], key: str, shards: dict[int, tuple], per_prompt: int) -> int:
    """The count behind each shard's rate `key` (rate × the shard's prompts × per_prompt), summed."""
    return sum(round(results[i][key] * len(shards[i][0]) * per_prompt) for i in results)


def remote_score(pool, groups: list[Group]) -> dict[str, float]:
    """Score the groups on the reward workers, split in contiguous shards that are scored at the same time; the
    rewards are written onto the episodes in order and reward/* metrics computed over the whole batch (the same
    numbers as one worker's)."""
    parts = contiguous_shards(len(groups), len(pool.clients("reward")))
    results = pool.call_each("reward", "score", {i: (groups[part],) for i, part in parts.items()})
    errors = timeouts = 0.0
    for i, (scores, metrics) in results.items():
        for g, row in zip(groups[parts[i]], scores, strict=True):
            for e, (total, breakdown, raised) in zip(g.episodes, row, strict=True):
                e.reward, e.reward_breakdown = total, breakdown
                set_reward_errors(e, raised)
        errors += metrics["reward/errors"]
        timeouts += metrics["reward/timeouts"]
    return {**reward_metrics(groups, errors), "reward/timeouts": timeouts}


def contiguous_shards(count: int, replicas: int) -> dict[int, slice]:
    """{replica: its slice of `count` items}: contiguous, as even as can be; replicas with nothing to do left out."""
    replicas = min(replicas, count)
    bounds = [count * i // replicas for i in range(replicas + 1)]
    return {i: slice(bounds[i], bounds[i + 1]) for i in range(replicas) if bounds[i] < bounds[i + 1]}


def remote_logprobs(pool, role: str, groups: list[Group]) -> list[list[list[float]]]:
    """The logprobs the frozen models of `role` (reference or teacher workers) give every episode's completion
    tokens, groups → episodes → [T]; the batch is split in contiguous shards scored at the same time."""
    parts = contiguous_shards(len(groups), len(pool.clients(role)))
    results = pool.call_each(role, "logprobs", {i: (groups[part],) for i, part in parts.items()})
    return [row for i in sorted(results) for row in results[i]]


def remote_sync(pool, version: int) -> list[int]:
    """Every generator replica loads `version` from the weight store."""
    if pool.cfg.weightsync.backend == "broadcast":
        # a generator that died broke the group, so `version` never reached the others: find the dead one first
        # (WorkerLost → recovery re-forms the group) instead of waiting on a version that will not come
        pool.call_all("generator", "health", timeout=30)
    return pool.call_all("generator", "load_weights", version)


def require_trainer_at(pool, version: int) -> None:
    """Raise RolledBack when a recovery restored the trainer to a step other than `version` (the caller's work for
    `version` — training on, syncing or evaluating it — would then be for weights that no longer exist)."""
    actual = pool.call("trainer", "health")["step"]
    if actual != version:
        raise RolledBack(actual)


@dataclass
class RemoteGenerator:
    """GeneratorRole over the pool's generator replicas: `prompts_per_step` problems of `splits.train` per step."""

    pool: object  # workers.pool.WorkerPool
    splits: ProblemSplits
    schedule: Schedule
    prompts_per_step: int
    group_size: int
    seed: int
    eval_samples: int = 0
    fill_rounds: int = 1  # > 1: DAPO dynamic sampling, refilled with the reward workers' scores
    reward: RemoteRewardScorer | None = None  # scores each refill round (fill_rounds > 1)
    env_enabled: bool = False  # multi-turn episodes across the generator and env workers, rewarded by the env

    def rollout(self, step: int) -> Batch:
        """The step's groups, sampled with the pinned behaviour version (and refilled: fill_rounds > 1)."""
        t0 = time.perf_counter()
        train, prompts = self.splits.train, self.splits.train_prompts

        def sample(indices: list[int], seed: int) -> list[Group]:
            if self.env_enabled:  # multi-turn episodes across the generator and env workers
                return remote_episodes(self.pool, self.splits.tokenizer, [train[i] for i in indices], self.group_size,
                                       seed, self.behaviour_version(step))
            return remote_rollout(self.pool, [train[i] for i in indices], [prompts[i] for i in indices],
                                  self.group_size, seed, self.behaviour_version(step))

        score = round_scorer(self.refills, self.env_enabled, lambda groups: self.reward.score(step, groups))
        groups, metrics = sample_batch(step, len(train), self.prompts_per_step, self.seed, sample, score,
                                       self.fill_rounds)
        return groups, {**metrics, **rollout_metrics(groups, step, time.perf_counter() - t0)}

    @property
    def refills(self) -> bool:
        """Whether rollouts refill uninformative groups (dynamic sampling), scoring each round."""
        return self.fill_rounds > 1 and (self.reward is not None or self.env_enabled)

    @property
    def scored_in_rollout(self) -> bool:
        """Whether rollouts come back rewarded (refills, or an environment): then ScoredDuringRollout scores."""
        return self.refills or self.env_enabled

    def behaviour_version(self, step: int) -> int | None:
        """The version step's rollout is pinned to (the uninterrupted run's; None: whatever the generators hold)."""
        return self.schedule.behaviour_version(step)

    def rollout_ahead(self, step: int) -> ReadyBatch:
        return ReadyBatch(self.rollout(step))  # one caller, one connection: sampled now (tasks run it in a thread)

    def resume_ahead(self, step: int, count: int) -> list[ReadyBatch]:
        return [self.rollout_ahead(step + i) for i in range(count)]

    def sync(self, version: int) -> dict[str, float]:
        """Every replica loads `version`; RolledBack when the trainer is no longer there (a retry after a
        recovery that restored an older checkpoint: `version` was garbage-collected with the later steps)."""
        require_trainer_at(self.pool, version)
        t0 = time.perf_counter()
        remote_sync(self.pool, version)
        return {"timing/sync": time.perf_counter() - t0}

    def evaluate(self, version: int) -> dict[str, float]:
        """Held-out greedy (and sampled) accuracy of the generator's current weights (RolledBack: see sync)."""
        require_trainer_at(self.pool, version)
        if self.env_enabled:
            cfg = self.pool.cfg
            return evaluate(RemoteTurns(self.pool, self.splits.tokenizer), self.splits.eval, self.splits.eval_prompts,
                            cfg.generator.max_new_tokens, samples=self.eval_samples,
                            temperature=cfg.generator.temperature, seed=cfg.seed, env=cfg.env,
                            envs=RemoteEnvs(self.pool))
        return remote_evaluate(self.pool, self.splits.eval, self.splits.eval_prompts, self.eval_samples)


@dataclass
class RemoteRewardScorer:
    pool: object

    def score(self, step: int, groups: list[Group]) -> Batch:
        """Rewards from the reward workers, written onto the episodes; reward/* metrics."""
        t0 = time.perf_counter()
        metrics = remote_score(self.pool, groups)
        metrics["timing/reward"] = time.perf_counter() - t0
        return groups, metrics


@dataclass
class RemoteModelScorer:
    """ReferenceScorer over the pool's frozen-model workers: `role` reference (ref_logprobs, the KL term) or teacher
    (teacher_logprobs, on-policy distillation; split over its replicas)."""

    pool: object
    role: str = "reference"

    def score(self, step: int, groups: list[Group]) -> Batch:
        """The role's logprobs from its workers, written onto the episodes; timing/<role> (and distill/*)."""
        t0 = time.perf_counter()
        attach_logprobs(groups, remote_logprobs(self.pool, self.role, groups), LOGPROB_FIELDS[self.role])
        return groups, scorer_metrics(self.role, groups, time.perf_counter() - t0)


@dataclass
class RemoteTrainer:
    """PolicyTrainer over the trainer worker; checkpoints go to `checkpoint_dir` (infra.checkpoints layout)."""

    pool: object
    checkpoint_dir: Path
    seed: int = 0
    keep: int = 3

    def train(self, step: int, groups: list[Group]) -> dict[str, float]:
        """Advantages + one optimizer step on the trainer worker; it publishes version step+1 when the generators
        sync to it. Raises RolledBack (nothing trained) when a recovery restored the trainer to another step."""
        require_trainer_at(self.pool, step)
        t0 = time.perf_counter()
        metrics = self.pool.call("trainer", "train", step, groups)
        metrics["timing/train"] = time.perf_counter() - t0
        return metrics

    def checkpoint(self, version: int, ahead: list[PendingBatch]) -> str:
        """Trainer state + HF weights to step-N; `ahead`: the batches of steps N, N+1, … sampled ahead (pipelined),
        saved with the checkpoint so a resume trains on the same batches. COMPLETE is written last, old checkpoints
        are pruned to `keep`. Raises RolledBack when the trainer is no longer at `version`: older weights are
        never labelled as this step."""
        require_trainer_at(self.pool, version)
        path = ckpt.step_dir(self.checkpoint_dir, version)
        # state_sha256: equal for equal training states (the file's own bytes are not canonical)
        saved = self.pool.call("trainer", "save_checkpoint", str(path))
        if ahead:
            save_atomically([batch.result() for batch in ahead], path / ckpt.INFLIGHT)
        # last: without it the directory is ignored
        ckpt.mark_complete(path, version, saved["state_sha256"], self.seed, file_digest=saved["sha256"])
        ckpt.prune_checkpoints(self.checkpoint_dir, self.keep)
        return str(path)


class RemoteSFTTrainer:
    """The pool's trainer worker behind the slice of the Trainer interface `run_sft` uses."""

    def __init__(self, pool):
        self.pool = pool
        self.metrics: dict[str, float] = {}

    def train_step(self, inputs: list[dict], targets: dict) -> float:
        """One SFT step on the worker (all its ranks); returns the loss."""
        self.metrics = self.pool.call("trainer", "sft_step", inputs, targets)
        return self.metrics["loss"]
