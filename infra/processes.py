"""Linux process facts from /proc, for the guards that stop what a killed process leaves behind
(runtime/orphan_guard.py: Prefect's embedded server; workers/engine_guard.py: a vLLM engine's processes)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (tells a live process from a reused pid); None when gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def wait_until_gone(owner: int, poll_s: float = 1.0) -> None:
    """Return once process `owner` (as it is now: a reused pid does not count) has ended."""
    born = start_time(owner)
    while born is not None and start_time(owner) == born:
        time.sleep(poll_s)


def descendants(pid: int) -> list[int]:
    """Pids below `pid` in the process tree."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            parent = int((proc / "stat").read_text().rsplit(") ", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        children.setdefault(parent, []).append(int(proc.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def command_line(pid: int) -> str:
    """The process's command line as text ('' when it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def stop_processes(pids: list[int], grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL what is still there after `grace_s`."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(start_time(p) for p in pids):
        time.sleep(0.2)
    for pid in pids:
        if start_time(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
