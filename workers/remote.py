"""One GRPO iteration over a WorkerPool: the remote counterparts of `forge_core.recipes.steps`.

The Prefect tasks are thin wrappers around these; they also serve the SLURM and fault tests directly.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from forge_core.data.problems import Problem
from forge_core.recipes.steps import rollout_metrics, step_seed
from forge_core.types import Group
from infra.components import syncs_at


def remote_rollout(pool, problems: Sequence[Problem], prompts: Sequence[str], group_size: int,
                   seed: int, version: int | None = None) -> list[Group]:
    """Split the prompts over the generator replicas (round-robin) and gather their groups in order; `version`
    pins the policy version they sample with (a generator holding another one loads it first)."""
    clients = pool.clients("generator")
    shards = [(i, list(problems[i::len(clients)]), list(prompts[i::len(clients)])) for i in range(len(clients))]
    results: dict[int, list[Group]] = {}
    for i, probs, prs in shards:
        if probs:
            results[i] = clients[i].call("rollout", probs, prs, group_size, seed + i, version)
    # interleave back into the original prompt order
    groups: list[Group] = [None] * len(problems)  # type: ignore[list-item]
    for i, part in results.items():
        groups[i::len(clients)] = part
    return groups


def remote_score(pool, groups: list[Group]) -> dict[str, float]:
    """Rewards from a reward worker, written onto the episodes; returns reward/* metrics."""
    scores, metrics = pool.call("reward", "score", groups)
    for g, row in zip(groups, scores, strict=True):
        for e, (total, breakdown) in zip(g.episodes, row, strict=True):
            e.reward, e.reward_breakdown = total, breakdown
    return metrics


def remote_reference(pool, groups: list[Group]) -> None:
    """Reference logprobs from the reference worker, written onto the episodes."""
    rows = pool.call("reference", "ref_logprobs", groups)
    for g, row in zip(groups, rows, strict=True):
        for e, lp in zip(g.episodes, row, strict=True):
            e.ref_logprobs = lp


def remote_train(pool, groups: list[Group], step: int) -> dict[str, float]:
    """One optimizer step on the trainer worker; it publishes weights version step+1."""
    return pool.call("trainer", "train_step", groups, step)


def remote_sync(pool, version: int) -> list[int]:
    """Every generator replica loads `version` from the weight store."""
    if pool.cfg.weightsync.backend == "broadcast":
        # a generator that died broke the group, so `version` never reached the others: find the dead one first
        # (WorkerLost → recovery re-forms the group) instead of waiting on a version that will not come
        pool.call_all("generator", "health", timeout=30)
    return pool.call_all("generator", "load_weights", version)


def run_remote_iteration(pool, problems: Sequence[Problem], prompts: Sequence[str], group_size: int, seed: int,
                         step: int, with_reference: bool = False) -> dict[str, float]:
    """rollout → reward → (reference) → train → sync for `step`; returns all metrics with timings."""
    t0 = time.perf_counter()
    groups = remote_rollout(pool, problems, prompts, group_size, step_seed(seed, step))
    t1 = time.perf_counter()
    metrics = {**remote_score(pool, groups), **rollout_metrics(groups)}
    t2 = time.perf_counter()
    if with_reference:
        remote_reference(pool, groups)
    t3 = time.perf_counter()
    metrics.update(remote_train(pool, groups, step))
    t4 = time.perf_counter()
    if syncs_at(pool.cfg, step + 1):  # the trainer published step+1
        remote_sync(pool, step + 1)
    t5 = time.perf_counter()
    metrics.update({"timing/rollout": t1 - t0, "timing/reward": t2 - t1, "timing/reference": t3 - t2,
                    "timing/train": t4 - t3, "timing/sync": t5 - t4, "timing/step": t5 - t0})
    versions = {e.completion.policy_version for g in groups for e in g.episodes}
    metrics["rollout/policy_version"] = float(min(versions))
    return metrics


class RemoteSFTTrainer:
    """The pool's trainer worker behind the slice of the Trainer interface `run_sft` uses."""

    def __init__(self, pool):
        self.pool = pool
        self.metrics: dict[str, float] = {}

    def train_step(self, inputs: list[dict], targets: dict) -> float:
        """One SFT step on the worker (all its ranks); returns the loss."""
        self.metrics = self.pool.call("trainer", "sft_step", inputs, targets)
        return self.metrics["loss"]
