"""`forgeflow server`: a Prefect server with forgeflow's settings, on loopback unless told otherwise; a server that
others can reach requires Prefect's API authentication (flow parameters reach the worker hosts through it)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from infra.dist_store import is_loopback


def read_auth_string(path: str | Path) -> str:
    """The API auth string from a file only its owner can read (0600); ValueError naming the fix otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--auth-file {path} does not exist; create it with e.g. `umask 077; openssl rand -hex 24 "
                         f"> {path}`")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ValueError(f"--auth-file {path} is readable by others (mode {mode:o}); run `chmod 600 {path}`")
    secret = path.read_text().strip()
    if not secret:
        raise ValueError(f"--auth-file {path} is empty; put a long random string in it (`openssl rand -hex 24`)")
    return secret


def server_command(port: int, host: str = "127.0.0.1", auth_file: str | None = None) -> tuple[list[str], dict]:
    """(argv, environment) of `prefect server start`; refuses a non-loopback host without an auth file."""
    env = dict(os.environ)
    if auth_file:
        env["PREFECT_SERVER_API_AUTH_STRING"] = read_auth_string(auth_file)
    elif not is_loopback(host):
        raise ValueError(f"--host {host} serves the Prefect API beyond this machine, and anyone who reaches it can "
                         "start flow runs: add --auth-file FILE (a 0600 file holding a random string; clients set "
                         "PREFECT_API_AUTH_STRING to the same string)")
    prefect = Path(sys.executable).with_name("prefect")
    return [str(prefect), "server", "start", "--host", host, "--port", str(port)], env


def run_server(port: int, host: str = "127.0.0.1", auth_file: str | None = None) -> int:
    """`prefect server start` (state under FORGEFLOW_HOME/prefect); returns its exit status."""
    from runtime.prefect_env import configure_prefect

    configure_prefect()
    argv, env = server_command(port, host, auth_file)
    print(f"Prefect UI/API on http://{host}:{port} — export PREFECT_API_URL=http://{host}:{port}/api")
    if auth_file:
        print(f"API authentication on: clients export PREFECT_API_AUTH_STRING=\"$(cat {auth_file})\"")
    return subprocess.call(argv, env=env)
