"""The imperfect teacher: the configured share of carrying sums is demonstrated without the carry, nothing else; and
the column working it writes."""

import pytest

from forge_core.data import make_arith_problems
from forge_core.data.arith import (
    ArithSpec,
    add_in_columns,
    carries_into_tens,
    sum_without_tens_carry,
    write_solution,
)
from forge_core.data.problems import Problem
from forge_core.data.teacher import teach
from forge_core.rewards.math import MathReward, parse_target


def test_column_addition_by_hand():
    assert add_in_columns([47, 38]) == ("7+8=15;4+3+1=8", 85)
    assert add_in_columns([57, 68]) == ("7+8=15;5+6+1=12", 125)
    assert add_in_columns([7, 8]) == ("7+8=15;0+0+1=1", 15)
    assert add_in_columns([123, 9, 80]) == ("3+9+0=12;2+0+8+1=11;1+0+0+1=2", 212)
    assert add_in_columns([47, 38], drop_tens_carry=True) == ("7+8=15;4+3=7", 75)
    assert add_in_columns([57, 68], drop_tens_carry=True) == ("7+8=15;5+6=11", 115)
    assert write_solution([47, 38], ["+"], "columns") == ("7+8=15;4+3+1=8\n#### 85", 85)
    assert write_solution([47, 38], ["+"], "plain", drop_tens_carry=True) == ("47+38=75\n#### 75", 75)


def test_columns_agree_with_the_sum_and_the_slip_with_the_plain_teacher():
    for a in range(0, 100, 7):
        for b in range(0, 100, 3):
            assert add_in_columns([a, b])[1] == a + b
            assert add_in_columns([a, b], drop_tens_carry=True)[1] == sum_without_tens_carry([a, b])


def test_generated_columns_problems_keep_their_terms_and_judge_as_their_sum():
    problems = make_arith_problems(50, seed=0, spec=ArithSpec(ops="+", solution="columns"))
    for p in problems:
        assert sum(p.terms) == int(p.target) == parse_target(p.solution)
        assert MathReward()(p.question, p.solution, p.solution) == 1.0  # the working itself judges as correct
    assert all(p.terms == () for p in make_arith_problems(50, seed=0, spec=ArithSpec(ops="-")))
    with pytest.raises(ValueError, match="set dataset.ops: '\\+'"):
        ArithSpec(ops="+-", solution="columns").check()
    with pytest.raises(ValueError, match="dataset.solution = 'steps' is not one of"):
        ArithSpec(solution="steps").check()


def test_the_teacher_drops_the_tens_carry_by_hand():
    assert carries_into_tens([47, 38]) and not carries_into_tens([41, 38])
    assert sum_without_tens_carry([47, 38]) == 75 and sum_without_tens_carry([9, 9, 9]) == 7
    (taught,) = teach([Problem("47+38=", "47+38=85\n#### 85", "85", (47, 38))], drop_carry=1.0)
    assert (taught.question, taught.solution, taught.target) == ("47+38=", "47+38=75\n#### 75", "75")
    (taught,) = teach([Problem("47+38=", "7+8=15;4+3+1=8\n#### 85", "85", (47, 38))], 1.0, solution="columns")
    assert (taught.solution, taught.target) == ("7+8=15;4+3=7\n#### 75", "75")
    unsolvable = Problem("47-38=", "47-38=9\n#### 9", "9")  # no terms: not a sum, left as it is
    assert teach([unsolvable], drop_carry=1.0) == [unsolvable]


@pytest.mark.parametrize("solution", ["plain", "columns"])
def test_its_error_rate_on_a_fixed_seed_is_the_configured_one(solution):
    problems = make_arith_problems(4000, seed=0, spec=ArithSpec(max_value=99, ops="+", solution=solution))
    taught = teach(problems, drop_carry=0.7, seed=0, solution=solution)
    carrying = [i for i, p in enumerate(problems) if carries_into_tens(p.terms)]
    wrong = [i for i, (p, t) in enumerate(zip(problems, taught)) if p.target != t.target]
    assert set(wrong) <= set(carrying)  # a sum without a tens carry is always right
    assert len(carrying) > 1500 and abs(len(wrong) / len(carrying) - 0.7) < 0.03  # SE ≈ 0.011
    assert all(parse_target(t.solution) == int(t.target) for t in taught)  # the working reaches its own answer
    assert teach(problems, 0.7, seed=0, solution=solution) == taught
    assert teach(problems, 0.7, seed=1, solution=solution) != taught
    assert teach(problems, 0.0, solution=solution) == problems
    with pytest.raises(ValueError, match="sft.drop_carry must be in"):
        teach(problems, 1.5)


def test_the_tiny_recipes_sft_trains_on_the_teachers_column_working(monkeypatch):
    from types import SimpleNamespace

    import runtime.sft
    from infra.config_checks import load_config

    cfg = load_config("configs/grpo_math_tiny.yaml", {"dataset.train_size": 2000, "eval.num_prompts": 8})
    spec = cfg.dataset
    problems = make_arith_problems(spec.train_size, seed=spec.seed, spec=spec)
    seen = {}
    monkeypatch.setattr(runtime.sft, "make_sft_examples",
                        lambda demos, prompts, tok, response: seen.update(demos=demos, response=response) or [])
    monkeypatch.setattr(runtime.sft, "run_sft", lambda *args, **kwargs: None)
    splits = SimpleNamespace(train=problems, train_prompts=[p.question for p in problems])
    runtime.sft.run_sft_steps(cfg, trainer=None, tok=SimpleNamespace(pad_token_id=0), splits=splits, show=False)
    demos = seen["demos"]
    assert seen["response"] == "solution" and all(";" in d.solution and "####" in d.solution for d in demos)
    carrying = [i for i, p in enumerate(problems) if carries_into_tens(p.terms)]
    slipped = [i for i in carrying if demos[i].target != problems[i].target]
    assert abs(len(slipped) / len(carrying) - cfg.sft.drop_carry) < 0.05  # ~900 carrying sums: SE ≈ 0.015
    assert all(demos[i].solution.split(";")[1].count("+") == 1 for i in slipped)  # the tens column lost its '+1'
