"""`forgeflow ui` starts MLflow and Prefect servers on 127.0.0.1; Ctrl-C stops both."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening_addresses(port: int) -> set[str]:
    out = subprocess.run(["ss", "-Htln", f"sport = :{port}"], capture_output=True, text=True).stdout
    return {line.split()[3].rsplit(":", 1)[0] for line in out.splitlines() if line.strip()}


def test_ui_serves_both_on_localhost_and_stops_on_ctrl_c(tmp_path):
    mlflow_port, prefect_port = free_port(), free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen([str(Path(sys.executable).parent / "forgeflow"), "ui", "--mlflow-port", str(mlflow_port),
                             "--prefect-port", str(prefect_port)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        banner = proc.stdout.readline()
        assert f"http://127.0.0.1:{mlflow_port}" in banner
        deadline, up = time.monotonic() + 180, set()
        while time.monotonic() < deadline and len(up) < 2:
            for name, url in (("mlflow", f"http://127.0.0.1:{mlflow_port}/health"),
                              ("prefect", f"http://127.0.0.1:{prefect_port}/api/health")):
                try:
                    if httpx.get(url, timeout=2).status_code == 200:
                        up.add(name)
                except httpx.HTTPError:
                    pass
            time.sleep(1)
        assert up == {"mlflow", "prefect"}
        for port in (mlflow_port, prefect_port):
            assert listening_addresses(port) <= {"127.0.0.1"}, listening_addresses(port)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0  # each server gets 10 s to stop gracefully, then SIGKILL
        time.sleep(1)
        for port in (mlflow_port, prefect_port):
            assert not listening_addresses(port), f"port {port} still served after Ctrl-C"
    finally:
        if proc.poll() is None:
            proc.terminate()  # forgeflow ui stops its servers on SIGTERM too
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
