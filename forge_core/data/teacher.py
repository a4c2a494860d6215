"""An imperfect teacher for SFT demonstrations: the setting RL with verifiable rewards is used for, where the
demonstrations are wrong in a systematic way and only the verifier is exact. This teacher drops the carry from the
ones into the tens digit of a sum with a set probability; the held-out problems and the reward keep the true answers.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from forge_core.data.problems import Problem

SUM = re.compile(r"^(\d+(?:\+\d+)+)=")  # a solution that starts "a+b(+c…)=": a pure sum


def sum_terms(solution: str) -> list[int] | None:
    """The terms of a pure sum's solution ('47+38=85\\n#### 85' -> [47, 38]); None for anything else."""
    match = SUM.match(solution)
    return [int(t) for t in match[1].split("+")] if match else None


def carries_into_tens(terms: Sequence[int]) -> bool:
    """Whether the ones digits of `terms` sum to 10 or more."""
    return sum(t % 10 for t in terms) >= 10


def sum_without_tens_carry(terms: Sequence[int]) -> int:
    """The sum with the carry out of the ones digit dropped (47 + 38 -> 75, not 85)."""
    return sum(t // 10 for t in terms) * 10 + sum(t % 10 for t in terms) % 10


def teach(problems: Sequence[Problem], drop_carry: float, seed: int = 0) -> list[Problem]:
    """The teacher's demonstrations for `problems`: each sum that carries into the tens digit is answered without
    that carry with probability `drop_carry` (drawn per such problem from `seed`); every other problem, and every
    question, is unchanged."""
    if not 0.0 <= drop_carry <= 1.0:
        raise ValueError(f"sft.drop_carry must be in [0, 1] (the teacher's chance to drop a tens carry); got {drop_carry}")
    rng = random.Random(f"teacher:{seed}")
    taught = []
    for problem in problems:
        terms = sum_terms(problem.solution)
        if terms is None or not carries_into_tens(terms) or rng.random() >= drop_carry:
            taught.append(problem)
            continue
        wrong = sum_without_tens_carry(terms)
        expression = problem.solution.split("=", 1)[0]
        taught.append(Problem(problem.question, f"{expression}={wrong}\n#### {wrong}", str(wrong)))
    return taught
