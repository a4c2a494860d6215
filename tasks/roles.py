"""The role Protocols as Prefect tasks: what the `grpo` flow hands the iteration spine. Each call is one task run
(named after its step); the task's body calls the worker-client role of the same name (tasks/phases.py).

Episode batches go into tasks wrapped in `quote`: Prefect otherwise walks every nested object of a task's arguments
looking for futures (~90 ms per call for a 256-episode batch against ~10 ms quoted).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect.utilities.annotations import quote

from forge_core.protocols import Batch, PendingBatch, RolledBack
from forge_core.recipes.iteration import Roles
from forge_core.recipes.local import ReadyBatch
from infra import checkpoints as ckpt
from tasks import phases


@dataclass
class TaskCalls:
    """How many task runs the flow made (the CLI waits until the Prefect API has recorded them all)."""

    count: int = 0


class TaskGenerator:
    """GeneratorRole as rollout / sync_weights / evaluate tasks. The generators' connections serve one call at a
    time, so every call first waits for the rollout this role started ahead (the one owner of that connection)."""

    def __init__(self, run_id: str, checkpoint_dir: Path, calls: TaskCalls):
        self.run_id, self.checkpoint_dir, self.calls = run_id, checkpoint_dir, calls
        self.inflight = None  # the PrefectFuture of the rollout started ahead

    def _settle(self) -> None:
        if self.inflight is not None:
            self.inflight.wait()
            self.inflight = None

    def rollout(self, step: int) -> Batch:
        self._settle()
        self.calls.count += 1
        return phases.rollout(self.run_id, step)

    def rollout_ahead(self, step: int) -> PendingBatch:
        self._settle()
        self.calls.count += 1
        self.inflight = phases.rollout.submit(self.run_id, step)
        return self.inflight

    def resume_ahead(self, step: int) -> PendingBatch:
        """The batch saved with the checkpoint at `step` when there is one (sampled with version step-1, as in the
        uninterrupted run), else a new rollout task."""
        saved = ckpt.load_inflight(self.checkpoint_dir, step)
        return ReadyBatch(saved) if saved is not None else self.rollout_ahead(step)

    def sync(self, version: int) -> dict[str, float]:
        self._settle()
        self.calls.count += 1
        return phases.sync_weights(self.run_id, version)

    def evaluate(self, version: int) -> dict[str, float]:
        self._settle()
        self.calls.count += 1
        return phases.evaluate(self.run_id, version)


@dataclass
class TaskScorer:
    """RewardScorer / ReferenceScorer as the score_rewards or score_reference task."""

    run_id: str
    task: object
    calls: TaskCalls

    def score(self, step: int, groups) -> Batch:
        self.calls.count += 1
        return self.task(self.run_id, step, quote(groups))


@dataclass
class TaskTrainer:
    """PolicyTrainer as train_step / checkpoint tasks; a rolled-back trainer raises RolledBack here, in the flow."""

    run_id: str
    calls: TaskCalls

    def train(self, step: int, groups) -> dict[str, float]:
        self.calls.count += 1
        metrics = phases.train_step(self.run_id, step, quote(groups))
        if "resume_from" in metrics:
            raise RolledBack(metrics["resume_from"])
        return metrics

    def checkpoint(self, version: int, ahead: PendingBatch | None) -> str:
        self.calls.count += 1
        inflight = quote(ahead.result()) if ahead is not None else None  # step N's batch, sampled ahead
        saved = phases.checkpoint(self.run_id, version, inflight)
        if "resume_from" in saved:  # lost while saving: go back now (the next rollout would ask the generators
            raise RolledBack(saved["resume_from"])  # for a version the restored trainer no longer has)
        return saved["path"]


def task_roles(run_id: str, checkpoint_dir: Path, with_reference: bool, calls: TaskCalls) -> Roles:
    """The Roles whose every call is a Prefect task of run `run_id`."""
    reference = TaskScorer(run_id, phases.score_reference, calls) if with_reference else None
    return Roles(TaskGenerator(run_id, checkpoint_dir, calls), TaskScorer(run_id, phases.score_rewards, calls),
                 TaskTrainer(run_id, calls), reference)
