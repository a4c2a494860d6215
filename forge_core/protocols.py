"""The role interfaces of a GRPO iteration. In-process components (forge_core.recipes.local) and the Prefect-task
roles over worker clients (tasks/phases.py) both implement them, so one spine (forge_core.recipes.iteration) drives
either.

Every method takes the step it belongs to, so task names, logs and records agree on the numbering: step s trains
version s into s + 1; `version` arguments are the 1-based versions the Schedule speaks of.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from forge_core.types import Group

Batch = tuple[list[Group], dict[str, float]]  # groups and the metrics gathered with them so far


class RolledBack(Exception):  # noqa: N818 - a signal to the driver, not an error
    """The trainer came back from an older checkpoint (its worker was lost): the run continues from `step`."""

    def __init__(self, step: int) -> None:
        super().__init__(f"trainer restored to step {step}")
        self.step = step

    def __reduce__(self):  # a task returns it as its value: it pickles as RolledBack(step), not RolledBack(message)
        return RolledBack, (self.step,)


@dataclass
class ReadyBatch:
    """A rollout already sampled, where a running one could be."""

    value: Batch

    def result(self) -> Batch:
        return self.value


@runtime_checkable
class PendingBatch(Protocol):
    """A rollout that may still be running (a task future, or a batch already sampled)."""

    def result(self) -> Batch: ...


@runtime_checkable
class GeneratorRole(Protocol):
    """Samples groups with the behaviour policy, loads new versions, evaluates the held-out set."""

    def rollout(self, step: int) -> Batch: ...

    def rollout_ahead(self, step: int) -> PendingBatch:
        """Start step's rollout now (while the previous step trains)."""
        ...

    def resume_ahead(self, step: int, count: int) -> list[PendingBatch]:
        """The ahead rollouts of steps step … step + count - 1 after a (re)start: the batches saved with the
        checkpoint at `step`, if any, else new rollouts of them."""
        ...

    def sync(self, version: int) -> dict[str, float]: ...

    def evaluate(self, version: int) -> dict[str, float]: ...


@runtime_checkable
class RewardScorer(Protocol):
    """Writes each episode's reward (and per-function breakdown); returns reward/* metrics with the groups."""

    def score(self, step: int, groups: list[Group]) -> Batch: ...


@runtime_checkable
class ReferenceScorer(Protocol):
    """Writes reference-model logprobs onto each episode (for the KL term)."""

    def score(self, step: int, groups: list[Group]) -> Batch: ...


@runtime_checkable
class PolicyTrainer(Protocol):
    """Advantages → optimizer step(s) on a batch; checkpoints. Raises RolledBack when it lost its state."""

    def train(self, step: int, groups: list[Group]) -> dict[str, float]: ...

    def checkpoint(self, version: int, ahead: list[PendingBatch]) -> str:
        """Save the trainer at `version` with the batches sampled ahead (steps version, version + 1, …)."""
        ...


@runtime_checkable
class StepRecorder(Protocol):
    """Where a run's steps and checkpoints are recorded (registry + MLflow, or an in-memory history)."""

    def step(self, version: int, metrics: dict[str, float]) -> None: ...

    def samples(self, version: int, groups: list[Group]) -> None:
        """The batch that produced `version`, offered at each eval step and the last one (rewards set)."""

    def checkpoint(self, version: int, path: str) -> None: ...

    def rollback(self, step: int) -> None: ...
