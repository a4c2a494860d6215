"""Fixtures shared by integration tests."""

import subprocess
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[2] / "infra" / "slurm" / "setup_cluster.sh"


@pytest.fixture(scope="session")
def slurm_cluster():
    """The two-node cluster `make services` starts (one for the whole session; a rerun restarts a lost slurmd)."""
    out = subprocess.run([str(SETUP), "--nodes", "2"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"{SETUP} could not start Slurm (run `make test` as root):\n{out.stdout}\n{out.stderr}")
    return out.stdout


