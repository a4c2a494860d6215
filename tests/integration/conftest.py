"""Fixtures shared by integration tests."""

import fcntl
import subprocess
import tempfile
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[2] / "infra" / "slurm" / "setup_cluster.sh"
CLUSTER_LOCK = Path(tempfile.gettempdir()) / "forgeflow-slurm-tests.lock"


@pytest.fixture(scope="session")
def slurm_started():
    """The two-node cluster `make services` starts (one for the whole session; a rerun restarts a lost slurmd)."""
    out = subprocess.run([str(SETUP), "--nodes", "2"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"{SETUP} could not start Slurm (run `make test` as root):\n{out.stdout}\n{out.stderr}")
    return out.stdout


def hold_cluster(mode: int):
    """A lock on the cluster across the test processes (pytest-xdist): shared for tests that use it, exclusive for
    those that kill or cut off a node, so that no other test has workers there at the time."""
    with open(CLUSTER_LOCK, "a") as lock:
        fcntl.flock(lock, mode)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture
def slurm_cluster(slurm_started):
    yield from hold_cluster(fcntl.LOCK_SH)


@pytest.fixture
def slurm_cluster_alone(slurm_started):
    """The cluster with no other test on it: for tests that pull a node's plug or cut its link."""
    yield from hold_cluster(fcntl.LOCK_EX)


