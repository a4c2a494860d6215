"""A real Prefect server for integration tests: ports, health, the REST API, `prefect deployment run`."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until `url`/health answers 200 (a Prefect API URL, or an MLflow server's); fails if `proc` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server for {url} exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server at {url} is not healthy after {timeout}s")


def stop_group(proc: subprocess.Popen, timeout: float = 20) -> None:
    """SIGTERM a server's process group (started with start_new_session), SIGKILL after `timeout` s."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def api(stack, path: str, body: dict | None = None):
    r = httpx.post(f"{stack['url']}{path}", json=body or {}, timeout=30)
    r.raise_for_status()
    return r.json()


def flow_run_logs(stack, flow_run_id: str, limit: int = 60) -> str:
    """The last `limit` log lines of a flow run (for a failure message: the reason is in the run's logs)."""
    logs = api(stack, "/logs/filter", {"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "sort": "TIMESTAMP_DESC",
                                       "limit": limit})
    return "\n".join(f"{log['level']:>2} {log['message']}" for log in reversed(logs))


def flow_runs_of(stack, deployment_name: str) -> list[dict]:
    deps = api(stack, "/deployments/filter", {"deployments": {"name": {"any_": [deployment_name]}}})
    return api(stack, "/flow_runs/filter", {"deployments": {"id": {"any_": [deps[0]["id"]]}},
                                            "sort": "EXPECTED_START_TIME_DESC"})


def task_runs_of(stack, flow_run_id: str) -> dict[str, str]:
    runs = api(stack, "/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}, "limit": 200})
    return {r["name"]: r["state"]["type"] for r in runs}


def run_deployment_cli(stack, name: str, params: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [str(BIN / "prefect"), "deployment", "run", name, "--watch"]
    for k, v in params.items():
        cmd += ["-p", f"{k}={json.dumps(v)}"]
    return subprocess.run(cmd, cwd=ROOT, env=stack["env"], capture_output=True, text=True, timeout=timeout)


@contextmanager
def serving_stack(home: Path, extra_env: dict | None = None):
    """A Prefect server on a free port, `forgeflow deploy` applied, and a process worker on forgeflow-local;
    yields {env, url, logs}. `extra_env` reaches the worker's flow runs (e.g. MLFLOW_TRACKING_URI)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": url, "PREFECT_WORKER_QUERY_SECONDS": "2",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "INFO", **(extra_env or {})}
    logs = home / "logs"
    logs.mkdir()
    server = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, stdout=open(logs / "server.log", "w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    procs = [server]
    try:
        wait_healthy(url, server)
        deploy = subprocess.run([str(BIN / "forgeflow"), "deploy"], cwd=ROOT, env=env, capture_output=True, text=True)
        assert deploy.returncode == 0, deploy.stdout + deploy.stderr
        worker = subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", "forgeflow-local"], cwd=ROOT,
                                  env=env, stdout=open(logs / "worker.log", "w"), stderr=subprocess.STDOUT,
                                  start_new_session=True)
        procs.append(worker)
        yield {"env": env, "url": url, "logs": logs}
    finally:
        for p in reversed(procs):
            stop_group(p)
