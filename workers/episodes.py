"""Multi-turn episodes across workers: the rollout task plays them (forge_core/envs/episodes.py, the token layer,
in the controller), each turn sampled by the generator replicas and answered by the env replicas.

    RemoteTurns ─ one turn's rows split round-robin over the generator replicas (each row keeps its own sampling
                  stream, so a turn's tokens do not depend on the number of replicas)
    RemoteEnvs  ─ episode k's environment lives on env replica k % replicas for the whole episode
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from forge_core.envs.base import Message, StepResult
from forge_core.envs.episodes import sample_env_groups
from forge_core.generation.sampling import SamplingParams
from forge_core.types import Completion, Group


@dataclass
class RemoteTurns:
    """The generator replicas behind TorchGenerator.generate's interface; `version` pins the policy version."""

    pool: object  # workers.pool.WorkerPool
    tokenizer: object
    version: int | None = None

    def __post_init__(self) -> None:
        self.end_ids = self.pool.call("generator", "end_ids")

    def generate(self, prompts: list[str], n: int = 1, seed: int | None = None, params: SamplingParams | None = None,
                 prompt_keys: list[int] | None = None, prompt_ids: list[list[int]] | None = None
                 ) -> list[list[Completion]]:
        replicas = min(len(self.pool.clients("generator")), len(prompts))
        keys = list(range(len(prompts))) if prompt_keys is None else list(prompt_keys)
        rows = prompt_ids or [None] * len(prompts)
        shards = {i: (prompts[i::replicas], n, seed, params, keys[i::replicas], rows[i::replicas], self.version)
                  for i in range(replicas)}
        results = self.pool.call_each("generator", "generate", shards)
        out: list[list[Completion]] = [None] * len(prompts)  # type: ignore[list-item]
        for i, part in results.items():
            out[i::replicas] = part
        return out


@dataclass
class RemoteEnvs:
    """The env replicas behind LocalEnvs' interface (reset / step / finish by episode key)."""

    pool: object

    def _fan_out(self, method: str, items: list, key_of) -> list:
        replicas = len(self.pool.clients("env"))
        places: dict[int, list[int]] = {}
        for index, item in enumerate(items):
            places.setdefault(key_of(item) % replicas, []).append(index)
        results = self.pool.call_each("env", method, {r: ([items[i] for i in idx],) for r, idx in places.items()})
        out: list = [None] * len(items)
        for replica, idx in places.items():
            for i, value in zip(idx, results[replica], strict=True):
                out[i] = value
        return out

    def reset(self, items: list[tuple[int, Any, int]]) -> list[tuple[list[Message], list[dict]]]:
        return self._fan_out("reset_envs", items, lambda item: item[0])

    def step(self, items: list[tuple[int, Message]]) -> list[StepResult]:
        return self._fan_out("step_envs", items, lambda item: item[0])

    def finish(self, keys: list[int]) -> list[float]:
        return self._fan_out("finish_envs", keys, lambda key: key)


def remote_episodes(pool, tokenizer, problems: Sequence[Any], group_size: int, seed: int,
                    version: int | None = None, params: SamplingParams | None = None) -> list[Group]:
    """`group_size` episodes per problem in the run's environment, played across the generator and env workers
    (the same groups as sample_env_groups in one process with one generator)."""
    cfg = pool.cfg
    return sample_env_groups(RemoteTurns(pool, tokenizer, version), problems, group_size, seed,
                             params or cfg.generator, cfg.env, envs=RemoteEnvs(pool))
