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


def recorded_metrics(run_id: str) -> list[dict]:
    """Every row of a run's metrics.jsonl."""
    path = run_dir(run_id) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steps_recorded(run_id: str) -> list[int]:
    path = run_dir(run_id) / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def wait_for_new_run(existing: set[str], steps: int, proc: subprocess.Popen | None = None,
                     patience_s: float = 600) -> Path:
    """The run directory created after `existing` once its metrics.jsonl holds `steps` rows."""
    deadline = time.monotonic() + patience_s  # a liveness guard against a hung run, not a speed check
    root = runs_root()
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run exited early with {proc.returncode}:\n{output_of(proc)[-5000:]}")
        new = sorted(p for p in root.iterdir() if p.name not in existing)
        metrics = new[-1] / "metrics.jsonl" if new else None
        if metrics and metrics.exists() and len(metrics.read_text().splitlines()) >= steps:
            return new[-1]
        time.sleep(0.05)
    raise AssertionError(f"no new run reached step {steps}")


def hold_record_until(monkeypatch, step: int, released: threading.Event, failures: list) -> None:
    """The run waits before recording `step` until `released` is set: a kill scheduled at a random moment after
    the step before lands while the run still has work left, however fast the steps are on this machine. If the
    killer failed (`failures`), the run fails there with its error, so the test reports why."""
    from infra.records import RunRecords

    real_step = RunRecords.step

    def held_step(self, at: int, metrics: dict) -> None:
        if at == step and not released.wait(timeout=300):  # a liveness guard, not a speed check
            raise AssertionError(f"the kill planned before step {step} was recorded never happened")
        if at == step and failures:
            raise AssertionError(f"the kill planned before step {step} failed: {failures[0]!r}") from failures[0]
        real_step(self, at, metrics)

    monkeypatch.setattr(RunRecords, "step", held_step)


def kill_worker_when(monkeypatch, role: str | tuple[str, ...], after_step: int, killed: list,
                     sig=signal.SIGKILL, before_kill=None) -> threading.Thread:
    """In a thread: send `sig` to the worker of `role` (of each role, at the same moment: a lost node) of the next
    new run at a random moment of the step after `after_step` (whatever phase is running then); that step is not
    recorded before the kill. `before_kill(pids)` runs just before it."""
    roles = (role,) if isinstance(role, str) else tuple(role)

    def kill(run: Path) -> None:
        pids = []
        for name in roles:
            launches = sorted((run / "workers").glob(f"{name}-0.*.rendezvous.json"), key=lambda p: p.stat().st_mtime)
            pids.append(read_rendezvous(launches[-1]).pid)  # the current launch of the worker
        if before_kill is not None:
            before_kill(pids)
        for pid in pids:
            os.kill(pid, sig)
        killed.extend(pids)

    print(f"killing {', '.join(roles)} in the step after step {after_step}")
    return act_in_step(monkeypatch, after_step, kill)


def act_in_step(monkeypatch, after_step: int, act, then=None) -> threading.Thread:
    """In a thread: `act(run directory)` on the next new run at a random moment of the step after `after_step`, which
    is not recorded before `act` returns; then `then()`, while the run goes on. An error of either is handed to the
    run, which fails with it at the held step (or the test, from the thread's join)."""
    existing = existing_runs()
    done = threading.Event()
    failures: list[BaseException] = []
    hold_record_until(monkeypatch, after_step + 1, done, failures)

    def watch():
        try:
            run = wait_for_new_run(existing, after_step)
            time.sleep(random.uniform(0.0, 0.1))  # lands inside the next step, or while it waits to be recorded
            act(run)
            done.set()
            if then is not None:
                then()
        except BaseException as error:
            failures.append(error)
            raise
        finally:
            done.set()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def hold_step_env(*steps: int, env: dict | None = None) -> dict[str, str]:
    """Variables that make a flow process wait once before recording each of `steps` (tests/integration/hold_step);
    `held_at` / `release` below watch and end a wait."""
    hook = str(Path(__file__).parent / "hold_step")
    pythonpath = os.pathsep.join(filter(None, [hook, str(ROOT), (env or os.environ).get("PYTHONPATH")]))
    return {"FORGEFLOW_TEST_HOLD_STEPS": ",".join(map(str, steps)),
            "FORGEFLOW_TEST_HOLD_DIR": tempfile.mkdtemp(prefix="hold-step-"), "PYTHONPATH": pythonpath}


def held_at(hold: dict, step: int) -> bool:
    """Whether a process of the run waits before recording `step`, or has waited there."""
    return (Path(hold["FORGEFLOW_TEST_HOLD_DIR"]) / f"held-{step}").exists()


def release(hold: dict, step: int) -> None:
    (Path(hold["FORGEFLOW_TEST_HOLD_DIR"]) / f"release-{step}").touch()


def start_cli_run(overrides: dict, *args: str, hold_step: int = 0) -> subprocess.Popen:
    """`forgeflow grpo` in a child process (its own embedded Prefect API, the tests' FORGEFLOW_HOME); with
    `hold_step`, it waits before recording that step (tests/integration/hold_step) until the test kills it."""
    cli = [sys.executable, "-m", "cli", "grpo", *args]
    for key, value in overrides.items():
        cli += [f"--{key}", json.dumps(value) if not isinstance(value, str) else value]
    home = tempfile.mkdtemp(prefix="prefect-child-")
    env = {**os.environ, "PREFECT_HOME": home}
    hold = hold_step_env(hold_step, env=env) if hold_step else {}
    env |= hold
    # output to a file: a pipe would stay open as long as any child (the embedded Prefect server) lives
    log = open(Path(home) / "cli.log", "w+")  # noqa: SIM115 (read back by output_of)
    proc = subprocess.Popen(cli, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group, as in a terminal
    proc.log, proc.hold = log, hold  # hold: for held_at / release
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
