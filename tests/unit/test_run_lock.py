"""One driver per run (runtime/run_lock.py): a duplicate execution of the same flow run waits, others are refused."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from runtime.run_lock import lock_run, read_holder

HOLDER = """
import sys, time
from pathlib import Path
from runtime.run_lock import lock_run
lock = lock_run(Path(sys.argv[1]), "r1", sys.argv[2] or None)
print("held", flush=True)
time.sleep(300)
"""


def start_holder(out, flow_run_id: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out), flow_run_id], stdout=subprocess.PIPE, text=True,
                            cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_another_driver_is_refused_with_the_holder_named(tmp_path):
    with lock_run(tmp_path, "r1", None) as held:
        assert read_holder(held.path)["pid"] == os.getpid()
        for flow_run_id in (None, "flow-b"):
            with pytest.raises(ValueError, match=rf"run r1 is being driven by pid {os.getpid()} .*forgeflow resume r1"):
                lock_run(tmp_path, "r1", flow_run_id)
    with lock_run(tmp_path, "r1", "flow-b") as again:  # released: the next driver gets it at once
        assert not again.waited and read_holder(again.path)["flow_run_id"] == "flow-b"


def test_a_second_execution_of_the_same_flow_run_waits_for_the_first(tmp_path):
    first = lock_run(tmp_path, "r1", "flow-a")
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(lock_run(tmp_path, "r1", "flow-a", poll_s=0.05)))
    waiter.start()
    time.sleep(0.5)
    assert not got, "the second execution must not run while the first holds the run"
    first.release()
    waiter.join(timeout=60)
    assert got and got[0].waited
    got[0].release()


def test_a_killed_holder_frees_the_run(tmp_path):
    proc = start_holder(tmp_path, "flow-a")
    try:
        with pytest.raises(ValueError, match=f"pid {proc.pid} .*flow run flow-a"):
            lock_run(tmp_path, "r1", None)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with lock_run(tmp_path, "r1", None) as lock:  # the kernel dropped the dead process's lock
        assert not lock.waited
