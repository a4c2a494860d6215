"""Prefect tasks, one per phase of a GRPO iteration, and the role interfaces made of them (what the `grpo` flow
hands the iteration spine: each role call is one task run, named after its step).

A task body is a thin call into the run's worker-client roles (workers/remote.py) and returns small values; a
WorkerLost is retried after the dead role is restarted and restored (tasks/recovery.py). A trainer that was rolled
back returns its RolledBack rather than raising it (the task run ends Completed); its task role raises it in the flow.

Episode batches go into tasks wrapped in `quote`: Prefect otherwise walks every nested object of a task's arguments
looking for futures (~90 ms per call for a 256-episode batch against ~10 ms quoted).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE
from prefect.utilities.annotations import quote

from forge_core.protocols import Batch, PendingBatch, ReadyBatch, RolledBack
from forge_core.recipes.iteration import Roles
from forge_core.recipes.local import ScoredDuringRollout
from infra import checkpoints as ckpt
from tasks.context import get_run
from tasks.recovery import retry_on_worker_lost

# No Prefect timeout_seconds: it cannot interrupt a blocking worker call from the threads sweeps and pipelined
# rollouts run tasks in (Prefect warns on every such task run); workers.call_timeout_s bounds each call instead.
PHASE = dict(cache_policy=NONE, persist_result=False, retries=2, retry_delay_seconds=0,
             retry_condition_fn=retry_on_worker_lost)


def named_after_version(phase: str):
    """Task-run name of a phase of step s (0-based): `phase-(s+1)`, the version the step produces — the number
    the progress line ("step 3/10"), MLflow and the sync/evaluate/checkpoint task runs of that step show."""
    def name(parameters: dict) -> str:
        return f"{phase}-{parameters['step'] + 1}"
    return name


@task(name="rollout", task_run_name=named_after_version("rollout"), **PHASE)
def rollout(run_id: str, step: int) -> tuple[list, dict]:
    """Sample group_size completions for the step's prompts on the generator replicas; (groups, rollout/* metrics)."""
    return get_run(run_id).roles.generator.rollout(step)


@task(name="score_rewards", task_run_name=named_after_version("score_rewards"), **PHASE)
def score_rewards(run_id: str, step: int, groups: list) -> tuple[list, dict]:
    """Rewards from a reward worker written onto the episodes; (groups, reward/* metrics)."""
    return get_run(run_id).roles.reward.score(step, groups)


@task(name="score_reference", task_run_name=named_after_version("score_reference"), **PHASE)
def score_reference(run_id: str, step: int, groups: list) -> tuple[list, dict]:
    """Reference-model logprobs for the KL term (only scheduled when loss.beta > 0)."""
    return get_run(run_id).roles.reference.score(step, groups)


@task(name="score_teacher", task_run_name=named_after_version("score_teacher"), **PHASE)
def score_teacher(run_id: str, step: int, groups: list) -> tuple[list, dict]:
    """The teacher's logprobs of the sampled tokens and distill/* metrics (only scheduled with distill.teacher)."""
    return get_run(run_id).roles.teacher.score(step, groups)


@task(name="train", task_run_name=named_after_version("train"), **PHASE)
def train(run_id: str, step: int, groups: list) -> dict | RolledBack:
    """The step's policy update on the trainer (publishes version step+1); RolledBack(n), returned, when a recovery
    rolled the trainer back to step n (nothing trained)."""
    return answer_rollback(lambda: get_run(run_id).roles.trainer.train(step, groups))


@task(name="sync_weights", task_run_name="sync_weights-{version}", **PHASE)
def sync_weights(run_id: str, version: int) -> dict | RolledBack:
    """Every generator loads `version` from the weight store (RolledBack: see train)."""
    return answer_rollback(lambda: get_run(run_id).roles.generator.sync(version))


@task(name="evaluate", task_run_name="evaluate-{step}", **PHASE)
def evaluate(run_id: str, step: int) -> dict | RolledBack:
    """Held-out greedy (and sampled) accuracy of the generator's current weights (RolledBack: see train)."""
    return answer_rollback(lambda: get_run(run_id).roles.generator.evaluate(step))


