"""Where state lives: everything under FORGEFLOW_HOME (default ./.forgeflow)."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path


def forgeflow_home() -> Path:
    """The state directory (created on first use)."""
    home = Path(os.environ.get("FORGEFLOW_HOME", ".forgeflow")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home


def new_run_id() -> str:
    """Sortable, unique run id: UTC timestamp + random suffix."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def run_dir(run_id: str) -> Path:
    """The directory of one run (config, metrics, plots, checkpoints)."""
    path = forgeflow_home() / "runs" / run_id
    path.mkdir(parents=True, exist_ok=True)
    return path
