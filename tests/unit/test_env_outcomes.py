"""What an environment's episodes report: solved by the environment's verdict, stop reasons that tell a truncation
from an error, and a `rewards:` section that an environment would ignore refused at load."""

from __future__ import annotations

from pathlib import Path

import pytest

from forge_core.data.problems import Problem
from forge_core.envs import CalculatorEnvironment, EnvConfig, GuessEnvironment, StepResult
from forge_core.envs.episodes import env_metrics
from forge_core.recipes.steps import evaluate, rollout_metrics
from forge_core.types import Group
from infra.config_checks import load_config
from tests.unit.test_envs import CALL, TOK, CrashingEnv, ScriptedPolicy, format_tool_call, play

COST = 0.1
QUESTIONS = [Problem(f"secret {k}", "", "") for k in range(3)]


class ScriptedGenerator(ScriptedPolicy):
    """ScriptedPolicy with the generator attributes the env rollout reads (its tokenizer)."""

    tokenizer = TOK


def secret_of(problem: Problem, seed: int) -> int:
    probe = GuessEnvironment(1, 8)
    probe.reset(problem, seed)
    return probe.secret


def test_held_out_accuracy_counts_a_find_after_a_miss_as_solved():
    """guess with a cost per miss: finding the number at the second turn returns 1 - COST, and is still a success;
    never finding it is not."""
    secrets = [secret_of(p, k) for k, p in enumerate(QUESTIONS)]  # evaluate plays key k with env seed 0 + k
    miss = [1 if s != 1 else 2 for s in secrets]
    scripts = {0: [str(miss[0]), str(secrets[0])], 1: [str(secrets[1])], 2: [str(miss[2])] * 4}
    env = EnvConfig(name="guess", max_turns=4, max_tokens=400, options={"low": 1, "high": 8, "step_cost": COST})
    metrics = evaluate(ScriptedGenerator(scripts), QUESTIONS, ["" for _ in QUESTIONS], 16, env=env)
    assert metrics["eval/accuracy"] == pytest.approx(2 / 3)


class Verdict(CalculatorEnvironment):
    """A calculator whose answer step gives its own verdict, whatever the reward says."""

    def __init__(self, solved: bool, reward: float):
        super().__init__()
        self.verdict, self.score = solved, reward

    def step(self, message):
        return StepResult(done=True, reward=self.score, info={"status": "completed", "solved": self.verdict})


def test_the_environments_verdict_decides_and_the_outcome_reward_stands_in_without_one():
    envs = [Verdict(True, 0.3), Verdict(False, 1.0), GuessEnvironment(1, 8, step_cost=COST),
            CalculatorEnvironment(digit_credit=0.5)]
    secret = secret_of(Problem("What is 47*38?", "", ""), 7)  # play resets every episode with seed 7
    miss = 1 if secret != 1 else 2
    scripts = {0: ["#### 1"], 1: ["#### 1786"], 2: [str(miss), str(secret)], 3: ["#### 1780"]}
    _, _, episodes = play(envs, scripts, EnvConfig(name="calculator", max_turns=4, max_tokens=400))
    assert [e.reward for e in episodes][:3] == [0.3, 1.0, pytest.approx(1 - COST)]
    assert 0 < episodes[3].reward < 1  # partial digit credit: not an exact answer
    assert [e.completion.metadata["solved"] for e in episodes] == [True, False, True, False]
    assert env_metrics(episodes)["env/solved"] == pytest.approx(2 / 4)


def test_truncation_counts_only_the_limits_and_errors_have_their_own_rate():
    envs = [CrashingEnv(), CalculatorEnvironment(), CalculatorEnvironment(), CalculatorEnvironment(),
            CalculatorEnvironment()]
    scripts = {0: [CALL], 1: ['<tool_call>{"name": "calculate", "arguments": </tool_call>'],
               2: [format_tool_call("search", query="x")], 3: [CALL] * 4, 4: [CALL, "#### 1786"]}
    _, _, episodes = play(envs, scripts, EnvConfig(name="calculator", max_turns=3, max_tokens=800))
    statuses = [e.completion.metadata["status"] for e in episodes]
    assert statuses == ["error", "parse_error", "unknown_tool", "truncated_turns", "completed"]
    assert [e.completion.stop_reason for e in episodes] == ["error", "parse_error", "unknown_tool", "length", "eos"]
    metrics = rollout_metrics([Group(episodes[0].prompt, "1786", episodes)], 0, 1.0)
    assert metrics["rollout/truncation_rate"] == pytest.approx(1 / 5)
    assert metrics["rollout/error_rate"] == pytest.approx(3 / 5)


def test_the_token_budget_is_a_truncation():
    config = EnvConfig(name="calculator", max_turns=4, max_tokens=30)
    _, _, (episode,) = play([CalculatorEnvironment()], {0: [CALL]}, config)
    assert episode.completion.metadata["status"] == "truncated_length"
    assert episode.completion.stop_reason == "length"


def test_a_rewards_section_with_an_environment_is_refused_naming_both_keys_and_the_fix():
    calc = "configs/grpo_calculator_tool.yaml"
    with pytest.raises(ValueError, match=r"rewards: \['digits'\] would be ignored: with env.name 'calculator' .*"
                                         r"Remove rewards: from the config, or leave env.name empty"):
        load_config(calc, {"rewards": [{"name": "digits", "weight": 1.0}]})
    assert load_config(calc).env.name == "calculator"  # no rewards: section, as the recipe is written


@pytest.mark.parametrize("path", sorted(str(p) for p in Path("configs").glob("*.yaml")))
def test_every_recipe_still_loads(path, tmp_path, monkeypatch):
    import yaml

    monkeypatch.setenv("FORGEFLOW_HOME", str(tmp_path))  # no runs: a distillation recipe's teacher run is not here
    overrides, recipe = {}, yaml.safe_load(Path(path).read_text())
    if (recipe.get("distill") or {}).get("teacher"):
        with pytest.raises(ValueError, match="distill.teacher .* is neither a model directory, a run id or name"):
            load_config(path)
        overrides = {"distill.teacher": recipe["model"]["path"]}  # the recipe's other keys, the student as teacher
    assert load_config(path, overrides).steps >= 0
