"""Stop a vLLM engine's processes (VLLM::EngineCore, VLLM::Worker) when the generator worker that started it dies
without shutting it down (kill -9, the OOM killer, a lost node's processes): vLLM 0.32's EngineCore does not watch
its parent and lives on, re-parented to init, holding its memory and KV cache.

`start_engine_guard()`, called in the worker right after the engine started, lists the worker's descendants named
VLLM::* (pid and kernel start time) and starts `python -m workers.engine_guard OWNER PID:START …`, a small process
in its own session that waits for the worker to end and then stops exactly those processes. (Marking the
environment, as runtime/orphan_guard.py does for Prefect's server, cannot find them: vLLM's setproctitle overwrites
/proc/PID/environ of the renamed processes.)"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

from infra.processes import command_line, descendants, start_time, stop_processes, wait_until_gone

log = logging.getLogger(__name__)

ENGINE_MARK = "VLLM::"  # vLLM renames its processes: VLLM::EngineCore, VLLM::Worker_TP0, …
_guard: subprocess.Popen | None = None  # referenced for the worker's lifetime (an unreferenced Popen warns)


def engine_processes(owner: int) -> list[str]:
    """PID:START of each VLLM::* process below `owner`."""
    found = []
    for pid in descendants(owner):
        born = start_time(pid)
        if command_line(pid).startswith(ENGINE_MARK) and born:
            found.append(f"{pid}:{born}")
    return found


def start_engine_guard() -> subprocess.Popen | None:
    """After LLM(...): a guard process that stops this process's engine processes once this process is gone (a
    second engine replaces the guard). None without /proc or without engine processes (an in-process engine)."""
    global _guard
    targets = engine_processes(os.getpid()) if os.path.exists("/proc/self/stat") else []
    if not targets:
        return None
    if _guard is not None:
        _guard.kill()
        _guard.wait()
    _guard = subprocess.Popen([sys.executable, "-m", "workers.engine_guard", str(os.getpid()), *targets],
                              stdin=subprocess.DEVNULL, start_new_session=True)  # a Ctrl-C to the worker's group
    log.info("engine guard %d watches engine processes %s", _guard.pid, targets)  # leaves it running
    return _guard


def guard(owner: int, targets: list[str], poll_s: float = 1.0) -> list[int]:
    """Wait for `owner` to end, then stop the listed processes that are still the same ones; returns their pids."""
    wait_until_gone(owner, poll_s)
    time.sleep(poll_s)  # a worker that exits normally shuts its engine down itself: give it that moment
    pids = [int(pid) for pid, born in (t.split(":") for t in targets) if start_time(int(pid)) == born]
    if pids:
        log.warning("generator worker %d ended without stopping its vLLM engine: stopping %s", owner, pids)
        stop_processes(pids)
    return pids


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s engine-guard: %(message)s")
    guard(int(sys.argv[1]), sys.argv[2:])
