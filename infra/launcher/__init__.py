"""submitit executors that launch worker jobs: local processes, SLURM jobs or inline threads."""

from infra.launcher.executors import make_executor, slurm_minutes

__all__ = ["make_executor", "slurm_minutes"]
