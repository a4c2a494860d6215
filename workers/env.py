"""EnvWorker: runs the environments of multi-turn episodes (env.name) in their own process, one per replica; the
rollout task drives the episodes across the generator and env workers (workers/remote.py: RemoteEnvs).

A crashing or hanging environment ends its episode (LocalEnvs); a worker that dies is replaced like any role, and
the rollout task is retried with the same seeds.
"""

from __future__ import annotations

from typing import Any

from forge_core.envs.base import Message, StepResult
from forge_core.envs.runner import LocalEnvs
from infra.config import RunConfig
from workers.base import Worker


class EnvWorker(Worker):
    role = "env"  # its calls are named *_envs: Worker.step is the step counter every worker reports

    def __init__(self, cfg: RunConfig, store=None, init_path: str | None = None, threads: int | None = None):
        super().__init__(cfg, threads)
        self.envs = LocalEnvs(cfg.env)

    def reset_envs(self, items: list[tuple[int, Any, int]]) -> list[tuple[list[Message], list[dict]]]:
        """Start one environment per (episode key, task, seed); their opening messages and tools."""
        self.calls += 1
        return self.envs.reset(items)

    def step_envs(self, items: list[tuple[int, Message]]) -> list[StepResult]:
        self.calls += 1
        return self.envs.step(items)

    def shutdown(self) -> bool:
        """Close every environment still open (OpenEnv sessions among them) and stop the env threads."""
        self.envs.close()
        return super().shutdown()

    def finish_envs(self, keys: list[int]) -> list[float]:
        self.calls += 1
        return self.envs.finish(keys)
