"""Repository functions over the registry tables. Each takes a Session; the caller commits."""

from __future__ import annotations

import hashlib
import json

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from infra.registry.models import Checkpoint, Iteration, Run, Sweep, Worker, utcnow

RUN_STATUSES = ("running", "completed", "failed", "interrupted", "crashed")


def config_hash(config: dict) -> str:
    """sha256 of the canonical JSON of a resolved config."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def create_run(s: Session, run_id: str, recipe: str, config: dict, name: str | None = None, **fields) -> Run:
    """Insert a run (status running); fields: code_version, dataset_fingerprint, prefect_flow_run_id,
    mlflow_run_id, sweep_id, parent_run_id, init_checkpoint_id."""
    run = Run(id=run_id, name=name, recipe=recipe, config=config, config_hash=config_hash(config), **fields)
    s.add(run)
    s.flush()
    return run


def get_run(s: Session, run_id: str) -> Run:
    """The run, or ValueError naming the id and how to list runs."""
    run = s.get(Run, run_id)
    if run is None:
        matches = s.scalars(select(Run).where(Run.id.like(f"{run_id}%"))).all()
        if len(matches) == 1:
            return matches[0]
        raise ValueError(f"no run {run_id!r} in the registry" + (f" ({len(matches)} runs start with it)" if matches
                         else "") + "; `forgeflow runs ls` lists runs")
    return run


def update_run(s: Session, run_id: str, **fields) -> Run:
    run = get_run(s, run_id)
    if "status" in fields and fields["status"] not in RUN_STATUSES:
        raise ValueError(f"run status {fields['status']!r} is not one of {RUN_STATUSES}")
    for k, v in fields.items():
        setattr(run, k, v)
    if fields.get("status") in ("completed", "failed", "interrupted", "crashed"):
        run.ended_at = utcnow()
    s.flush()
    return run


def list_runs(s: Session, limit: int = 50, sweep_id: str | None = None) -> list[Run]:
    q = select(Run).order_by(Run.created_at.desc()).limit(limit)
    if sweep_id:
        q = q.where(Run.sweep_id == sweep_id)
    return list(s.scalars(q))


def record_iteration(s: Session, run_id: str, step: int, metrics: dict, policy_version: int | None = None) -> Iteration:
    """Record `step` as completed; an earlier completed attempt of the same step becomes 'superseded'."""
    previous = s.scalars(select(Iteration).where(Iteration.run_id == run_id, Iteration.step == step)).all()
    for it in previous:
        it.status = "superseded"
    timings = {k: v for k, v in metrics.items() if k.startswith("timing/")}
    rest = {k: v for k, v in metrics.items() if not k.startswith("timing/")}
    it = Iteration(run_id=run_id, step=step, attempt=len(previous) + 1, status="completed",
                   policy_version=policy_version, metrics=rest, timings=timings)
    s.add(it)
    s.flush()
    return it


def record_eval(s: Session, run_id: str, step: int, metrics: dict) -> None:
    """Evaluation metrics of the weights at `step`: merged into that step's completed iteration, or (the initial
    weights, step 0) kept in a row of status 'eval' that step counts and rollbacks ignore."""
    rows = s.scalars(select(Iteration).where(Iteration.run_id == run_id, Iteration.step == step,
                                             Iteration.status.in_(("completed", "eval")))).all()
    if rows:
        for it in rows:
            it.metrics = {**it.metrics, **metrics}  # a new dict: JSON columns track assignment, not mutation
    else:
        s.add(Iteration(run_id=run_id, step=step, attempt=0, status="eval", policy_version=step, metrics=metrics,
                        timings={}))
    s.flush()


def supersede_after(s: Session, run_id: str, step: int) -> int:
    """Mark completed iterations after `step` superseded (the run rolled back to `step`); returns how many."""
    result = s.execute(update(Iteration).where(Iteration.run_id == run_id, Iteration.step > step,
                                               Iteration.status == "completed").values(status="superseded"))
    return result.rowcount or 0


def completed_steps(s: Session, run_id: str) -> list[int]:
    return list(s.scalars(select(Iteration.step).where(Iteration.run_id == run_id, Iteration.status == "completed")
                          .order_by(Iteration.step)))


def record_checkpoint(s: Session, run_id: str, step: int, uri: str, sha256: str, size_bytes: int,
                      kind: str = "trainer", parent_checkpoint_id: int | None = None,
                      state_sha256: str | None = None) -> Checkpoint:
    """Register a checkpoint; its parent defaults to the run's previous checkpoint (or the run's init checkpoint)."""
    if parent_checkpoint_id is None:
        prev = s.scalars(select(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.step < step)
                         .order_by(Checkpoint.step.desc(), Checkpoint.id.desc()).limit(1)).first()
        parent_checkpoint_id = prev.id if prev else get_run(s, run_id).init_checkpoint_id
    ck = Checkpoint(run_id=run_id, step=step, uri=uri, sha256=sha256, size_bytes=size_bytes, kind=kind,
                    parent_checkpoint_id=parent_checkpoint_id, state_sha256=state_sha256)
    s.add(ck)
    s.flush()
    return ck


def find_checkpoint(s: Session, ref: str) -> Checkpoint | None:
    """A checkpoint by numeric id or URI."""
    if ref.isdigit():
        return s.get(Checkpoint, int(ref))
    return s.scalars(select(Checkpoint).where(Checkpoint.uri == ref).order_by(Checkpoint.id.desc())).first()


def record_worker(s: Session, run_id: str, name: str, role: str, job_id: str, host: str | None, pid: int | None,
                  started_s: float | None = None) -> Worker:
    """Register a (re)started worker; a restart of the same name counts in `restarts`. The same job recorded again
    (the pool's workers are recorded after each recovery) updates its row."""
    old = s.scalars(select(Worker).where(Worker.run_id == run_id, Worker.name == name)).all()
    same = [w for w in old if w.job_id == str(job_id) and w.state == "running"]
    if same:
        same[0].host, same[0].pid = host or same[0].host, pid or same[0].pid
        return same[0]
    for w in old:
        if w.state == "running":
            w.state = "lost"
    w = Worker(run_id=run_id, name=name, role=role, job_id=str(job_id), host=host, pid=pid, state="running",
               restarts=len(old), started_s=started_s)
    s.add(w)
    s.flush()
    return w


def mark_workers(s: Session, run_id: str, state: str, reason: str | None = None, name: str | None = None) -> None:
    q = update(Worker).where(Worker.run_id == run_id, Worker.state == "running")
    if name:
        q = q.where(Worker.name == name)
    s.execute(q.values(state=state, exit_reason=reason))


def create_sweep(s: Session, sweep_id: str, grid: dict, name: str | None = None) -> Sweep:
    sw = Sweep(id=sweep_id, name=name, grid=grid)
    s.add(sw)
    s.flush()
    return sw


def lineage(s: Session, run_id: str | None = None, checkpoint: Checkpoint | None = None) -> list[dict]:
    """The chain from a run's (or checkpoint's) newest checkpoint back through parent checkpoints and runs:
    [{'checkpoint', 'step', 'run', 'recipe', 'config_hash', 'dataset'}…], newest first."""
    if checkpoint is None:
        run = get_run(s, run_id)
        checkpoint = s.scalars(select(Checkpoint).where(Checkpoint.run_id == run.id)
                               .order_by(Checkpoint.step.desc(), Checkpoint.id.desc()).limit(1)).first()
        if checkpoint is None:
            return [{"checkpoint": None, "run": run.id, "recipe": run.recipe, "config_hash": run.config_hash,
                     "dataset": run.dataset_fingerprint, "init_checkpoint": run.init_checkpoint_id}]
    chain, seen = [], set()
    while checkpoint is not None and checkpoint.id not in seen:
        seen.add(checkpoint.id)
        run = s.get(Run, checkpoint.run_id)
        chain.append({"checkpoint": checkpoint.id, "uri": checkpoint.uri, "step": checkpoint.step,
                      "kind": checkpoint.kind, "sha256": checkpoint.sha256, "run": run.id, "recipe": run.recipe,
                      "config_hash": run.config_hash, "dataset": run.dataset_fingerprint})
        checkpoint = s.get(Checkpoint, checkpoint.parent_checkpoint_id) if checkpoint.parent_checkpoint_id else None
    return chain
