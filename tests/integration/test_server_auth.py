"""`forgeflow server --auth-file`: a real Prefect server that refuses API calls without the auth string."""

import base64
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cli.server import server_command
from tests.integration.prefect_helpers import free_port, stop_group, wait_healthy

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent


def test_non_loopback_server_needs_an_auth_file_that_only_its_owner_reads(tmp_path):
    with pytest.raises(ValueError, match="--host 0.0.0.0 serves the Prefect API beyond this machine.*--auth-file"):
        server_command(4200, "0.0.0.0")
    secret = tmp_path / "auth"
    secret.write_text("s3cret\n")
    secret.chmod(0o644)
    with pytest.raises(ValueError, match="readable by others .*chmod 600"):
        server_command(4200, "0.0.0.0", str(secret))
    secret.chmod(0o600)
    argv, env = server_command(4200, "0.0.0.0", str(secret))
    assert env["PREFECT_SERVER_API_AUTH_STRING"] == "s3cret" and argv[-4:] == ["--host", "0.0.0.0", "--port", "4200"]


def test_server_with_auth_file_refuses_unauthenticated_calls(tmp_path):
    secret = tmp_path / "auth"
    secret.write_text("correct horse battery staple")
    secret.chmod(0o600)
    port = free_port()
    env = {**os.environ, "FORGEFLOW_HOME": str(tmp_path / "home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen([str(BIN / "forgeflow"), "server", "--port", str(port), "--auth-file", str(secret)],
                            env=env, stdout=open(tmp_path / "server.log", "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    try:
        wait_healthy(url, proc)
        assert httpx.post(f"{url}/flows/filter", json={}, timeout=10).status_code == 401
        wrong = base64.b64encode(b"guess").decode()
        assert httpx.post(f"{url}/flows/filter", json={}, timeout=10,
                          headers={"Authorization": f"Basic {wrong}"}).status_code == 401
        right = base64.b64encode(secret.read_bytes()).decode()
        assert httpx.post(f"{url}/flows/filter", json={}, timeout=10,
                          headers={"Authorization": f"Basic {right}"}).status_code == 200
    finally:
        stop_group(proc)
