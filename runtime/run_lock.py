"""One process drives a run at a time: an exclusive lock on `<run dir>/driver.lock`, held for the whole flow.

Why: Prefect's process worker can report one killed flow-run process as Crashed twice, seconds apart (its runner,
then its worker). The crash Automation reschedules on each report, so a second process starts on the same flow run
while the first rescheduled one is already resuming; two drivers of one run start rival workers and corrupt its
records. With the lock, a second execution of the *same* flow run waits for the first to end (and then returns its
summary, or resumes what the first left); any other driver (`forgeflow resume` by hand, another flow run) is refused
with who holds the run. The kernel releases the lock when its process dies, even by SIGKILL. `flock` on Linux NFS is
emulated with byte-range locks, so the lock also holds across nodes that share FORGEFLOW_HOME.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_NAME = "driver.lock"


@dataclass
class RunLock:
    """A held run lock; `waited` says whether another execution of this flow run held it first."""

    path: Path
    fd: int
    waited: bool = False

    def release(self) -> None:
        """Give the run back (closing the descriptor drops the flock)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def read_holder(path: Path) -> dict:
    """What the holding process wrote about itself (empty while it has not written yet)."""
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        return {}


def describe(holder: dict) -> str:
    """'pid 123 on host (flow run X) since …' for messages."""
    if not holder:
        return "another process"
    flow = f" (flow run {holder['flow_run_id']})" if holder.get("flow_run_id") else " (no flow run: the CLI)"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
    return f"pid {holder.get('pid')} on {holder.get('host')}{flow} since {since}"


def lock_run(out: Path, run_id: str, flow_run_id: str | None, poll_s: float = 1.0) -> RunLock:
    """Take run `run_id`'s lock in its directory `out`: wait while another execution of the same flow run holds it,
    refuse (ValueError naming the holder and the fix) while any other process does."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    waited, said = False, 0.0
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder = read_holder(path)
            if not (flow_run_id and holder.get("flow_run_id") == flow_run_id):
                os.close(fd)
                raise ValueError(
                    f"run {run_id} is being driven by {describe(holder)}; two drivers of one run would start rival "
                    f"workers. Wait for it to end (`forgeflow runs show {run_id}`), or stop that process, then "
                    f"`forgeflow resume {run_id}`") from None
            if time.monotonic() - said > 60:  # Prefect started this flow run twice: the later one waits its turn
                log.warning("flow run %s is already executing run %s in %s; this execution waits for it to end",
                            flow_run_id, run_id, describe(holder))
                said = time.monotonic()
            waited = True
            time.sleep(poll_s)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "flow_run_id": flow_run_id,
                              "since": time.time()}).encode(), 0)
    return RunLock(path, fd, waited)
