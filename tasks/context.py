"""What the tasks of a live run share: the worker pool, the config, the problems, the checkpoint directory.

The flow registers a RunContext when its pool is up; tasks look it up by run id (task parameters stay small).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from infra.components import ProblemSplits
from infra.config import RunConfig

log = logging.getLogger(__name__)


@dataclass
class RunContext:
    run_id: str
    cfg: RunConfig
    pool: object  # infra.launcher.WorkerPool
    splits: ProblemSplits
    out: Path
    records: object | None = None  # infra.records.RunRecords
    recoveries: list[dict] = field(default_factory=list)

    @property
    def checkpoint_dir(self) -> Path:
        return self.out / "checkpoints"

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint whose trainer state still matches the sha256 in its COMPLETE marker;
        a truncated or corrupted one is skipped (logged) in favour of the previous good one."""
        return latest_good_checkpoint(self.checkpoint_dir)


def latest_good_checkpoint(checkpoint_dir: Path) -> Path | None:
    from infra.records import file_sha256

    for path in sorted((p.parent for p in checkpoint_dir.glob("step-*/COMPLETE")), reverse=True):
        marker = json.loads((path / "COMPLETE").read_text())
        state = path / "trainer.pt"
        if "sha256" not in marker:
            return path
        if state.exists() and file_sha256(state) == marker["sha256"]:
            return path
        log.error("checkpoint %s is corrupted or truncated (sha256 mismatch): using the previous one", path)
    return None


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
