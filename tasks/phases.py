"""Prefect tasks, one per phase of a GRPO iteration. Each is a thin call into the run's worker-client roles
(workers/remote.py) and returns small values; a WorkerLost is retried after the dead role is restarted and restored
(tasks/recovery.py). A trainer that was rolled back answers {"resume_from": step} rather than failing the task."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE

from forge_core.protocols import RolledBack
from forge_core.recipes.local import ReadyBatch
from tasks.context import get_run
from tasks.recovery import retry_on_worker_lost

PHASE = dict(cache_policy=NONE, persist_result=False, retries=2, retry_delay_seconds=0,
             retry_condition_fn=retry_on_worker_lost)


@task(name="rollout", task_run_name="rollout-{step}", timeout_seconds=1800, **PHASE)
def rollout(run_id: str, step: int) -> tuple[list, dict]:
    """Sample group_size completions for the step's prompts on the generator replicas; (groups, rollout/* metrics)."""
    return get_run(run_id).roles.generator.rollout(step)


@task(name="score_rewards", task_run_name="score_rewards-{step}", timeout_seconds=600, **PHASE)
def score_rewards(run_id: str, step: int, groups: list) -> tuple[list, dict]:
    """Rewards from a reward worker written onto the episodes; (groups, reward/* metrics)."""
    return get_run(run_id).roles.reward.score(step, groups)


@task(name="score_reference", task_run_name="score_reference-{step}", timeout_seconds=900, **PHASE)
def score_reference(run_id: str, step: int, groups: list) -> tuple[list, dict]:
    """Reference-model logprobs for the KL term (only scheduled when loss.beta > 0)."""
    return get_run(run_id).roles.reference.score(step, groups)


@task(name="train_step", task_run_name="train_step-{step}", timeout_seconds=1800, **PHASE)
def train_step(run_id: str, step: int, groups: list) -> dict:
    """One optimizer step on the trainer (publishes version step+1); {"resume_from": n} when a recovery rolled
    the trainer back to step n (nothing trained)."""
    try:
        return get_run(run_id).roles.trainer.train(step, groups)
    except RolledBack as back:
        return {"resume_from": back.step}


@task(name="sync_weights", task_run_name="sync_weights-{version}", timeout_seconds=600, **PHASE)
def sync_weights(run_id: str, version: int) -> dict:
    """Every generator loads `version` from the weight store."""
    return get_run(run_id).roles.generator.sync(version)


@task(name="evaluate", task_run_name="evaluate-{step}", timeout_seconds=1800, **PHASE)
def evaluate(run_id: str, step: int) -> dict:
    """Held-out greedy (and sampled) accuracy of the generator's current weights."""
    return get_run(run_id).roles.generator.evaluate(step)


@task(name="checkpoint", task_run_name="checkpoint-{step}", timeout_seconds=1800, **PHASE)
def checkpoint(run_id: str, step: int, inflight: tuple | None = None) -> dict:
    """Trainer state + HF weights to checkpoints/step-N (infra.checkpoints); `inflight`: step N's batch when it
    was sampled ahead. {"path": …}, or {"resume_from": n} when the trainer is no longer at `step`."""
    try:
        ahead = ReadyBatch(inflight) if inflight is not None else None
        return {"path": get_run(run_id).roles.trainer.checkpoint(step, ahead)}
    except RolledBack as back:
        return {"resume_from": back.step}
