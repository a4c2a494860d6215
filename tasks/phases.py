"""Prefect tasks, one per phase of a GRPO iteration. Each is a thin call into the run's workers and returns small
values; a WorkerLost is retried after the dead role is restarted and restored (tasks/recovery.py)."""

from __future__ import annotations

import json
import shutil
import time

from prefect import task
from prefect.cache_policies import NONE

from forge_core.recipes.grpo import sample_prompt_indices
from forge_core.recipes.steps import rollout_metrics, step_seed
from forge_core.training.trainer import save_atomically
from infra import components as C
from infra.records import file_sha256
from tasks.context import get_run
from tasks.recovery import retry_on_worker_lost
from workers import remote

INFLIGHT = "inflight_rollout.pt"  # a pipelined run's batch for the checkpoint's step, sampled ahead

PHASE = dict(cache_policy=NONE, persist_result=False, retries=2, retry_delay_seconds=0,
             retry_condition_fn=retry_on_worker_lost)


@task(name="rollout", task_run_name="rollout-{step}", timeout_seconds=1800, **PHASE)
def rollout(run_id: str, step: int) -> tuple[list, dict]:
    """Sample group_size completions for the step's prompts on the generator replicas; (groups, rollout/* metrics)."""
    ctx = get_run(run_id)
    cfg, splits = ctx.cfg, ctx.splits
    idx = sample_prompt_indices(len(splits.train), cfg.prompts_per_step, cfg.seed, step)
    t0 = time.perf_counter()
    groups = remote.remote_rollout(ctx.pool, [splits.train[i] for i in idx], [splits.train_prompts[i] for i in idx],
                                   cfg.group_size, step_seed(cfg.seed, step), behaviour_version(cfg, step))
    seconds = time.perf_counter() - t0
    metrics = rollout_metrics(groups)
    tokens = sum(len(e.completion.token_ids) for g in groups for e in g.episodes)
    versions = [e.completion.policy_version for g in groups for e in g.episodes]
    metrics.update({"rollout/tokens_per_s": tokens / max(seconds, 1e-9), "timing/rollout": seconds,
                    "rollout/policy_staleness": float(step - min(versions))})
    return groups, metrics


def behaviour_version(cfg, step: int) -> int:
    """The policy version step `step`'s rollout samples with in the uninterrupted schedule: the newest version synced
    by `step` on-policy, by step - 1 pipelined (sampled while step - 1 trains). Pinning it makes a recovered run
    sample exactly as an uninterrupted one."""
    return C.last_sync_at(cfg, max(step - 1, 0) if cfg.max_policy_age >= 1 else step)


@task(name="score_rewards", task_run_name="score_rewards-{step}", timeout_seconds=600, **PHASE)
def score_rewards(run_id: str, step: int, groups: list) -> tuple[list, dict]:
    """Rewards from a reward worker written onto the episodes; (groups, reward/* metrics)."""
    t0 = time.perf_counter()
    metrics = remote.remote_score(get_run(run_id).pool, groups)
    metrics["timing/reward"] = time.perf_counter() - t0
    return groups, metrics


@task(name="score_reference", task_run_name="score_reference-{step}", timeout_seconds=900, **PHASE)
def score_reference(run_id: str, step: int, groups: list) -> tuple[list, dict]:
    """Reference-model logprobs for the KL term (only scheduled when loss.beta > 0)."""
    t0 = time.perf_counter()
    remote.remote_reference(get_run(run_id).pool, groups)
    return groups, {"timing/reference": time.perf_counter() - t0}


@task(name="train_step", task_run_name="train_step-{step}", timeout_seconds=1800, **PHASE)
def train_step(run_id: str, step: int, groups: list) -> dict:
    """One optimizer step on the trainer (publishes version step+1). When a recovery rolled the trainer back,
    nothing is trained and `resume_from` says where the flow continues."""
    ctx = get_run(run_id)
    actual = ctx.pool.call("trainer", "health")["step"]
    if actual != step:
        return {"resume_from": actual}
    t0 = time.perf_counter()
    metrics = remote.remote_train(ctx.pool, groups, step)
    metrics["timing/train"] = time.perf_counter() - t0
    return metrics


@task(name="sync_weights", task_run_name="sync_weights-{version}", timeout_seconds=600, **PHASE)
def sync_weights(run_id: str, version: int) -> dict:
    """Every generator loads `version` from the weight store."""
    t0 = time.perf_counter()
    remote.remote_sync(get_run(run_id).pool, version)
    return {"timing/sync": time.perf_counter() - t0}


@task(name="evaluate", task_run_name="evaluate-{step}", timeout_seconds=1800, **PHASE)
def evaluate(run_id: str, step: int) -> dict:
    """Held-out greedy (and sampled) accuracy of the generator's current weights."""
    ctx = get_run(run_id)
    return ctx.pool.call("generator", "evaluate", ctx.splits.eval, ctx.splits.eval_prompts, ctx.cfg.eval.samples)


@task(name="checkpoint", task_run_name="checkpoint-{step}", timeout_seconds=1800, **PHASE)
def checkpoint(run_id: str, step: int, inflight: tuple | None = None) -> str | None:
    """Trainer state + HF weights to checkpoints/step-N; COMPLETE is written last, old ones pruned to `keep`.
    `inflight`: the (groups, metrics) of step N's rollout when it was sampled ahead (pipelined), saved with the
    checkpoint so a resume trains on the same batch. None when the trainer is no longer at `step` (rolled back by
    a recovery; the next train_step notices)."""
    ctx = get_run(run_id)
    if ctx.pool.call("trainer", "health")["step"] != step:
        return None  # a recovery rolled the trainer back: never label older weights as this step
    path = ctx.checkpoint_dir / f"step-{step:06d}"
    # state_sha256: equal for equal training states (the file's own bytes are not canonical)
    state_sha256 = ctx.pool.call("trainer", "save_checkpoint", str(path))
    if inflight is not None:
        save_atomically(inflight, path / INFLIGHT)
    state = path / "trainer.pt"
    # the data sampler and the sampling seeds are pure functions of (seed, step): the step is their position
    marker = {"step": step, "policy_version": step, "sha256": file_sha256(state), "bytes": state.stat().st_size,
              "state_sha256": state_sha256, "sampler": {"seed": ctx.cfg.seed, "next_step": step},
              "inflight_sha256": file_sha256(path / INFLIGHT) if inflight is not None else None}
    tmp = path / "COMPLETE.tmp"
    tmp.write_text(json.dumps(marker))
    tmp.replace(path / "COMPLETE")  # written last: a checkpoint without it is ignored on resume
    complete = sorted(p.parent for p in ctx.checkpoint_dir.glob("step-*/COMPLETE"))
    for old in complete[: -ctx.cfg.checkpoint.keep]:
        (old / "COMPLETE").unlink()  # first, so a crash mid-delete never leaves a "complete" partial checkpoint
        shutil.rmtree(old)
    return str(path)
