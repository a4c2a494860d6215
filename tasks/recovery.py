"""Retry condition for phase tasks: on WorkerLost, restart every dead role of the run and restore it before the
retry (a node failure loses several roles at once; one found dead during the restore is recovered too).

The trainer comes back from the latest complete checkpoint (or its initial weights) and republishes its weights;
generators reload the trainer's current version. The flow then continues from the trainer's actual step.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from infra.components import run_schedule
from runtime.interrupts import exception_chain
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
    try:
        recover_role(ctx, exc.role.rsplit("-", 1)[0], reason=exc.reason, job_id=exc.job_id)
    except Exception:  # the task then fails with its WorkerLost, and the flow ends Crashed (rescheduled, resumable)
        log.exception("recovering from %s failed: not retrying the task", exc)
        return False
    return True


def lost_worker(exc: BaseException | None) -> WorkerLost | None:
    """The WorkerLost in `exc`'s chain, if any: an infrastructure failure rather than a bug or a user error."""
    return next((e for e in exception_chain(exc) if isinstance(e, WorkerLost)), None)


RECOVERY_ROUNDS = 3  # a role found dead while others are being restored is restarted in the next round


def recover_role(ctx: RunContext, role: str, reason: str = "", job_id: str | None = None) -> int:
    """Restart `role`, and every other role of the run found dead with it (a lost node takes several), and bring
    them back to the run's state; returns the trainer's step afterwards. One recovery runs at a time: a task that
    lost job `job_id` after another task's recovery replaced it (and nothing is dead now) just retries."""
    with ctx.recovery_lock:
        if job_id is not None and str(job_id) not in ctx.pool.job_ids(role) and not ctx.pool.dead_roles():
            log.info("%s job %s was already replaced by another task's recovery", role, job_id)
            return ctx.pool.call("trainer", "health")["step"]
        return restart_dead_roles(ctx, role, reason)


def restart_dead_roles(ctx: RunContext, role: str, reason: str) -> int:
    """recover_role's work (under its lock)."""
    t0 = time.perf_counter()
    restarted: list[str] = []
    dead = {role} | ctx.pool.dead_roles()
    for _ in range(RECOVERY_ROUNDS):
        try:
            for lost in sorted(dead, key=lambda r: (r != "trainer", r)):  # the others are restored from the trainer
                ctx.pool.restart(lost)
                restarted.append(lost)
            step = restore_state(ctx, set(restarted))
            break
        except WorkerLost as exc:  # another role died too (or during the restore): restart it in the next round
            found = exc.role.rsplit("-", 1)[0]
            log.warning("while recovering %s, %s was lost too (%s): recovering it as well", restarted, found,
                        exc.reason)
            dead = {found} | ctx.pool.dead_roles()
    else:
        raise WorkerLost(role, "-", f"could not recover {sorted(dead)} in {RECOVERY_ROUNDS} rounds ({reason})")
    seconds = time.perf_counter() - t0
    slurm = {lost: text for lost in dict.fromkeys(restarted) if (text := ctx.pool.describe_losses(lost))}
    for lost in dict.fromkeys(restarted):
        ctx.recoveries.append({"role": lost, "reason": reason, "trainer_step": step, "seconds": seconds,
                               **({"slurm": slurm[lost]} if lost in slurm else {})})
    if ctx.records is not None:
        ctx.records.workers(ctx.pool)  # the restarted workers replace the lost ones in the registry
    where = "".join(f"; {role}: {text}" for role, text in slurm.items())
    log.warning("recovered %s (%s%s): trainer at step %d", ", ".join(dict.fromkeys(restarted)), reason, where, step)
    return step


def restore_state(ctx: RunContext, restarted: set[str]) -> int:
    """Bring restarted roles back to the run's state (idempotent: a later round may run it again); returns the
    trainer's step. A restarted trainer loads the latest checkpoint and every generator its weights."""
    pool = ctx.pool
    if "trainer" in restarted:
        return restore_trainer(ctx, ctx.latest_checkpoint())
    step = pool.call("trainer", "health")["step"]
    if "generator" in restarted:
        version = run_schedule(ctx.cfg).last_sync_at(step)  # what the lost generators held; still in an fs store
        if ctx.cfg.weightsync.backend == "broadcast":
            # the new group holds no version, and the trainer only has its current weights (`step`): with spaced
            # syncs or pipelining the generators now sample newer weights than the uninterrupted run did
            version = pool.call("trainer", "publish_weights", step)
        pool.call_all("generator", "load_weights", version)
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