@task(name="checkpoint", task_run_name="checkpoint-{step}", **PHASE)
def checkpoint(run_id: str, step: int, inflight: list | None = None) -> dict | RolledBack:
    """Trainer state + HF weights to checkpoints/step-N (infra.checkpoints); `inflight`: the batches of steps N,
    N+1, … sampled ahead. {"path": …}, or RolledBack when the trainer is no longer at `step`."""
    ahead = [ReadyBatch(batch) for batch in inflight or []]
    return answer_rollback(lambda: {"path": get_run(run_id).roles.trainer.checkpoint(step, ahead)})


def answer_rollback(call) -> dict | RolledBack:
    """`call()`, or the RolledBack(n) it raised, as the task's value: a recovery restored the trainer to step n,
    which is the flow's signal, not a failure (so the task run ends Completed; raise_rollback raises it again)."""
    try:
        return call()
    except RolledBack as back:
        return back


def raise_rollback(answer: dict | RolledBack) -> dict:
    """A task's answer; the RolledBack it returned is raised here, in the flow."""
    if isinstance(answer, RolledBack):
        raise answer
    return answer


# ---- the role interfaces as task calls ----


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
        return rollout(self.run_id, step)

    def rollout_ahead(self, step: int) -> PendingBatch:
        self._settle()
        self.calls.count += 1
        self.inflight = rollout.submit(self.run_id, step)
        return self.inflight

    def resume_ahead(self, step: int, count: int) -> list[PendingBatch]:
        """The batches saved with the checkpoint at `step` when there are (sampled with the versions the
        uninterrupted run used), else new rollout tasks for steps step … step + count - 1."""
        saved = ckpt.load_inflight(self.checkpoint_dir, step)
        if saved is not None:
            return [ReadyBatch(batch) for batch in saved]
        return [self.rollout_ahead(step + i) for i in range(count)]

    def sync(self, version: int) -> dict[str, float]:
        self._settle()
        self.calls.count += 1
        return raise_rollback(sync_weights(self.run_id, version))

    def evaluate(self, version: int) -> dict[str, float]:
        self._settle()
        self.calls.count += 1
        return raise_rollback(evaluate(self.run_id, version))


@dataclass
class TaskScorer:
    """RewardScorer / ReferenceScorer as the score_rewards, score_reference or score_teacher task."""

    run_id: str
    task: object
    calls: TaskCalls

    def score(self, step: int, groups) -> Batch:
        self.calls.count += 1
        return self.task(self.run_id, step, quote(groups))


@dataclass
class TaskTrainer:
    """PolicyTrainer as train / checkpoint tasks; a rolled-back trainer raises RolledBack here, in the flow."""

    run_id: str
    calls: TaskCalls

    def train(self, step: int, groups) -> dict[str, float]:
        self.calls.count += 1
        return raise_rollback(train(self.run_id, step, quote(groups)))

    def checkpoint(self, version: int, ahead: list[PendingBatch]) -> str:
        self.calls.count += 1
        inflight = quote([batch.result() for batch in ahead]) if ahead else None  # sampled ahead
        # lost while saving: RolledBack now (the next rollout would ask for a version the trainer no longer has)
        return raise_rollback(checkpoint(self.run_id, version, inflight))["path"]


def task_roles(run_id: str, checkpoint_dir: Path, with_reference: bool, calls: TaskCalls,
               scored_in_rollout: bool = False, with_teacher: bool = False) -> Roles:
    """The Roles whose every call is a Prefect task of run `run_id`; `scored_in_rollout`: the rollout task scores
    rewards itself (dynamic sampling refills), so there is no score_rewards task."""
    reference = TaskScorer(run_id, score_reference, calls) if with_reference else None
    teacher = TaskScorer(run_id, score_teacher, calls) if with_teacher else None
    reward = ScoredDuringRollout() if scored_in_rollout else TaskScorer(run_id, score_rewards, calls)
    return Roles(TaskGenerator(run_id, checkpoint_dir, calls), reward, TaskTrainer(run_id, calls), reference,
                 teacher)
