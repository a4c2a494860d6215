"""`calculator`: arithmetic questions the model answers with the help of a `calculate` tool.

    user:      What is 47*38?
    assistant: <tool_call>{"name":"calculate","arguments":{"expression":"47*38"}}</tool_call>
    tool:      1786
    assistant: #### 1786                                  → reward 1.0 when the number is the product
"""

from __future__ import annotations

import ast
import operator

from forge_core.envs.base import Message
from forge_core.envs.tool_calls import format_tool_call, tool_schema
from forge_core.envs.tools import ToolEnvironment, ToolError, answer_matches
from forge_core.rewards.math import DigitMatchReward

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
MAX_ABS = 10**12  # larger intermediate values are refused (no `9**9**9` through multiplication chains)


def evaluate_arithmetic(expression: str) -> float | int:
    """The value of an expression of numbers, + - * / // % and parentheses; ToolError otherwise (never eval)."""
    if not isinstance(expression, str) or len(expression) > 200:
        raise ToolError("expression must be a string of at most 200 characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"cannot parse {expression!r}") from exc

    def value(node: ast.AST) -> float | int:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return in_range(node.value)  # a literal such as 1e999 is already inf
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = value(node.operand)
            return in_range(-v if isinstance(node.op, ast.USub) else v)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            left, right = value(node.left), value(node.right)
            try:
                return in_range(OPERATORS[type(node.op)](left, right))
            except ZeroDivisionError as exc:
                raise ToolError("division by zero") from exc
        raise ToolError(f"only numbers, + - * / // % and parentheses are allowed in {expression!r}")

    return value(tree.body)


def in_range(number: float | int) -> float | int:
    """The number, or ToolError when it is not finite or its magnitude exceeds MAX_ABS (every constant and every
    intermediate result passes here, so neither inf nor nan reaches the model)."""
    if not abs(number) <= MAX_ABS:  # false for nan as well as inf (and no int-to-float overflow)
        raise ToolError(f"a value exceeds {MAX_ABS:.0e} in magnitude (or is not finite)")
    return number


def calculate(expression: str) -> str:
    """The `calculate` tool: the value as text (integers without a decimal point)."""
    out = evaluate_arithmetic(expression)
    return str(int(out)) if float(out).is_integer() else f"{out:.6g}"


class CalculatorEnvironment(ToolEnvironment):
    """A Problem's question; reward 1.0 when the final answer's number equals its target, else `digit_credit` ×
    the share of its digits in place (DigitMatchReward: a denser signal; accuracy counts exact answers only).
    `allow_tools: false` takes the tool away (a call ends the episode as unknown_tool): the model answering alone,
    shown neither the tool's schema nor `tool_prompt` (the call format, for templates that do not render tools)."""

    schemas = [tool_schema("calculate", "Evaluate an arithmetic expression", {"expression": "e.g. 47*38"})]

    def __init__(self, system_prompt: str = "", allow_tools: bool = True, digit_credit: float = 0.0,
                 tool_prompt: str = ""):
        if not 0.0 <= digit_credit < 1.0:
            raise ValueError(f"env.options.digit_credit must be in [0, 1) (partial credit below an exact answer's "
                             f"1.0), got {digit_credit}")
        self.digit_credit = digit_credit
        self.tools = {"calculate": calculate} if allow_tools else {}
        # the system message: how to call the tool (only while there is one to call), then system_prompt
        self.system_prompt = "\n".join(p for p in (tool_prompt if allow_tools else "", system_prompt) if p)
        self.digits = DigitMatchReward(("gsm8k", "last_number"))

    def opening(self, task, seed: int) -> list[Message]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + [{"role": "user", "content": task.question}]

    def judge(self, text: str) -> bool:
        return answer_matches(text, self.task.target)

    def answer(self, text: str) -> float:
        if self.judge(text):
            return 1.0
        return self.digit_credit * self.digits("", text, self.task.target) if self.digit_credit else 0.0

    def demonstrate(self, task, use_tools: bool) -> list[str]:
        """A teacher's assistant turns for `task` (an arith Problem, solution '<expr>=<value>…'): the tool call then
        the answer, or the answer alone."""
        expression = task.solution.split("=", 1)[0].strip()
        answer = f"#### {task.target}"
        return [format_tool_call("calculate", expression=expression), answer] if use_tools else [answer]
