"""The environment contract: multi-turn episodes at the message level (an environment never sees tokens).

    messages, tools = env.reset(task, seed)          # the conversation so far, the tools the model may call
    result = env.step(assistant_message)             # StepResult(messages, reward, done, info)
    ... until result.done; env.final_reward() is added to the per-turn rewards; env.close()

Messages are chat dicts ({"role", "content"}); tool results come back as {"role": "tool", "name", "content"}. The
token layer (forge_core/envs/episodes.py) owns the tokens: it renders the messages, generates the assistant turns
and records which tokens the model generated.

The environment's verdict: the StepResult that ends an episode (done=True) should say whether the task was solved,
`info["solved"]` (a bool): held-out accuracy and env/solved count it. Without one, an episode counts as solved when
its outcome (the reward of its last turn plus final_reward()) is >= 1.0: shaping rewards of earlier turns (a cost
per miss, a bonus per tool call) do not count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, Any]

# how an episode ended (env/status_* metrics); every episode ends with exactly one
CREDITS = ("episode", "turn")  # env.credit: where per-turn rewards are credited
STATUSES = ("completed", "truncated_turns", "truncated_length", "parse_error", "unknown_tool", "timeout", "error")
# the statuses of an episode cut short by env.max_turns or env.max_tokens (stop reason "length"); the others but
# `completed` are errors: the model's (parse_error, unknown_tool) or the environment's (timeout, error)
TRUNCATIONS = ("truncated_turns", "truncated_length")


@dataclass
class StepResult:
    """What the environment answers to one assistant turn."""

    messages: list[Message] = field(default_factory=list)  # added to the conversation (tool results, feedback)
    reward: float | None = None  # this turn's reward, if the environment gives one
    done: bool = False
    # "status": one of STATUSES when done early; "solved": the verdict, with done=True; "tool_calls": n
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """One episode at a time; a new episode starts with reset."""

    def reset(self, task: Any, seed: int) -> tuple[list[Message], list[dict]]:
        """The opening messages of an episode on `task` (a Problem) and the tools' JSON schemas."""
        ...

    def step(self, message: Message) -> StepResult:
        """React to the assistant's message; done=True ends the episode."""
        ...

    def final_reward(self) -> float:
        """The reward of the whole episode, added to the per-turn rewards (0.0 when all reward is per turn)."""
        ...

    def close(self) -> None: ...


@dataclass
class EnvConfig:
    """Config section `env`: the environment multi-turn rollouts run in (name empty: single-turn prompts and the
    `rewards:` functions, as before)."""

    name: str = ""  # calculator | guess | openenv | module.path:Class (listed under plugins:)
    max_turns: int = 4  # assistant turns per episode
    max_tokens: int = 256  # tokens of an episode after its first prompt (generated and inserted)
    step_timeout_s: float = 10.0  # one env.step longer than this ends the episode as `timeout`
    num_replicas: int = 1  # env worker processes of a run on workers (episode k plays on replica k % replicas)
    step_threads: int = 8  # environment calls of a batch that run at once per runner (forge_core/envs/runner.py)
    # episode: per-turn rewards are summed into the episode's return, and every generated token gets its advantage;
    # turn: each turn's tokens get the advantage of the reward from that turn on, against the group's episodes at
    # the same turn (forge_core/advantages.py, turn_advantages)
    credit: str = "episode"
    options: dict[str, Any] = field(default_factory=dict)  # the environment's constructor arguments

    def check(self, where: str = "env") -> None:
        """ValueError naming the key and the fix."""
        if self.max_turns < 1:
            raise ValueError(f"{where}.max_turns must be >= 1, got {self.max_turns}")
        if self.max_tokens < 1:
            raise ValueError(f"{where}.max_tokens must be >= 1, got {self.max_tokens}")
        if self.num_replicas < 1:
            raise ValueError(f"{where}.num_replicas must be >= 1, got {self.num_replicas}")
        if self.step_threads < 1:
            raise ValueError(f"{where}.step_threads must be >= 1, got {self.step_threads}")
        if self.step_timeout_s <= 0:
            raise ValueError(f"{where}.step_timeout_s must be > 0 seconds, got {self.step_timeout_s}")
        if self.credit not in CREDITS:
            raise ValueError(f"{where}.credit must be one of {list(CREDITS)}, got {self.credit!r}")
        if not isinstance(self.options, dict):
            raise ValueError(f"{where}.options must be a mapping of the environment's arguments, got "
                             f"{self.options!r}")

    @property
    def enabled(self) -> bool:
        return bool(self.name)
