"""`openenv`: an OpenEnv environment server (github.com/meta-pytorch/OpenEnv: reset / step / state over HTTP and
WebSocket) played as a forgeflow environment. `pip install --no-deps openenv-core` (the Makefile does).

    env: {name: openenv, options: {url: "http://127.0.0.1:8000", action_field: message, observation_field: prompt}}

The assistant's message becomes the action `{action_field: text}`; the observation's `observation_field` (the whole
observation as JSON when empty) becomes the next user message; OpenEnv's reward and done are the step's. Each
episode holds its own session (one WebSocket) with the server, opened at reset and closed with the episode.

The env workers connect to `url` and train on what comes back, so the config loader (infra/hosts.py) accepts a url
from an override or a flow/deployment parameter only when the config file lists its host under `trusted_hosts:`
(a url written in the file itself is trusted).
"""

from __future__ import annotations

import json
from typing import Any

from forge_core.envs.base import Message, StepResult

HIDDEN = ("reward", "done", "metadata")  # observation fields that are the step's result, not text for the model


class OpenEnvEnvironment:
    def __init__(self, url: str, action_field: str = "message", observation_field: str = "", role: str = "user",
                 question_in_reset: bool = False):
        if not url:
            raise ValueError("env.options.url is empty: give the OpenEnv server's address, e.g. http://127.0.0.1:8000")
        self.url, self.action_field, self.observation_field, self.role = url, action_field, observation_field, role
        self.question_in_reset = question_in_reset  # pass the dataset problem's question to reset(question=…)
        self.client = None

    def _connect(self):
        try:
            from openenv.core.generic_client import GenericEnvClient
        except ImportError as exc:
            raise ValueError("env.name openenv needs openenv-core: pip install --no-deps openenv-core "
                             "(and pip install -e '.[openenv]')") from exc
        return GenericEnvClient(base_url=self.url).sync()

    def reset(self, task: Any, seed: int) -> tuple[list[Message], list[dict]]:
        self.close()
        self.client = self._connect()
        kwargs = {"question": getattr(task, "question", str(task))} if self.question_in_reset else {}
        result = self.client.reset(seed=seed, **kwargs)
        return [{"role": "user", "content": self.text_of(result.observation)}], []

    def step(self, message: Message) -> StepResult:
        result = self.client.step({self.action_field: message.get("content", "")})
        reward = float(result.reward) if result.reward is not None else None
        if result.done:
            return StepResult(reward=reward, done=True, info={"status": "completed"})
        return StepResult([{"role": self.role, "content": self.text_of(result.observation)}], reward=reward)

    def final_reward(self) -> float:
        return 0.0  # OpenEnv rewards arrive with each step

    def close(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            client.close()

    def text_of(self, observation: Any) -> str:
        """The observation as the text the model reads."""
        if not isinstance(observation, dict):
            return str(observation)
        if self.observation_field:
            if self.observation_field not in observation:
                raise ValueError(f"env.options.observation_field {self.observation_field!r} is not in the OpenEnv "
                                 f"observation (fields: {sorted(observation)})")
            return str(observation[self.observation_field])
        return json.dumps({k: v for k, v in observation.items() if k not in HIDDEN}, sort_keys=True)
