"""Launch and supervise persistent workers (submitit: local processes or SLURM jobs; inline threads)."""

from infra.launcher.executors import make_executor, slurm_minutes
from infra.launcher.pool import WorkerPool

__all__ = ["WorkerPool", "make_executor", "slurm_minutes"]
