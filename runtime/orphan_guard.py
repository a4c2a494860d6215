"""Stop the embedded Prefect API server of a forgeflow command that died without cleaning up (SIGKILL, OOM killer).

Prefect starts that server as a child process and stops it when the command exits normally or on Ctrl-C; a killed
command leaves it running (a port, ~250 MB). `start_orphan_guard` marks the command's environment, which the server
inherits, and starts a small guard process; when the command is gone, the guard stops the Prefect servers carrying
the mark. Linux only (/proc); elsewhere the guard is not started.

Run by hand: `python -m runtime.orphan_guard OWNER_PID`.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from infra.processes import stop_processes, wait_until_gone

log = logging.getLogger(__name__)

OWNER_ENV = "FORGEFLOW_OWNER_PID"
SERVER_MARK = "prefect.server.api.server"  # in the command line of the server Prefect starts


_guard: subprocess.Popen | None = None  # referenced for the command's lifetime (an unreferenced Popen warns)


def start_orphan_guard() -> subprocess.Popen | None:
    """From a command that may start Prefect's embedded server: mark its environment and start the guard.
    None when no embedded server will run (PREFECT_API_URL names one) or /proc is missing."""
    if os.environ.get("PREFECT_API_URL") or not Path("/proc/self/environ").exists():
        return None
    from infra.paths import forgeflow_home

    os.environ[OWNER_ENV] = str(os.getpid())
    log_path = forgeflow_home() / "logs" / "orphan-guard.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    global _guard
    with log_path.open("a") as log_file:  # not the command's stdout/stderr: a reader would wait for the guard too
        _guard = subprocess.Popen([sys.executable, "-m", "runtime.orphan_guard", str(os.getpid())],
                                  stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)
    return _guard


def leftover_servers(owner: int) -> list[int]:
    """Pids of Prefect server processes whose environment marks `owner` as the command that started them."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if SERVER_MARK not in (proc / "cmdline").read_bytes().decode(errors="replace"):
                continue
            environ = (proc / "environ").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if f"{OWNER_ENV}={owner}".encode() in environ:
            found.append(int(proc.name))
    return found


def guard(owner: int, poll_s: float = 1.0) -> list[int]:
    """Wait for `owner` to end, then stop the servers it left behind; returns their pids."""
    wait_until_gone(owner, poll_s)
    time.sleep(poll_s)  # a command that exits normally stops its server itself: give it that moment
    pids = leftover_servers(owner)
    if pids:
        log.warning("forgeflow command %d ended without stopping its Prefect server: stopping %s", owner, pids)
        stop_processes(pids)
    return pids


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; the owner handles it
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s orphan-guard: %(message)s")
    guard(int(sys.argv[1]))
