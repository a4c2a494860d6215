"""A real OpenEnv environment server for the adapter's tests: number guessing with "higher"/"lower" feedback,
served by OpenEnv's own create_app (run: uvicorn tests.openenv_server.guess_app:app --port P)."""

from __future__ import annotations

import random
import re
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):
    message: str = Field(..., description="the guess, as text")


class GuessObservation(Observation):
    prompt: str = Field(default="", description="what the environment says")


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.secret = 1

    def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.secret = random.Random(seed).randint(1, 8)
        return GuessObservation(prompt="Guess my number between 1 and 8.", done=False, reward=0.0)

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        self._state.step_count += 1
        found = re.findall(r"-?\d+", action.message)
        guess = int(found[-1]) if found else None
        if guess == self.secret:
            return GuessObservation(prompt="correct", done=True, reward=1.0)
        hint = "say a number" if guess is None else ("higher" if guess < self.secret else "lower")
        return GuessObservation(prompt=hint, done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=64)
