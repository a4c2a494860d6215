"""The GRPO iteration, written once against the role Protocols; the in-process loop and the Prefect flow both drive
it (`run_grpo_steps`), with local components or with tasks over worker clients."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from forge_core.protocols import (
    GeneratorRole,
    PendingBatch,
    PolicyTrainer,
    ReferenceScorer,
    RewardScorer,
    RolledBack,
    StepRecorder,
)
from forge_core.schedule import Schedule

log = logging.getLogger(__name__)


@dataclass
class Roles:
    """The components one run's iterations call."""

    generator: GeneratorRole
    reward: RewardScorer
    trainer: PolicyTrainer
    reference: ReferenceScorer | None = None  # None: no KL term (loss.beta == 0)


def run_iteration(roles: Roles, schedule: Schedule, step: int, ahead: PendingBatch | None,
                  recorder: StepRecorder) -> PendingBatch | None:
    """Step `step`: policy version step → step + 1; returns the rollout of step + 1 when it was started ahead.

        prompts ─▶ rollout(step) ──groups──▶ reward.score ──▶ reference.score ──▶ trainer.train ──▶ weights v+1
                   (behaviour policy:                           (beta > 0)       (advantages,        │
                    version schedule.behaviour_version(step))                     optimizer step)    │
                   pipelined: rollout_ahead(step+1) starts here, sampled with v while v trains ◀─────┤
                                                        generator.sync(v+1)  when schedule.syncs_at(v+1)
                                                        generator.evaluate   when schedule.evaluates_at(v+1)
                                   recorder.step(v+1) ─▶ trainer.checkpoint  when schedule.checkpoints_at(v+1)

    The step is recorded before its checkpoint: a crash after the checkpoint's COMPLETE marker resumes after this
    step, which must then be on record already; a crash before it resumes earlier and the rollback supersedes it.
    A trainer that lost its state raises RolledBack out of train or checkpoint (see run_grpo_steps).
    """
    t0 = time.perf_counter()
    version = step + 1
    groups, metrics = ahead.result() if ahead is not None else roles.generator.rollout(step)
    groups, reward_metrics = roles.reward.score(step, groups)
    metrics.update(reward_metrics)
    if roles.reference is not None:
        groups, ref_metrics = roles.reference.score(step, groups)
        metrics.update(ref_metrics)
    ahead = roles.generator.rollout_ahead(step + 1) if schedule.samples_ahead(step) else None
    metrics.update(roles.trainer.train(step, groups))
    if schedule.syncs_at(version):  # the trainer published it (every sync_every, eval, checkpoint, last)
        metrics.update(roles.generator.sync(version))
    if schedule.evaluates_at(version):
        metrics.update(roles.generator.evaluate(version))
    metrics["timing/step"] = time.perf_counter() - t0
    recorder.step(version, metrics)
    if schedule.checkpoints_at(version):
        recorder.checkpoint(version, roles.trainer.checkpoint(version, ahead))
    return ahead


def run_grpo_steps(roles: Roles, schedule: Schedule, start: int, recorder: StepRecorder) -> None:
    """Steps start..schedule.steps-1. When the trainer comes back from an older checkpoint (RolledBack), the later
    steps are superseded in the records and the run continues from the checkpoint's step."""
    step = start
    ahead = roles.generator.resume_ahead(step) if schedule.pipelined and step < schedule.steps else None
    while step < schedule.steps:
        try:
            ahead = run_iteration(roles, schedule, step, ahead, recorder)
            step += 1
        except RolledBack as back:
            log.warning("trainer restored to step %d; continuing from there", back.step)
            step = back.step
            recorder.rollback(step)
            ahead = roles.generator.resume_ahead(step) if schedule.pipelined else None
