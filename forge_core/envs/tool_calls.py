"""Tool calls in an assistant turn: JSON in <tool_call> tags (the Hermes/Qwen convention), parsed and formatted.

    <tool_call>{"name": "calculate", "arguments": {"expression": "47*38"}}</tool_call>

The tiny models learn this format from demonstrations; a model with a chat template that knows tools gets the tools'
schemas through it and answers in the same tags.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


class ToolCallError(ValueError):
    """A tool call that cannot be parsed (the episode ends as `parse_error`)."""


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every tool call in an assistant turn, in order; ToolCallError for malformed JSON or an unclosed tag."""
    calls = []
    for body in CALL.findall(text):
        try:
            data = json.loads(body)
        except json.JSONDecodeError as exc:
            raise ToolCallError(f"tool call is not JSON ({exc.msg} at character {exc.pos}): {body[:80]!r}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ToolCallError(f"tool call needs {{\"name\": str, \"arguments\": {{…}}}}, got {body[:80]!r}")
        arguments = data.get("arguments", {})
        if not isinstance(arguments, dict):
            raise ToolCallError(f"tool call {data['name']!r}: arguments must be an object, got {arguments!r}")
        calls.append(ToolCall(data["name"], arguments))
    if text.count(OPEN) != len(calls):
        raise ToolCallError(f"a {OPEN} tag is not closed with {CLOSE}: {text[-80:]!r}")
    return calls


def format_tool_call(name: str, **arguments: Any) -> str:
    """The text of one tool call, compact JSON (what demonstrations write)."""
    return f"{OPEN}{json.dumps({'name': name, 'arguments': arguments}, separators=(',', ':'))}{CLOSE}"


def tool_message(name: str, content: str) -> dict[str, Any]:
    """The message carrying a tool's result back to the model."""
    return {"role": "tool", "name": name, "content": content}


def tool_schema(name: str, description: str, parameters: dict[str, str]) -> dict[str, Any]:
    """A tool's JSON schema in the OpenAI/HF function format (string parameters, all required)."""
    props = {k: {"type": "string", "description": v} for k, v in parameters.items()}
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": list(parameters)}}}
