"""The imperfect teacher: the configured share of carrying sums is demonstrated without the carry, nothing else."""

import pytest

from forge_core.data import make_arith_problems
from forge_core.data.arith import ArithSpec
from forge_core.data.problems import Problem
from forge_core.data.teacher import carries_into_tens, sum_terms, sum_without_tens_carry, teach


def test_the_teacher_drops_the_tens_carry_by_hand():
    assert sum_terms("47+38=85\n#### 85") == [47, 38] and sum_terms("47-38=9\n#### 9") is None
    assert carries_into_tens([47, 38]) and not carries_into_tens([41, 38])
    assert sum_without_tens_carry([47, 38]) == 75 and sum_without_tens_carry([9, 9, 9]) == 7
    (taught,) = teach([Problem("47+38=", "47+38=85\n#### 85", "85")], drop_carry=1.0)
    assert (taught.question, taught.solution, taught.target) == ("47+38=", "47+38=75\n#### 75", "75")


def test_its_error_rate_on_a_fixed_seed_is_the_configured_one():
    problems = make_arith_problems(4000, seed=0, spec=ArithSpec(max_value=99, ops="+"))
    taught = teach(problems, drop_carry=0.7, seed=0)
    carrying = [i for i, p in enumerate(problems) if carries_into_tens(sum_terms(p.solution))]
    wrong = [i for i, (p, t) in enumerate(zip(problems, taught)) if p.target != t.target]
    assert set(wrong) <= set(carrying)  # a sum without a tens carry is always right
    assert len(carrying) > 1500 and abs(len(wrong) / len(carrying) - 0.7) < 0.03  # SE ≈ 0.011
    assert teach(problems, 0.7, seed=0) == taught and teach(problems, 0.7, seed=1) != taught
    assert teach(problems, 0.0) == problems
    with pytest.raises(ValueError, match="sft.drop_carry must be in"):
        teach(problems, 1.5)
