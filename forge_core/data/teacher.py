"""An imperfect teacher for SFT demonstrations: the setting RL with verifiable rewards is used for, where the
demonstrations are wrong in a systematic way and only the verifier is exact. This teacher drops the carry from the
ones into the tens digit of a sum with a set probability; the held-out problems and the reward keep the true answers.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from forge_core.data.arith import carries_into_tens, write_solution
from forge_core.data.problems import Problem


def teach(problems: Sequence[Problem], drop_carry: float, seed: int = 0, solution: str = "plain") -> list[Problem]:
    """The teacher's demonstrations for `problems`, written as `solution` (dataset.solution): each sum that carries
    into the tens digit is solved without that carry with probability `drop_carry` (drawn per such problem from
    `seed`); every other problem, and every question, is unchanged."""
    if not 0.0 <= drop_carry <= 1.0:
        raise ValueError(f"sft.drop_carry must be in [0, 1] (the teacher's chance to drop a tens carry); got {drop_carry}")
    rng = random.Random(f"teacher:{seed}")
    taught = []
    for problem in problems:
        if not problem.terms or not carries_into_tens(problem.terms) or rng.random() >= drop_carry:
            taught.append(problem)
            continue
        terms = list(problem.terms)
        text, wrong = write_solution(terms, ["+"] * (len(terms) - 1), solution, drop_tens_carry=True)
        taught.append(Problem(problem.question, text, str(wrong), problem.terms))
    return taught
