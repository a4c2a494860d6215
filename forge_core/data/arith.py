"""Synthetic arithmetic word problems: deterministic by seed, difficulty knobs, disjoint train/test splits."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from forge_core.data.problems import Problem

NAMES = ("Ann", "Bob", "Cat", "Dan", "Eve", "Fay", "Gus", "Ida")
ITEMS = ("apples", "books", "coins", "pens", "cards", "eggs")
SPLITS = ("train", "test")
SOLUTIONS = ("plain", "columns")


@dataclass
class ArithSpec:
    """Difficulty knobs: operand range, number of terms, operators, and phrasing (`equation` or `word`); the
    `dataset` section's own keys for dataset.kind arith (DatasetConfig inherits them)."""

    min_value: int = 0
    max_value: int = 99
    num_terms: int = 2
    ops: str = "+-"  # the operators to draw from, a subset of "+-*"
    style: str = "equation"  # equation | word
    # plain: '47+38=85'; columns (sums only): the column-by-column working, ones first, '7+8=15;4+3+1=8'
    solution: str = "plain"
    test_fraction: float = 0.1  # the share of all expressions that belongs to the held-out split

    def check(self, where: str = "dataset") -> None:
        """ValueError naming the key and the fix."""
        if self.min_value > self.max_value:
            raise ValueError(f"{where}.min_value {self.min_value} > {where}.max_value {self.max_value}")
        if self.num_terms < 2:
            raise ValueError(f"{where}.num_terms must be >= 2; got {self.num_terms}")
        if not set(self.ops) <= {"+", "-", "*"} or not self.ops:
            raise ValueError(f"{where}.ops must be a non-empty subset of ['+', '-', '*']; got {list(self.ops)}")
        if self.style not in ("equation", "word"):
            raise ValueError(f"{where}.style = {self.style!r} is not one of ['equation', 'word']")
        if self.solution not in SOLUTIONS:
            raise ValueError(f"{where}.solution = {self.solution!r} is not one of {list(SOLUTIONS)}")
        if self.solution == "columns" and (self.ops != "+" or self.min_value < 0):
            raise ValueError(f"{where}.solution: columns writes out sums of non-negative terms; set {where}.ops: '+' "
                             f"and {where}.min_value >= 0 (got ops {self.ops!r}, min_value {self.min_value})")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"{where}.test_fraction must be in (0, 1); got {self.test_fraction}")


def split_of(expression: str, test_fraction: float) -> str:
    """Stable split assignment from a hash of the expression, so train and test never share a problem."""
    h = int.from_bytes(hashlib.sha256(expression.encode()).digest()[:8], "big")
    return "test" if (h % 10_000) < test_fraction * 10_000 else "train"


def phrase(terms: list[int], ops: list[str], style: str, rng: random.Random) -> str:
    """The question text for terms/ops."""
    expression = "".join(f"{t}{o}" for t, o in zip(terms, ops + [""]))
    if style == "equation":
        return f"{expression}="
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    parts = [f"{name} has {terms[0]} {item}."]
    verbs = {"+": "gets {n} more", "-": "gives away {n}", "*": "multiplies them by {n}"}
    parts += [f"{name} {verbs[o].format(n=t)}." for t, o in zip(terms[1:], ops)]
    return " ".join(parts) + f" How many {item} now?"


