"""The orphan guard stops the Prefect server processes a killed command left behind, and only those."""

import os
import signal
import subprocess
import sys
import time

from infra.processes import start_time
from runtime.orphan_guard import OWNER_ENV, SERVER_MARK, guard, leftover_servers

# a stand-in for the server: any process whose command line carries the server's module name
FAKE_SERVER = f"import time  # {SERVER_MARK}\ntime.sleep(300)"


def start_fake_server(owner: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", FAKE_SERVER], env={**os.environ, OWNER_ENV: str(owner)})


def test_servers_of_a_killed_owner_are_stopped_and_others_kept():
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    mine, other = start_fake_server(owner.pid), start_fake_server(os.getpid())
    try:
        time.sleep(0.5)  # the children have exec'd: their /proc entries show the final command line
        assert leftover_servers(owner.pid) == [mine.pid]
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        assert guard(owner.pid, poll_s=0.1) == [mine.pid]
        assert mine.wait(timeout=30) == -signal.SIGTERM
        assert other.poll() is None and leftover_servers(os.getpid()) == [other.pid]
    finally:
        for p in (owner, mine, other):
            p.kill()
            p.wait()


def test_start_time_tells_a_zombie_from_a_live_process():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 60  # liveness guard: a zombie never seen as gone fails instead of hanging
    while start_time(child.pid) is not None:  # exited, not yet reaped: a zombie counts as gone
        assert time.monotonic() < deadline, "an exited, unreaped child still has a start time"
        time.sleep(0.05)
    assert child.wait() == 0 and start_time(os.getpid()) is not None
