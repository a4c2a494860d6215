"""`forgeflow ui`: the MLflow and Prefect UIs on 127.0.0.1. A server that already answers on its port (e.g. from
`forgeflow server`) is reused; one this command starts is stopped by Ctrl-C. Prints the MLflow address that opens
the experiment's runs table (not MLflow 3's GenAI overview)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

HOST = "127.0.0.1"


def _interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt


def answers(url: str) -> bool:
    """Whether `url` answers 200 within 2 s."""
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def port_taken(port: int) -> bool:
    """Whether something already listens on HOST:port."""
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((HOST, port)) == 0


def server_state(name: str, port: int, health: str) -> str:
    """'reuse' when the server already answers there, 'start' when the port is free; ValueError (naming the fix)
    when another program holds the port."""
    if answers(f"http://{HOST}:{port}{health}"):
        return "reuse"
    if port_taken(port):
        flag = "--mlflow-port" if name == "MLflow" else "--prefect-port"
        raise ValueError(f"port {port} is taken by a program that is not a {name} server (no answer at {health}); "
                         f"stop it or pick another port with {flag} N")
    return "start"


def start_servers(mlflow_port: int, prefect_port: int, plan: dict[str, str], logs: Path) -> list:
    """Start the servers `plan` says to start (output to files: a pipe nobody reads would block them)."""
    from infra.paths import forgeflow_home
    from infra.tracking import default_tracking_uri

    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    procs = []
    if plan["MLflow"] == "start":
        procs.append(subprocess.Popen(
            [str(bin_dir / "mlflow"), "server", "--host", HOST, "--port", str(mlflow_port),
             "--backend-store-uri", default_tracking_uri(),
             "--default-artifact-root", (forgeflow_home() / "mlartifacts").as_uri()],
            env=env, start_new_session=True, stdout=open(logs / "mlflow-server.log", "ab"), stderr=subprocess.STDOUT))
    if plan["Prefect"] == "start":
        procs.append(subprocess.Popen(
            [str(bin_dir / "prefect"), "server", "start", "--host", HOST, "--port", str(prefect_port)],
            env=env, start_new_session=True, stdout=open(logs / "prefect-server.log", "ab"),
            stderr=subprocess.STDOUT))
    return procs


def runs_table_url(mlflow_port: int) -> str:
    """The runs table of forgeflow's experiment in the store the MLflow server serves (made if missing)."""
    from infra.tracking import Tracker, default_tracking_uri
    from infra.ui_links import mlflow_runs_url

    base = f"http://{HOST}:{mlflow_port}"
    store = default_tracking_uri()
    if store.startswith(("http://", "https://")):  # no local store to look the experiment up in
        return base
    return mlflow_runs_url(base, Tracker(store).experiment_id)


def stop(procs: list) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def run_ui(mlflow_port: int = 5000, prefect_port: int = 4200) -> int:
    """Serve both UIs (reusing running servers); print their addresses; Ctrl-C stops what this command started."""
    from infra.paths import forgeflow_home
    from runtime.prefect_env import configure_prefect

    configure_prefect()
    # Ctrl-C and `kill` stop the servers instead of orphaning them; SIGINT is installed explicitly because a
    # process started from a background shell job inherits it ignored
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    plan = {"MLflow": server_state("MLflow", mlflow_port, "/health"),
            "Prefect": server_state("Prefect", prefect_port, "/api/health")}
    logs = forgeflow_home() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # the local store is made (and migrated) here, before its server opens it: both migrating one new SQLite file
    # at once fails one of them ("Online migration expected to match one row")
    runs_url = runs_table_url(mlflow_port)
    procs = start_servers(mlflow_port, prefect_port, plan, logs)
    note = {"reuse": " (already running: reused)", "start": ""}
    print(f"MLflow:  {runs_url}{note[plan['MLflow']]}\n"
          f"Prefect: http://{HOST}:{prefect_port}{note[plan['Prefect']]}  "
          f"(export PREFECT_API_URL=http://{HOST}:{prefect_port}/api)\n"
          + (f"logs in {logs}; Ctrl-C stops what this command started." if procs else
             "both servers were already running; nothing to stop here."), flush=True)
    if not procs:
        return 0
    try:
        while all(p.poll() is None for p in procs):
            time.sleep(1)
        failed = next(p for p in procs if p.poll() is not None)
        name = "MLflow" if failed.args[0].endswith("mlflow") else "Prefect"
        print(f"forgeflow ui: the {name} server exited ({failed.returncode}); its log: "
              f"{logs / (name.lower() + '-server.log')}", file=sys.stderr)
        return failed.returncode or 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop(procs)