def make_arith_problems(n: int, seed: int = 0, split: str = "train", spec: ArithSpec | None = None) -> list[Problem]:
    """`n` distinct problems of `split` in GSM8K form (solution '<expr>=<value>\\n#### <value>')."""
    spec = spec or ArithSpec()
    spec.check()
    if split not in SPLITS:
        raise ValueError(f"arith split must be one of {SPLITS}; got {split!r}")
    rng = random.Random(f"{seed}:{split}")
    seen: set[str] = set()
    problems: list[Problem] = []
    attempts = 0
    while len(problems) < n:
        attempts += 1
        if attempts > 200 * n + 10_000:
            raise ValueError(
                f"only {len(problems)} distinct {split} problems exist with min_value {spec.min_value}, max_value "
                f"{spec.max_value}, num_terms {spec.num_terms} and ops {spec.ops!r}; widen dataset.max_value or "
                f"dataset.num_terms, or ask for fewer (dataset.train_size / eval.num_prompts)"
            )
        terms = [rng.randint(spec.min_value, spec.max_value) for _ in range(spec.num_terms)]
        ops = [rng.choice(spec.ops) for _ in range(spec.num_terms - 1)]
        expression = "".join(f"{t}{o}" for t, o in zip(terms, ops + [""]))
        if expression in seen or split_of(expression, spec.test_fraction) != split:
            continue
        seen.add(expression)
        question = phrase(terms, ops, spec.style, rng)
        solution, value = write_solution(terms, ops, spec.solution)
        is_sum = set(ops) == {"+"}  # a teacher can re-solve a sum from its terms (forge_core/data/teacher.py)
        problems.append(Problem(question, solution, str(value), tuple(terms) if is_sum else ()))
    return problems


def write_solution(terms: list[int], ops: list[str], solution: str = "plain",
                   drop_tens_carry: bool = False) -> tuple[str, int]:
    """A reference solution ('<working>\n#### <value>') and its value; `drop_tens_carry` (sums only) solves it the
    way a teacher who forgets the carry out of the ones digit would."""
    if solution == "columns":
        working, value = add_in_columns(terms, drop_tens_carry)
    else:
        value = sum_without_tens_carry(terms) if drop_tens_carry else eval_expression(terms, ops)
        working = "".join(f"{t}{o}" for t, o in zip(terms, ops + [""])) + f"={value}"
    return f"{working}\n#### {value}", value


def add_in_columns(terms: list[int], drop_tens_carry: bool = False) -> tuple[str, int]:
    """Column addition of non-negative `terms`, ones first and at least ones and tens ('7+8=15;4+3+1=8' for 47+38,
    '7+8=15;0+0+1=1' for 7+8), and the sum it reaches; `drop_tens_carry` leaves the ones' carry out of the tens."""
    columns = max(2, len(str(max(terms))))
    parts, value, carry = [], 0, 0
    for k in range(columns):
        digits = [t // 10**k % 10 for t in terms]
        if k == 1 and drop_tens_carry:
            carry = 0
        total = sum(digits) + carry
        parts.append("+".join(map(str, digits + ([carry] if carry else []))) + f"={total}")
        last = k == columns - 1
        value += (total if last else total % 10) * 10**k
        carry = total // 10
    return ";".join(parts), value


def carries_into_tens(terms: Sequence[int]) -> bool:
    """Whether the ones digits of `terms` sum to 10 or more."""
    return sum(t % 10 for t in terms) >= 10


def sum_without_tens_carry(terms: Sequence[int]) -> int:
    """The sum with the carry out of the ones digit dropped (47 + 38 -> 75, not 85)."""
    return sum(t // 10 for t in terms) * 10 + sum(t % 10 for t in terms) % 10


def eval_expression(terms: list[int], ops: list[str]) -> int:
    """Value of terms joined by ops with the usual precedence (* before + and -); no eval()."""
    # fold multiplications first, then left-to-right addition/subtraction
    values, pending = [terms[0]], []
    for t, o in zip(terms[1:], ops):
        if o == "*":
            values[-1] *= t
        else:
            pending.append(o)
            values.append(t)
    total = values[0]
    for v, o in zip(values[1:], pending):
        total = total + v if o == "+" else total - v
    return total


def write_gsm8k_jsonl(problems: list[Problem], out: str | Path) -> Path:
    """Write problems as GSM8K JSONL (`question`, `answer`) atomically."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tmp.open("w") as f:
        for p in problems:
            f.write(json.dumps({"question": p.question, "answer": p.solution}) + "\n")
    tmp.replace(out)
    return out
