"""The GRPO iteration, written once against the role Protocols; the in-process loop and the Prefect flow both drive
it (`run_grpo_steps`), with local components or with tasks over worker clients."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from forge_core.protocols import (
    Batch,
    GeneratorRole,
    PendingBatch,
    PolicyTrainer,
    ReferenceScorer,
    RewardScorer,
    RolledBack,
    StepRecorder,
)
from forge_core.recipes.reward_watch import RewardFailureWatch
from forge_core.schedule import Schedule

log = logging.getLogger(__name__)


@dataclass
class Roles:
    """The components one run's iterations call."""

    generator: GeneratorRole
    reward: RewardScorer
    trainer: PolicyTrainer
    reference: ReferenceScorer | None = None  # None: no KL term (loss.beta == 0)
    teacher: ReferenceScorer | None = None  # on-policy distillation (distill.teacher set): writes teacher logprobs


def run_iteration(roles: Roles, schedule: Schedule, step: int, ahead: list[PendingBatch],
                  recorder: StepRecorder, watch: RewardFailureWatch | None = None) -> list[PendingBatch]:
    """Step `step`: policy version step → step + 1. `ahead` holds the rollouts already started for step, step + 1,
    … (pipelined); returns those of step + 1, … .

        prompts ─▶ rollout(step) ─▶ reward.score ─▶ reference.score ─▶ teacher.score ─▶ trainer.train ─▶ v+1
                   (behaviour policy:                (beta > 0)         (distill)        (advantages,   │
                    version behaviour_version(step))                                      mini-batches) │
                   pipelined: rollout_ahead(step+L) starts here, sampled with ≤ v while v trains ◀──────┤
                                                        generator.sync(v+1)  when schedule.syncs_at(v+1)
                                                        generator.evaluate   when schedule.evaluates_at(v+1)
                                   recorder.step(v+1) ─▶ trainer.checkpoint  when schedule.checkpoints_at(v+1)
                                   recorder.samples(v+1, groups)  at evals and the last step

    L = schedule.lookahead. A batch older than max_policy_age versions is dropped and sampled again (counted).
    The step is recorded before its checkpoint: a crash after the checkpoint's COMPLETE marker resumes after this
    step, which must then be on record already; a crash before it resumes earlier and the rollback supersedes it.
    A trainer that lost its state raises RolledBack out of train or checkpoint (see run_grpo_steps).
    """
    t0 = time.perf_counter()
    version = step + 1
    queue = list(ahead)
    groups, metrics = admit_batch(roles, schedule, step, queue.pop(0).result() if queue else None)
    groups, reward_metrics = roles.reward.score(step, groups)
    metrics.update(reward_metrics)
    if watch is not None:  # a reward function that raised on every episode of too many steps ends the run here
        watch.see(step, metrics, groups)
    if roles.reference is not None:
        groups, ref_metrics = roles.reference.score(step, groups)
        metrics.update(ref_metrics)
    if roles.teacher is not None:
        groups, teacher_metrics = roles.teacher.score(step, groups)
        metrics.update(teacher_metrics)
    if schedule.samples_ahead(step):
        queue.append(roles.generator.rollout_ahead(step + schedule.lookahead))
    metrics.update(roles.trainer.train(step, groups))
    if schedule.syncs_at(version):  # the trainer published it (every sync_every, eval, checkpoint, last)
        metrics.update(roles.generator.sync(version))
    if schedule.evaluates_at(version):
        metrics.update(roles.generator.evaluate(version))
    metrics["timing/step"] = time.perf_counter() - t0
    recorder.step(version, metrics)
    if schedule.evaluates_at(version) or version == schedule.steps:
        recorder.samples(version, groups)
    if schedule.checkpoints_at(version):
        recorder.checkpoint(version, roles.trainer.checkpoint(version, queue))
    return queue


def admit_batch(roles: Roles, schedule: Schedule, step: int, batch: Batch | None) -> Batch:
    """Step's batch: the one sampled ahead when it is recent enough (behaviour version ≥ step - max_policy_age),
    else a new rollout now; `rollout/stale_dropped` counts the batches dropped for age."""
    if batch is None:
        return roles.generator.rollout(step)
    groups, metrics = batch
    oldest = min(e.completion.policy_version for g in groups for e in g.episodes)
    if oldest >= schedule.oldest_allowed(step):
        return groups, {**metrics, "rollout/stale_dropped": 0.0}
    log.warning("step %d: dropping a batch sampled by version %d (max_policy_age %d); sampling it again", step,
                oldest, schedule.max_policy_age)
    groups, metrics = roles.generator.rollout(step)
    return groups, {**metrics, "rollout/stale_dropped": 1.0}


def run_grpo_steps(roles: Roles, schedule: Schedule, start: int, recorder: StepRecorder,
                   watch: RewardFailureWatch | None = None) -> None:
    """Steps start..schedule.steps-1. When the trainer comes back from an older checkpoint (RolledBack), the later
    steps are superseded in the records and the run continues from the checkpoint's step. `watch`: ends the run
    (RewardFunctionFailed) when a reward function keeps raising on every episode."""
    step = start
    ahead = resume_ahead(roles, schedule, step)
    while step < schedule.steps:
        try:
            ahead = run_iteration(roles, schedule, step, ahead, recorder, watch)
            step += 1
        except RolledBack as back:
            log.warning("trainer restored to step %d; continuing from there", back.step)
            step = back.step
            recorder.rollback(step)
            ahead = resume_ahead(roles, schedule, step)


def resume_ahead(roles: Roles, schedule: Schedule, step: int) -> list[PendingBatch]:
    """The rollouts in flight when step `step` begins after a (re)start (none on-policy)."""
    count = schedule.ahead_at(step)
    return roles.generator.resume_ahead(step, count) if count else []
