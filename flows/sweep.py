"""The `grpo-sweep` flow: one grpo run per point of a grid of overrides, then a comparison table and PNG.

    grid {loss.name: [dapo, gspo]} ─▶ child grpo runs (subflows, or deployment runs with use_deployments)
                                    ─▶ sweep.json + comparison.png under <home>/sweeps/<sweep_id>

A sweep flow run rescheduled after a crash continues the same sweep (runtime/flow_runs.py remembers its id).
"""

from __future__ import annotations

import contextvars
import itertools
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prefect import flow
from prefect.runtime import flow_run

from infra.config_checks import load_config
from infra.paths import forgeflow_home, new_run_id, run_dir
from infra.registry import Sweep, repo, session_scope
from infra.tracking import Tracker
from infra.ui_links import flow_run_link_tags
from runtime.flow_runs import count_attempt, current_flow_run_id, read_index, remembered_id
from runtime.plots import plot_curves
from runtime.prefect_env import fail_for_user_error, label_flow_run
from runtime.run_lock import lock_run


def grid_points(grid: dict[str, list]) -> list[dict]:
    """Cross product of the grid as a list of override dicts (in a stable order)."""
    if not grid:
        raise ValueError("sweep grid is empty: pass e.g. {'loss.name': ['dapo', 'gspo']}")
    keys = list(grid)
    for k in keys:
        if not isinstance(grid[k], list) or not grid[k]:
            raise ValueError(f"sweep grid key {k!r} needs a non-empty list of values, got {grid[k]!r}")
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def point_name(point: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in point.items())


def short_key(key: str) -> str:
    """A config key as UI columns show it: its last part, or its section for `….name` (`loss.name` → `loss`)."""
    parts = key.split(".")
    return parts[-2] if parts[-1] == "name" and len(parts) > 1 else parts[-1]


def point_label(point: dict) -> str:
    """A short name for a grid point, for UI columns: `loss=dapo`, `lr=3e-05,loss=gspo`."""
    return ",".join(f"{short_key(k)}={v}" for k, v in point.items())


def grid_label(grid: dict) -> str:
    """A short name for a whole grid: `loss: dapo|gspo`, `lr: 1e-05|3e-05 × loss: dapo|gspo`."""
    return " × ".join(f"{short_key(k)}: {'|'.join(map(str, v))}" for k, v in grid.items())


def earlier_child(registry_url: str, sweep_id: str, name: str) -> tuple[str, str] | None:
    """(run id, status) of the grpo run an earlier attempt of this sweep started for the point `name` (the newest)."""
    with session_scope(registry_url) as s:
        runs = [(r.id, r.status) for r in repo.list_runs(s, limit=1000, sweep_id=sweep_id)
                if r.recipe == "grpo" and r.name == name]
    return runs[0] if runs else None


