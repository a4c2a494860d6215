"""The environments of a batch of episodes, behind one batched interface: `reset`, `step` and `finish` take the
episodes' keys. LocalEnvs runs them in this process; workers/env.py serves the same calls from env worker
processes (workers/episodes.py: RemoteEnvs), so the token layer plays episodes the same way wherever they run.

A failing or hanging step never raises here: it ends that episode with status `error` or `timeout`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from forge_core.envs.base import EnvConfig, Environment, Message, StepResult

log = logging.getLogger(__name__)


def call_with_timeout(fn, timeout_s: float, *args):
    """fn(*args) in a daemon thread; TimeoutError when it takes longer (the thread is left behind, never joined:
    a hung environment cannot be interrupted from Python, only abandoned)."""
    box: dict[str, Any] = {}

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, which ends the episode with it
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name="env-step")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"took longer than env.step_timeout_s = {timeout_s} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


class LocalEnvs:
    """One environment per episode key, built from the env section (or by `make(key)`), in this process."""

    def __init__(self, config: EnvConfig, make: Callable[[int], Environment] | None = None):
        self.config, self.make = config, make
        self.envs: dict[int, Environment] = {}
        self.failed: set[int] = set()  # episodes whose environment errored or hung: no final reward, no more calls

    def reset(self, items: list[tuple[int, Any, int]]) -> list[tuple[list[Message], list[dict]]]:
        """(messages, tools) of each (key, task, seed); an environment that cannot start raises (a broken
        environment or its server: nothing can be played)."""
        from forge_core.envs import make_environment  # the registry imports the environments

        out = []
        for key, task, seed in items:
            self.failed.discard(key)  # a retried rollout plays its episodes again from the start
            self.envs[key] = env = self.make(key) if self.make else make_environment(self.config)
            messages, tools = call_with_timeout(env.reset, self.config.step_timeout_s, task, seed)
            out.append((list(messages), list(tools or [])))
        return out

    def step(self, items: list[tuple[int, Message]]) -> list[StepResult]:
        """Each episode's environment answers its assistant message; a crash or a hang ends that episode."""
        results = []
        for key, message in items:
            try:
                result = call_with_timeout(self.envs[key].step, self.config.step_timeout_s, message)
            except TimeoutError as exc:
                self.failed.add(key)
                result = StepResult(done=True, info={"status": "timeout", "error": f"env.step {exc}"})
            except Exception as exc:  # noqa: BLE001 - user environment code: it ends this episode, not the run
                log.warning("environment step failed (episode ends as error): %s: %s", type(exc).__name__, exc)
                self.failed.add(key)
                result = StepResult(done=True, info={"status": "error", "error": f"{type(exc).__name__}: {exc}"})
            results.append(result)
        return results

    def finish(self, keys: list[int]) -> list[float]:
        """Each episode's final reward (0 for one whose environment failed); its environment is closed."""
        rewards = []
        for key in keys:
            env = self.envs.pop(key)
            failed = key in self.failed
            self.failed.discard(key)
            rewards.append(0.0 if failed else float(call_with_timeout(env.final_reward, self.config.step_timeout_s)))
            if not failed:  # a hung environment's thread may still hold it
                try:
                    env.close()
                except Exception as exc:  # noqa: BLE001 - closing a broken environment must not end the run
                    log.warning("environment close failed: %s", exc)
        return rewards
