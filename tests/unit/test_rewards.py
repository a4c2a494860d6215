import pytest

from forge_core.rewards import (
    CombinedReward,
    MathReward,
    OverlongPenalty,
    ThinkingReward,
    build_reward,
    extract_answer,
    parse_number,
    soft_overlong_punishment,
)


@pytest.mark.parametrize("text,value", [
    ("$1,234", 1234.0), ("-5", -5.0), ("3.25 dollars.", 3.25), ("3/4", 0.75), ("\\frac{3}{4}", 0.75),
    ("\\dfrac{-1}{2}", -0.5), ("42.", 42.0), ("12 apples", 12.0), ("x", None), ("1/0", None), ("−7", -7.0),
])
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("response,answer", [
    ("<think>2+2</think><answer>4</answer>", "4"),
    ("so the answer is \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("work...\n#### 1,200", "1,200"),
    ("I think 3 then 5", "5"),
    ("no numbers", None),
])
def test_extract_answer(response, answer):
    assert extract_answer(response) == answer


def test_math_reward_scores():
    r = MathReward()
    assert r("q", "<answer>$1,234.00</answer>", "#### 1234") == 1.0
    assert r("q", "<answer>-3</answer>", "x=-3\n#### -3") == 1.0
    assert r("q", "\\boxed{0.5}", "\\boxed{\\frac{1}{2}}") == 1.0
    assert r("q", "<answer>5</answer>", "4") == 0.0
    assert r("q", "nothing", "4") == 0.0
    assert MathReward(format_score=0.1)("q", "<answer>5</answer>", "4") == 0.1
    assert MathReward(extractors=("answer_tag",))("q", "the answer is 4", "4") == 0.0


def test_math_reward_never_evaluates_code():
    # an expression is not computed; a payload is not executed
    assert MathReward()("q", "<answer>2+2</answer>", "4") == 0.0
    assert MathReward()("q", "<answer>__import__('os').system('false')</answer>", "4") == 0.0


def test_math_reward_bad_target_names_it():
    with pytest.raises(ValueError, match="target 'abc' has no number"):
        MathReward()("q", "4", "abc")


def test_thinking_reward():
    t = ThinkingReward()
    assert t("q", "<think>because</think><answer>1</answer>", "1") == 1.0
    assert t("q", "<think> </think>1", "1") == 0.5
    assert t("q", "<think>never closed", "1") == 0.5
    assert t("q", "1", "1") == 0.0


def test_soft_overlong_punishment():
    assert soft_overlong_punishment(10, 20, 5) == 0.0
    assert soft_overlong_punishment(15, 20, 5) == 0.0
    assert soft_overlong_punishment(17, 20, 5) == pytest.approx(-0.4)
    assert soft_overlong_punishment(20, 20, 5) == -1.0
    assert soft_overlong_punishment(25, 20, 5) == -1.0
    assert OverlongPenalty(20, 5)("q", "x" * 18, "") == pytest.approx(-0.6)
    with pytest.raises(ValueError, match="cache_len"):
        soft_overlong_punishment(1, 20, 0)


def bad_reward(prompt, response, target):
    raise RuntimeError("boom")


def test_combined_reward_weights_breakdown_and_fallback(caplog):
    combo = CombinedReward.from_config([
        {"name": "math", "weight": 1.0},
        {"name": "thinking", "weight": 0.5},
        {"name": "tests.unit.test_rewards:bad_reward", "weight": 2.0, "key": "bad"},
    ], fallback=-0.25)
    s = combo.score("q", "<think>ok</think><answer>4</answer>", "4")
    assert s.breakdown == {"math": 1.0, "thinking": 1.0, "bad": -0.25}
    assert s.total == pytest.approx(1.0 + 0.5 - 0.5)
    assert s.errors == {"bad": "RuntimeError: boom"} and combo.error_count == 1
    assert "boom" in caplog.text


def test_reward_config_errors():
    with pytest.raises(ValueError, match="unknown reward 'maths'"):
        build_reward("maths")
    with pytest.raises(ValueError, match=r"rewards\[0\] has no 'name'"):
        CombinedReward.from_config([{"weight": 1.0}])
    with pytest.raises(ValueError, match="duplicate names"):
        CombinedReward.from_config([{"name": "math"}, {"name": "math"}])


def test_digit_match_reward_gives_partial_credit_per_position():
    from forge_core.rewards import DigitMatchReward, build_reward

    r = build_reward("digits")
    assert isinstance(r, DigitMatchReward)
    assert r("Q: 27+35=", "62", "62") == 1.0
    assert r("Q: 27+35=", "52", "62") == 0.5  # carry missed: units right, tens wrong
    assert r("Q: 27+75=", "92", "102") == 1 / 3  # missing hundreds digit counts as wrong
    assert r("Q: 5-9=", "4", "-4") == 0.0  # wrong sign
    assert r("Q: 1+1=", "no idea", "2") == 0.0
    assert r("Q:", "2.5", "2.5") == 1.0  # non-integers: exact match


def test_hanging_reward_times_out_scores_fallback_and_scoring_goes_on():
    from forge_core.rewards.sandbox import TimeLimitedReward

    entries = [{"name": "tests.unit.reward_examples:hangs_on_loop", "key": "slow", "weight": 2.0},
               {"name": "tests.unit.reward_examples:raises_on_boom", "key": "flaky"}]
    reward = TimeLimitedReward(entries, timeout_s=0.5, fallback=0.0)
    try:
        ok = reward.score("q", "fine", "1")
        assert ok.total == 2.5 and ok.breakdown == {"slow": 1.0, "flaky": 0.5} and not ok.errors
        hung = reward.score("q", "loop forever", "1")
        timeout = "timed out after reward.timeout_s=0.5s"
        assert hung.total == 0.0 and hung.errors == {"slow": timeout, "flaky": timeout} and reward.timeouts == 1
        raised = reward.score("q", "boom", "1")  # the restarted scorer still works; a raising reward is counted
        assert raised.total == 2.0 and raised.errors == {"flaky": "RuntimeError: boom"}
        # in a batch the hung episode is cut off and the ones after it are scored by a fresh scorer, in order
        batch = reward.score_batch([("q", "a", "1"), ("q", "loop", "1"), ("q", "boom", "1"), ("q", "b", "1")])
        assert [b.total for b in batch] == [2.5, 0.0, 2.0, 2.5] and reward.timeouts == 2
        assert [sorted(b.errors) for b in batch] == [[], ["flaky", "slow"], ["flaky"], []]
    finally:
        reward.close()
    assert reward.proc is None


def test_time_limited_reward_rejects_bad_settings():
    from forge_core.rewards.sandbox import TimeLimitedReward

    with pytest.raises(ValueError, match="reward.timeout_s must be > 0"):
        TimeLimitedReward([{"name": "math"}], timeout_s=0)
    with pytest.raises(ValueError, match="unknown reward 'maths'"):
        TimeLimitedReward([{"name": "maths"}], timeout_s=1)


def test_a_reward_function_failing_on_every_episode_for_max_failed_steps_ends_the_run_with_its_error():
    from forge_core.recipes.reward_watch import RewardFailureWatch, RewardFunctionFailed
    from forge_core.recipes.steps import score_rewards
    from forge_core.types import Completion, Episode, Group

    combo = CombinedReward.from_config([{"name": "math"}, {"name": "tests.unit.test_rewards:bad_reward", "key": "bad"}])

    def scored(responses):
        group = Group("q", "4", [Episode("q", "4", [1], Completion(r, [2], [0.0])) for r in responses])
        return [group], score_rewards([group], combo)

    groups, metrics = scored(["4", "5"])
    assert metrics["reward/failed/bad"] == 1.0 and metrics["reward/failed/math"] == 0.0
    assert groups[0].episodes[0].completion.metadata["reward_errors"] == {"bad": "RuntimeError: boom"}
    watch = RewardFailureWatch(3)
    watch.see(0, metrics, groups)
    watch.see(1, metrics, groups)
    watch.see(2, {**metrics, "reward/failed/bad": 0.5}, groups)  # it worked once: the count starts again
    watch.see(3, metrics, groups)
    watch.see(4, metrics, groups)
    with pytest.raises(RewardFunctionFailed, match=r"reward function 'bad' raised on every episode of 3 steps in a "
                                                   r"row \(steps 3..5\).*its error: RuntimeError: boom.*"
                                                   r"reward.max_failed_steps \(3\)"):
        watch.see(5, metrics, groups)
    never = RewardFailureWatch(0)
    for step in range(10):
        never.see(step, metrics, groups)
    # every group dropped by dynamic sampling: the message says where the error is
    with pytest.raises(RewardFunctionFailed, match="the reward worker's log shows it"):
        RewardFailureWatch(1).see(0, metrics, [])
