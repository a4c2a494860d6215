"""The SQL run registry: runs, iterations, checkpoints, workers, sweeps and lineage (SQLAlchemy 2 + Alembic)."""

from infra.registry import repo
from infra.registry.db import default_registry_url, get_engine, open_session, session_scope
from infra.registry.models import Checkpoint, Iteration, Run, Sweep, Worker

__all__ = ["Checkpoint", "Iteration", "Run", "Sweep", "Worker", "default_registry_url", "get_engine",
           "open_session", "repo", "session_scope"]
