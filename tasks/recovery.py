"""Retry condition for phase tasks: on WorkerLost, restart the dead role and restore it before the retry.

The trainer comes back from the latest complete checkpoint (or its initial weights) and republishes its weights;
generators reload the trainer's current version. The flow then continues from the trainer's actual step.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from infra.components import run_schedule
from tasks.context import RunContext, run_owning_job
from workers.protocol import WorkerLost

log = logging.getLogger(__name__)


def retry_on_worker_lost(task, task_run, state) -> bool:
    """Prefect retry_condition_fn: True (after recovering the role) for WorkerLost, False for anything else."""
    exc = state.data if isinstance(state.data, BaseException) else None
    if not isinstance(exc, WorkerLost):
        return False
    ctx = run_owning_job(exc.job_id)
    if ctx is None:
        log.error("WorkerLost for job %s, which no live run owns: not retrying", exc.job_id)
        return False
    recover_role(ctx, exc.role.rsplit("-", 1)[0], reason=exc.reason)
    return True


def recover_role(ctx: RunContext, role: str, reason: str = "") -> int:
    """Restart `role` and bring it back to the run's state; returns the trainer's step afterwards."""
    t0 = time.perf_counter()
    pool = ctx.pool
    pool.restart(role)
    if role == "trainer":
        step = restore_trainer(ctx, ctx.latest_checkpoint())
    else:
        step = pool.call("trainer", "health")["step"]
        if role == "generator":
            version = run_schedule(ctx.cfg).last_sync_at(step)  # what the lost generators held; still in an fs store
            if ctx.cfg.weightsync.backend == "broadcast":
                # the new group holds no version, and the trainer only has its current weights (`step`): with spaced
                # syncs or pipelining the generators now sample newer weights than the uninterrupted run did
                version = pool.call("trainer", "publish_weights", step)
            pool.call_all("generator", "load_weights", version)
    ctx.recoveries.append({"role": role, "reason": reason, "trainer_step": step,
                           "seconds": time.perf_counter() - t0})
    if ctx.records is not None:
        ctx.records.workers(pool)  # the restarted workers replace the lost ones in the registry
    log.warning("recovered %s (%s): trainer at step %d", role, reason, step)
    return step


def restore_trainer(ctx: RunContext, checkpoint: Path | None) -> int:
    """Load `checkpoint` into the trainer (None: keep a fresh trainer's initial weights, step 0), publish its weights
    and load them into every generator; returns the trainer's step."""
    pool = ctx.pool
    step = pool.call("trainer", "load_checkpoint", str(checkpoint)) if checkpoint else 0
    pool.call("trainer", "publish_weights", step)
    pool.call_all("generator", "load_weights", step)
    return step


def restore_latest(ctx: RunContext) -> tuple[int, Path | None]:
    """Load the run's latest complete checkpoint into the trainer (and its weights into the generators);
    returns (the step to continue from, that checkpoint), (0, None) for a fresh run."""
    checkpoint = ctx.latest_checkpoint()
    if checkpoint is None:
        return 0, None
    step = restore_trainer(ctx, checkpoint)
    log.info("resumed from %s at step %d", checkpoint, step)
    return step, checkpoint
