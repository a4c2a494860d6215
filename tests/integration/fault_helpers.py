"""Fault injection for the flow tests: find a run's processes and kill them at a chosen step."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from infra.paths import forgeflow_home, run_dir
from workers.protocol import read_rendezvous

ROOT = Path(__file__).resolve().parents[2]

# a tiny run: the same seed and config always produce the same final weights
TINY = {"model.path": "tiny:qwen3-micro", "sft.steps": 0, "generator.max_new_tokens": 4, "prompts_per_step": 4,
        "group_size": 4, "eval.num_prompts": 16, "eval.every": 2, "checkpoint.every": 2, "trainer.lr": 1e-3,
        "workers.threads": 1, "filter_groups": False, "loss.beta": 0.0,
        "loss.name": "grpo", "trainer.mini_batches": 1}  # one update per batch unless a test says otherwise


def runs_root() -> Path:
    root = forgeflow_home() / "runs"
    root.mkdir(parents=True, exist_ok=True)
    return root


def existing_runs() -> set[str]:
    return {p.name for p in runs_root().iterdir()}


def steps_recorded(run_id: str) -> list[int]:
    path = run_dir(run_id) / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def wait_for_new_run(existing: set[str], steps: int, proc: subprocess.Popen | None = None,
                     patience_s: float = 600) -> Path:
    """The run directory created after `existing` once its metrics.jsonl holds `steps` rows."""
    deadline = time.monotonic() + patience_s  # a liveness guard against a hung run, not a speed check
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run exited early with {proc.returncode}:\n{output_of(proc)[-5000:]}")
        new = sorted(p for p in runs_root().iterdir() if p.name not in existing)
        metrics = new[-1] / "metrics.jsonl" if new else None
        if metrics and metrics.exists() and len(metrics.read_text().splitlines()) >= steps:
            return new[-1]
        time.sleep(0.05)
    raise AssertionError(f"no new run reached step {steps}")


def kill_worker_when(role: str | tuple[str, ...], after_step: int, killed: list, sig=signal.SIGKILL) -> threading.Thread:
    """In a thread: send `sig` to the worker of `role` (of each role, at the same moment: a lost node) of the next
    new run at a random moment of the step after `after_step` (whatever phase is running then)."""
    roles = (role,) if isinstance(role, str) else tuple(role)
    existing = existing_runs()
    # a step of the tiny run takes 0.05-0.3 s: a short delay lands inside the next step, never after the last one
    delay = random.uniform(0.0, 0.1)
    print(f"killing {', '.join(roles)} {delay:.3f}s after step {after_step} is recorded")

    def watch():
        run = wait_for_new_run(existing, after_step)
        time.sleep(delay)
        pids = []
        for name in roles:
            launches = sorted((run / "workers").glob(f"{name}-0.*.rendezvous.json"), key=lambda p: p.stat().st_mtime)
            pids.append(read_rendezvous(launches[-1]).pid)  # the current launch of the worker
        for pid in pids:
            os.kill(pid, sig)
        killed.extend(pids)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def start_cli_run(overrides: dict, *args: str) -> subprocess.Popen:
    """`forgeflow grpo` in a child process (its own embedded Prefect API, the tests' FORGEFLOW_HOME)."""
    cli = [sys.executable, "-m", "cli", "grpo", *args]
    for key, value in overrides.items():
        cli += [f"--{key}", json.dumps(value) if not isinstance(value, str) else value]
    home = tempfile.mkdtemp(prefix="prefect-child-")
    env = {**os.environ, "PREFECT_HOME": home}
    # output to a file: a pipe would stay open as long as any child (the embedded Prefect server) lives
    log = open(Path(home) / "cli.log", "w+")  # noqa: SIM115 (read back by output_of)
    proc = subprocess.Popen(cli, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group, as in a terminal
    proc.log = log
    return proc


def output_of(proc: subprocess.Popen) -> str:
    proc.log.flush()
    return Path(proc.log.name).read_text()


def stop_group(proc: subprocess.Popen) -> None:
    """Kill what is left of the CLI's process group (a safety net: its orphan guard stops the Prefect server)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_until(condition, what: str, patience_s: float = 120) -> None:
    deadline = time.monotonic() + patience_s  # liveness guard, not a speed check
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen")
        time.sleep(0.1)
