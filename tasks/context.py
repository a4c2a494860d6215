"""What the tasks of a live run share: the worker pool, its worker-client roles, the config and the problems.

The flow registers a RunContext when its pool is up; tasks look it up by run id, so task parameters stay small
(Prefect walks every argument of a task call, and records them).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from forge_core.recipes.iteration import Roles
from forge_core.recipes.local import ScoredDuringRollout
from infra import checkpoints as ckpt
from infra.components import ProblemSplits, needs_reference, run_schedule
from infra.config import RunConfig
from workers.pool import WorkerPool
from workers.remote import RemoteGenerator, RemoteModelScorer, RemoteRewardScorer, RemoteTrainer

log = logging.getLogger(__name__)


def remote_roles(pool: WorkerPool, splits: ProblemSplits, checkpoint_dir: Path) -> Roles:
    """The role Protocols over the pool's workers, configured by its run config."""
    cfg = pool.cfg
    reward = RemoteRewardScorer(pool)
    generator = RemoteGenerator(pool, splits, run_schedule(cfg), cfg.prompts_per_step, cfg.group_size, cfg.seed,
                                cfg.eval.samples, fill_rounds=cfg.fill_rounds if cfg.filter_groups else 1,
                                reward=reward, env_enabled=cfg.env.enabled)
    reference = RemoteModelScorer(pool) if needs_reference(cfg) else None
    teacher = RemoteModelScorer(pool, "teacher") if cfg.distill.enabled else None
    trainer = RemoteTrainer(pool, checkpoint_dir, cfg.seed, cfg.checkpoint.keep)
    return Roles(generator, ScoredDuringRollout() if generator.scored_in_rollout else reward, trainer, reference,
                 teacher)


@dataclass
class RunContext:
    run_id: str
    cfg: RunConfig
    pool: WorkerPool
    splits: ProblemSplits
    out: Path
    records: object | None = None  # infra.records.RunRecords
    recoveries: list[dict] = field(default_factory=list)
    # one recovery at a time: a pipelined rollout and the train task can lose the same node at once
    recovery_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.roles = remote_roles(self.pool, self.splits, self.checkpoint_dir)

    @property
    def checkpoint_dir(self) -> Path:
        return self.out / "checkpoints"

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint whose trainer state matches its marker (infra.checkpoints)."""
        return ckpt.latest_good_checkpoint(self.checkpoint_dir)


_RUNS: dict[str, RunContext] = {}


def register_run(ctx: RunContext) -> None:
    _RUNS[ctx.run_id] = ctx


def unregister_run(run_id: str) -> None:
    _RUNS.pop(run_id, None)


def get_run(run_id: str) -> RunContext:
    if run_id not in _RUNS:
        raise RuntimeError(f"run {run_id} has no live worker pool in this process (tasks run inside its flow)")
    return _RUNS[run_id]


def run_owning_job(job_id: str) -> RunContext | None:
    """The live run whose pool holds the job (to recover from a WorkerLost)."""
    for ctx in _RUNS.values():
        for members in ctx.pool.members.values():
            if any(str(m.job.job_id) == str(job_id) for m in members):
                return ctx
    return None
