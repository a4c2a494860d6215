"""submitit executors for worker jobs, chosen by `launcher: local | slurm | inline`."""

from __future__ import annotations

import functools
import logging
import subprocess
import threading
import types
from pathlib import Path

from infra.config import RunConfig

log = logging.getLogger(__name__)

# persistent workers live as long as the run: never let submitit's 5-minute local default kill them
LOCAL_TIMEOUT_MIN = 7 * 24 * 60


def slurm_minutes(time_str: str) -> int:
    """SLURM time 'D-HH:MM:SS', 'HH:MM:SS', 'MM:SS' or 'MM' → minutes (rounded up)."""
    days, _, rest = time_str.partition("-") if "-" in time_str else ("0", "", time_str)
    parts = [int(p) for p in rest.split(":")]
    if len(parts) == 1:
        h, m, s = 0, parts[0], 0
    elif len(parts) == 2:
        h, (m, s) = 0, parts
    elif len(parts) == 3:
        h, m, s = parts
    else:
        raise ValueError(f"slurm.time {time_str!r} is not D-HH:MM:SS, HH:MM:SS, MM:SS or MM")
    return int(days) * 1440 + h * 60 + m + (1 if s else 0)


def detach_local_jobs_from_terminal() -> None:
    """Start submitit's local job controllers in their own session.

    Ctrl-C in a terminal signals the whole foreground process group; local workers would die mid-call (with a
    traceback from each submitit controller) before the controller could stop them in order, mark the run
    interrupted and keep it resumable. In their own session only the controller gets Ctrl-C; it then shuts the
    workers down, and a controller that dies outright is noticed by each worker's watchdog. submitit has no option
    for this, so its module sees a `subprocess` whose Popen starts a new session (nothing else is changed)."""
    import submitit.local.local as local

    if getattr(local.subprocess, "forgeflow_detached", False):
        return
    shim = types.SimpleNamespace(**{k: getattr(subprocess, k) for k in dir(subprocess) if not k.startswith("__")})
    shim.Popen = functools.partial(subprocess.Popen, start_new_session=True)
    shim.forgeflow_detached = True
    local.subprocess = shim


def make_executor(cfg: RunConfig, folder: Path, tasks: int = 1, gpus: int = 0, name: str = "forgeflow",
                  nodes: int = 1, devices: tuple[int, ...] = (), placement: dict | None = None):
    """A submitit executor for one worker job: `nodes` nodes, `tasks` ranks and `gpus` accelerators on each;
    `placement` is Slurm's nodelist / exclude."""
    import submitit

    if cfg.launcher == "local":
        if nodes > 1:
            raise ValueError(f"{name}: {nodes} nodes need launcher: slurm (the local launcher is one machine)")
        detach_local_jobs_from_terminal()
        ex = submitit.LocalExecutor(folder=str(folder))
        ex.update_parameters(timeout_min=LOCAL_TIMEOUT_MIN, tasks_per_node=tasks, gpus_per_node=gpus,
                             visible_gpus=tuple(devices))
        return ex
    if cfg.launcher == "slurm":
        s = cfg.slurm
        ex = submitit.SlurmExecutor(folder=str(folder))
        # never requeued by Slurm (after a node failure, say): the pool has already replaced the worker, and a
        # requeued job would run the role twice
        params = {"job_name": name, "nodes": nodes, "ntasks_per_node": tasks, "cpus_per_task": s.cpus_per_task,
                  "time": slurm_minutes(s.time), "additional_parameters": {"no_requeue": True, **s.extra},
                  **(placement or {})}
        if gpus:
            params["gpus_per_node"] = gpus
        for key in ("partition", "mem", "account", "qos"):
            if getattr(s, key):
                params[key] = getattr(s, key)
        ex.update_parameters(**params)
        return ex
    if cfg.launcher == "inline":
        return InlineExecutor()
    raise ValueError(f"launcher {cfg.launcher!r}: choose local, slurm or inline")


class InlineJob:
    """A worker served from a thread of this process (launcher: inline, for debugging in one process)."""

    def __init__(self, fn, *args):
        self.job_id = f"inline-{id(self):x}"
        self.state = "RUNNING"
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn, *args), daemon=True, name=self.job_id)
        self.thread.start()

    def _run(self, fn, *args):
        try:
            fn(*args)
            self.state = "COMPLETED"
        except BaseException as exc:  # recorded and surfaced by WorkerPool as the start-up error
            self.error, self.state = exc, "FAILED"
            log.exception("inline worker failed")

    def done(self) -> bool:
        return not self.thread.is_alive()

    def cancel(self) -> None:
        """Threads cannot be killed; the pool's shutdown call stops the server."""

    def stderr(self) -> str:
        return repr(self.error) if self.error else ""


class InlineExecutor:
    def submit(self, fn, *args) -> InlineJob:
        return InlineJob(fn, *args)
