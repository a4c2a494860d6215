"""ToolEnvironment: the common shape of a tool-using environment. An assistant turn with tool calls gets the tools'
results back; a turn without one is the final answer, which `answer` scores."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from forge_core.envs.base import Message, StepResult
from forge_core.envs.tool_calls import ToolCallError, parse_tool_calls, tool_message
from forge_core.rewards.math import extract_answer, numbers_match, parse_number, parse_target

log = logging.getLogger(__name__)


class ToolError(Exception):
    """A tool refused its arguments: the model reads the message and the episode goes on (counted)."""


class ToolEnvironment:
    """Subclasses set `tools` (name -> callable taking the call's arguments, returning text) and `schemas`, and
    write `opening(task, seed)`, `answer(text)` (the reward) and `judge(text)` (solved or not). Only the schemas of the tools in `tools` reach the model: an
    environment that takes a tool away (calculator's `allow_tools: false`) no longer shows it."""

    tools: dict[str, Callable[..., str]] = {}
    schemas: list[dict] = []

    def reset(self, task: Any, seed: int) -> tuple[list[Message], list[dict]]:
        self.task, self.seed = task, seed
        return self.opening(task, seed), self.offered_schemas()

    def offered_schemas(self) -> list[dict]:
        """The schemas of the tools this episode may call (a template that renders tools shows exactly these)."""
        return [s for s in self.schemas if s["function"]["name"] in self.tools]

    def step(self, message: Message) -> StepResult:
        """Tool calls → their results (not done); no tool call → the answer, scored (done)."""
        text = message.get("content", "")
        try:
            calls = parse_tool_calls(text)
        except ToolCallError as exc:
            return StepResult(done=True, reward=0.0, info={"status": "parse_error", "solved": False,
                                                            "error": str(exc)})
        if not calls:
            verdict = self.judge(text)
            info = {"status": "completed"} if verdict is None else {"status": "completed", "solved": verdict}
            return StepResult(done=True, reward=self.answer(text), info=info)
        results, errors = [], 0
        for call in calls:
            tool = self.tools.get(call.name)
            if tool is None:
                return StepResult(done=True, reward=0.0, info={
                    "status": "unknown_tool", "solved": False, "tool_calls": len(calls),
                    "error": f"unknown tool {call.name!r}; tools: {sorted(self.tools)}"})
            try:
                content = tool(**call.arguments)
            except (ToolError, TypeError) as exc:  # TypeError: arguments that do not fit the tool's signature
                content, errors = f"error: {exc}", errors + 1
            results.append(tool_message(call.name, content))
        return StepResult(messages=results, info={"tool_calls": len(calls), "tool_errors": errors})

    def final_reward(self) -> float:
        return 0.0

    def close(self) -> None:
        pass

    def opening(self, task: Any, seed: int) -> list[Message]:
        raise NotImplementedError

    def answer(self, text: str) -> float:
        raise NotImplementedError

    def judge(self, text: str) -> bool | None:
        """Whether the final answer solves the task (StepResult.info["solved"]); None: no verdict, the episode's
        outcome reward decides (forge_core/envs/base.py)."""
        return None


def answer_matches(text: str, target: str) -> bool:
    """Whether the answer's number (#### N, else the last number) equals the target's."""
    expected = parse_target(target)
    span = extract_answer(text, ("gsm8k", "last_number"))
    got = parse_number(span) if span is not None else None
    return got is not None and expected is not None and numbers_match(got, expected)
