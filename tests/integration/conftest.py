"""Fixtures shared by integration tests."""

import subprocess
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[2] / "infra" / "slurm" / "setup_cluster.sh"


@pytest.fixture(scope="session")
def slurm_cluster():
    out = subprocess.run([str(SETUP)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"{SETUP} could not start Slurm (run `make test` as root):\n{out.stdout}\n{out.stderr}")
    return out.stdout