def run_child_deployment(deployment: str, parameters: dict, key: str, poll_s: float = 2.0,
                         crash_grace_s: float = 60.0) -> str:
    """Start (or, for a `key` seen before, find) a child deployment run with this flow run's job variables, and wait
    until it completes, through the crash Automation's reschedules; returns its flow run id."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    with get_client(sync_client=True) as client:  # one client for the start and every poll
        job_variables = client.read_flow_run(flow_run.id).job_variables if flow_run.id else None
        child = run_deployment(deployment, parameters=parameters, timeout=0, idempotency_key=key,
                               job_variables=job_variables or None)
        crashed_since = None
        while True:
            state = client.read_flow_run(child.id).state
            if state is not None and state.is_completed():
                return str(child.id)
            if state is not None and state.type.value in ("FAILED", "CANCELLED"):
                raise RuntimeError(f"sweep child {parameters['run_name']} ended {state.name}: see flow run {child.id}")
            crashed = state is not None and state.type.value == "CRASHED"  # rescheduled within seconds, if deployed
            crashed_since = (crashed_since or time.monotonic()) if crashed else None
            if crashed_since is not None and time.monotonic() - crashed_since > crash_grace_s:
                raise RuntimeError(f"sweep child {parameters['run_name']} crashed and was not rescheduled within "
                                   f"{crash_grace_s:.0f}s (is the crash Automation of `forgeflow deploy` there?): "
                                   f"see flow run {child.id}")
            time.sleep(poll_s)


@flow(name="grpo-sweep", persist_result=False)
def sweep_flow(config: str = "configs/grpo_math_tiny.yaml", grid: dict | None = None, overrides: dict | None = None,
               max_concurrency: int = 1, use_deployments: bool = False,
               deployment: str = "grpo/grpo-math") -> dict:
    """Run every grid point (at most max_concurrency at a time), wait for all, compare them."""
    grid = grid or {"loss.name": ["grpo", "dapo", "gspo"]}
    points = grid_points(grid)
    # a sweep flow run rescheduled after a crash continues its own sweep: finished children are kept, subflow
    # children (they died with this process) resumed, deployment-run children found again and waited for
    sweep_id = remembered_id("sweep_id", lambda: "sweep-" + new_run_id())
    out = forgeflow_home() / "sweeps" / sweep_id
    try:  # one driver per sweep, as per run (runtime/run_lock.py): a duplicate execution waits for the first
        lock = lock_run(out, sweep_id, current_flow_run_id())
    except ValueError as exc:
        return fail_for_user_error(exc)
    with lock:
        if (out / "sweep.json").exists():  # completed by another execution of this flow run
            return {**json.loads((out / "sweep.json").read_text()), "plot": str(out / "comparison.png")}
        count_attempt(f"sweep {sweep_id}")
        return drive_sweep(sweep_id, out, config, grid, points, overrides, max_concurrency, use_deployments,
                           deployment)


def drive_sweep(sweep_id: str, out: Path, config: str, grid: dict, points: list[dict], overrides: dict | None,
                max_concurrency: int, use_deployments: bool, deployment: str) -> dict:
    """The sweep itself, with its lock held: children, then the comparison."""
    base_cfg = load_config(config, overrides)
    label = grid_label(grid)
    label_flow_run(f"grpo-sweep · {label} · {sweep_id}", [sweep_id, "sweep"])
    tracker = Tracker(base_cfg.tracking.mlflow_uri, base_cfg.tracking.experiment)
    with session_scope(base_cfg.tracking.registry_url) as s:
        sweep = s.get(Sweep, sweep_id)
        parent = sweep.mlflow_run_id if sweep is not None else None
    if parent is None:
        params = {"grid": grid, "base_overrides": overrides or {}, "config": config}
        tags = {"forgeflow.sweep_id": sweep_id, "forgeflow.recipe": "sweep", "prefect.flow_run_id": flow_run.id,
                **flow_run_link_tags(flow_run.id)}
        parent = tracker.start_run(f"{label} · {sweep_id}", params, tags)
        with session_scope(base_cfg.tracking.registry_url) as s:
            (s.get(Sweep, sweep_id) or repo.create_sweep(s, sweep_id, grid, name=sweep_id)).mlflow_run_id = parent

    def run_point(point: dict) -> dict:
        merged = {**(overrides or {}), **point}
        name = f"{point_label(point)} · {sweep_id}"  # the distinguishing part first: UI columns cut names
        earlier = earlier_child(base_cfg.tracking.registry_url, sweep_id, name)
        if earlier is not None and earlier[1] == "completed":
            return json.loads((run_dir(earlier[0]) / "summary.json").read_text())
        if use_deployments:  # the same child flow run again after a crash of this one (its idempotency key)
            child = run_child_deployment(deployment, {"overrides": merged, "run_name": name, "sweep_id": sweep_id,
                                                      "parent_mlflow_run_id": parent}, key=f"{sweep_id} · {name}")
            # results are not persisted in Prefect; the child's summary is in its run directory
            return json.loads((run_dir(read_index(child)["run_id"]) / "summary.json").read_text())
        from flows.grpo import grpo_flow

        if earlier is not None and (run_dir(earlier[0]) / "config.yaml").exists():
            return grpo_flow(resume=earlier[0])  # it died with this sweep's earlier process
        return grpo_flow(config=config, overrides=merged, run_name=name, sweep_id=sweep_id,
                         parent_mlflow_run_id=parent)

    try:
        with ThreadPoolExecutor(max_workers=max(1, max_concurrency)) as ex:
            # each thread gets a copy of this flow's context, so children are linked to the sweep as its subflows
            futures = [ex.submit(contextvars.copy_context().run, run_point, p) for p in points]
            results = [f.result() for f in futures]
    except BaseException:
        tracker.end_run(parent, "FAILED")
        with session_scope(base_cfg.tracking.registry_url) as s:
            s.get(Sweep, sweep_id).status = "failed"
        raise
    rows = [{"point": point_name(p), **{k: r.get(k) for k in ("run_id", "acc_before", "acc_after", "minutes")}}
            for p, r in zip(points, results)]
    curves = {}
    for row in rows:
        path = run_dir(row["run_id"]) / "metrics.jsonl"
        curves[row["point"]] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    png = plot_curves(curves, out / "comparison.png", keys=("reward/mean", "eval/accuracy"),
                      title=f"{sweep_id}: {', '.join(grid or {})}")
    (out / "sweep.json").write_text(json.dumps({"sweep_id": sweep_id, "rows": rows}, indent=2))
    table = "\n".join(f"{r['point']:<32} {r['acc_before']:.3f} → {r['acc_after']:.3f}  {r['minutes']:.1f} min  "
                      f"{r['run_id']}" for r in rows)
    print(f"sweep {sweep_id}\n{table}\nplot: {png}")
    tracker.log_artifact(parent, png)
    tracker.log_artifact(parent, out / "sweep.json")
    tracker.end_run(parent, "FINISHED")
    with session_scope(base_cfg.tracking.registry_url) as s:
        s.get(Sweep, sweep_id).status = "completed"
    return {"sweep_id": sweep_id, "rows": rows, "plot": str(png)}
