"""env.credit: per-turn rewards summed into the episode's return (episode), or credited to their turn's tokens (turn)."""

from __future__ import annotations

import pytest
import torch

from forge_core.advantages import (
    assign_group_advantages,
    filter_informative_groups,
    grpo_advantages,
    is_informative,
)
from forge_core.envs import CalculatorEnvironment, EnvConfig, GuessEnvironment
from forge_core.envs.episodes import returns_to_go
from forge_core.losses import LOSSES, complete_hyperparameters, get_loss
from forge_core.losses.checks import constructor_signature
from forge_core.recipes.steps import compute_advantages
from forge_core.training.batching import episodes_to_train_inputs
from forge_core.types import Completion, Episode, Group
from infra.config_checks import load_config
from tests.unit.test_envs import PRODUCT, play

COST = 0.1


def guess_group(credit: str):
    """Three guess episodes on one secret: found at turn 2, at turn 3 and at turn 1 (each miss costs COST)."""
    probe = GuessEnvironment(1, 8)
    probe.reset(PRODUCT, 7)  # play resets every episode with seed 7: the same secret
    s = probe.secret
    miss = 1 if s != 1 else 2
    scripts = {0: [str(miss), str(s)], 1: [str(miss), str(miss), str(s)], 2: [str(s)]}
    config = EnvConfig(name="guess", max_turns=4, max_tokens=400, credit=credit)
    envs = {i: GuessEnvironment(1, 8, step_cost=COST) for i in range(3)}
    runs, _, episodes = play(envs, scripts, config)
    group = Group(episodes[0].prompt, PRODUCT.target, episodes)
    assign_group_advantages([group], "grpo")
    return runs, episodes


def grpo(values):
    return grpo_advantages(torch.tensor(values, dtype=torch.float64), torch.zeros(len(values), dtype=torch.long)).tolist()


def test_returns_to_go_add_the_later_turns_and_the_final_reward():
    assert returns_to_go([-0.1, -0.1, 0.0], 3, 1.0) == pytest.approx([0.8, 0.9, 1.0])
    assert returns_to_go([0.5], 2, 0.0) == [0.5, 0.0]  # a turn the environment never answered earns nothing


def test_turn_credit_gives_each_turns_tokens_the_advantage_of_its_return_against_the_same_turn():
    runs, episodes = guess_group("turn")
    assert [r.turns for r in runs] == [2, 3, 1]
    returns = [e.completion.metadata["turn_returns"] for e in episodes]
    assert returns == [pytest.approx([1 - COST, 1.0]), pytest.approx([1 - 2 * COST, 1 - COST, 1.0]), [1.0]]
    turn0, turn1 = grpo([r[0] for r in returns]), grpo([returns[0][1], returns[1][1]])
    # turn 2 only episode 1 reached: no peer to compare it with, so it takes its episode's advantage
    expected = {(0, 0): turn0[0], (0, 1): turn1[0], (1, 0): turn0[1], (1, 1): turn1[1], (1, 2): turn0[1],
                (2, 0): turn0[2]}
    for i, e in enumerate(episodes):
        mask, starts = e.completion.loss_mask, e.completion.metadata["turn_starts"] + [len(e.completion.token_ids)]
        assert len(starts) - 1 == runs[i].turns
        for k in range(runs[i].turns):
            for j in range(starts[k], starts[k + 1]):
                want = expected[(i, k)] if mask[j] else 0.0
                assert e.token_advantages[j] == pytest.approx(want), (i, k, j)
        assert e.advantage == pytest.approx(turn0[i])  # turn 0's return is the episode's: the scalar view agrees
    # the later turn of episode 0 did better than episode 1's at the same turn: the credit differs by turn
    assert expected[(0, 1)] > 0 > expected[(1, 1)]
    # the decisive turn of the longest episode trains, with its episode's sign (the slowest find: below the group)
    assert expected[(1, 2)] == turn0[1] < 0


def test_a_winning_turn_no_other_episode_reached_gets_its_episodes_positive_advantage():
    """The calculator case: one episode calls the tool and then answers right (2 turns), the others answer wrong at
    once (1 turn). The answer after the tool result is the decisive turn, and only that episode reached it."""
    from tests.unit.test_envs import CALL

    config = EnvConfig(name="calculator", max_turns=3, max_tokens=400, credit="turn")
    scripts = {0: [CALL, "#### 1786"], 1: ["#### 1785"], 2: ["#### 12"]}
    runs, _, episodes = play([CalculatorEnvironment() for _ in range(3)], scripts, config)
    assert [r.turns for r in runs] == [2, 1, 1] and [e.reward for e in episodes] == [1.0, 0.0, 0.0]
    assign_group_advantages([Group(episodes[0].prompt, PRODUCT.target, episodes)], "grpo")
    winner = episodes[0]
    answer = winner.completion.metadata["turn_starts"][1]  # the first token of the answer turn
    assert winner.advantage > 0
    assert winner.token_advantages[answer] == pytest.approx(winner.advantage)
    assert all(a == pytest.approx(winner.advantage) for a, m in zip(winner.token_advantages,
                                                                    winner.completion.loss_mask, strict=True) if m)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_no_turn_is_zeroed_for_having_no_peer(name):
    """Whatever the estimator, a turn only one episode reached gets that episode's advantage, never 0."""
    groups = [Group("p", "t", [turn_episode([0.0, 0.0, 1.0]), turn_episode([0.5]), turn_episode([0.2, 0.1])])]
    assign_group_advantages(groups, name)
    first, second, _ = groups[0].episodes
    assert first.advantage != 0.0 and first.token_advantages[2] == pytest.approx(first.advantage)
    assert second.token_advantages == [pytest.approx(second.advantage)]


def turn_episode(returns: list[float]) -> Episode:
    """An episode credited per turn with one generated token per turn and the given returns-to-go."""
    meta = {"turn_returns": returns, "first_turn": 0, "turn_starts": list(range(len(returns)))}
    completion = Completion("x", [5] * len(returns), [-0.1] * len(returns), metadata=meta, loss_mask=[1] * len(returns))
    return Episode("p", "t", [1], completion, reward=returns[0])


def test_dynamic_sampling_keeps_a_group_whose_totals_tie_but_whose_turns_differ():
    """Both episodes return 1.0 in total, but one earned it at its second turn and the other at its first: the
    per-turn advantages they train on are not 0, so filter_groups must keep the group (DAPO drops only groups whose
    advantages are all 0)."""
    tied = Group("p", "t", [turn_episode([1.0, 0.5]), turn_episode([1.0, 1.2])])
    flat = Group("p", "t", [turn_episode([1.0, 1.0]), turn_episode([1.0, 1.0])])
    assert is_informative(tied) and not is_informative(flat)
    kept, dropped = filter_informative_groups([tied, flat])
    assert kept == [tied] and dropped == 1
    episodes, metrics = compute_advantages([tied, flat], "grpo", drop_uninformative=True)
    assert metrics["rollout/dropped_groups"] == 1.0 and len(episodes) == 2
    assert episodes[0].token_advantages[1] < 0 < episodes[1].token_advantages[1]


def test_gspo_with_turn_credit_is_refused_at_config_load_with_the_fix():
    calc = "configs/grpo_calculator_tool.yaml"
    with pytest.raises(ValueError, match=r"env.credit: turn .* loss.name 'gspo' is sequence-level.*"
                                         r"loss.name: gspo_token\) or env.credit: episode"):
        load_config(calc, {"env.credit": "turn", "loss.name": "gspo"})
    assert load_config(calc, {"env.credit": "turn", "loss.name": "gspo_token"}).loss.name == "gspo_token"
    assert load_config(calc, {"env.credit": "episode", "loss.name": "gspo"}).loss.name == "gspo"


def test_gspo_refuses_per_token_advantages_that_vary_within_a_sequence():
    logprobs, mask = -torch.rand(2, 6), torch.ones(2, 6, dtype=torch.bool)
    constant = torch.tensor([[0.5] * 6, [-1.0] * 6])
    torch.testing.assert_close(get_loss("gspo")(logprobs, None, constant, mask, old_logprobs=logprobs - 0.01),
                               get_loss("gspo")(logprobs, None, constant[:, 0], mask, old_logprobs=logprobs - 0.01))
    varied = constant.clone()
    varied[0, 4:] = 2.0
    with pytest.raises(ValueError, match="use loss.name gspo_token .* or env.credit: episode"):
        get_loss("gspo")(logprobs, None, varied, mask, old_logprobs=logprobs - 0.01)
    mask[0, 4:] = False  # the differing tokens are not trained on (inserted tokens): one advantage per sequence
    get_loss("gspo")(logprobs, None, varied, mask, old_logprobs=logprobs - 0.01)


def test_turn_credit_reaches_the_trainer_as_per_token_advantages():
    _, episodes = guess_group("turn")
    _, targets = episodes_to_train_inputs(episodes, pad_id=0)
    adv = targets["advantages"]
    assert adv.shape == targets["padding_mask"].shape
    for i, e in enumerate(episodes):
        assert adv[i, :len(e.token_advantages)].tolist() == pytest.approx(e.token_advantages)


def test_episode_credit_keeps_one_advantage_per_episode():
    _, episodes = guess_group("episode")
    assert all(e.token_advantages is None and "turn_returns" not in e.completion.metadata for e in episodes)
    _, targets = episodes_to_train_inputs(episodes, pad_id=0)
    assert targets["advantages"].shape == (3,)
    assert targets["advantages"].tolist() == pytest.approx(grpo([1 - COST, 1 - 2 * COST, 1.0]))


def test_an_unknown_credit_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"env.credit must be one of \['episode', 'turn'\]"):
        EnvConfig(name="guess", credit="token").check()


@pytest.mark.parametrize("name", sorted(n for n in LOSSES if n != "sft" and not getattr(LOSSES[n], "sequence_level", False)))
def test_every_token_level_loss_takes_per_token_advantages_and_a_constant_row_equals_its_scalar(name):
    g = torch.Generator().manual_seed(1)
    shape = (3, 10)
    logprobs = -torch.rand(shape, generator=g) * 2
    ref, old = -torch.rand(shape, generator=g) * 2, -torch.rand(shape, generator=g) * 2
    mask = torch.ones(shape, dtype=torch.bool)
    scalar = torch.tensor([1.0, -0.5, 0.3])
    _, defaults = constructor_signature(LOSSES[name])
    params = complete_hyperparameters(name, {"beta": 0.04} if "beta" in defaults else {}, shape[1])

    def loss_of(adv):
        return get_loss(name, **params)(logprobs, ref, adv, mask, old_logprobs=old, num_tokens=30.0, num_seqs=3.0)

    torch.testing.assert_close(loss_of(scalar), loss_of(scalar[:, None].expand(shape).clone()))
    varied = scalar[:, None].expand(shape).clone()
    varied[0, 5:] = -2.0  # row 0's second turn did worse: the loss sees it
    assert not torch.isclose(loss_of(varied), loss_of(scalar))


def test_the_gradient_at_each_generated_token_follows_its_turns_advantage():
    _, episodes = guess_group("turn")
    _, targets = episodes_to_train_inputs(episodes, pad_id=0)
    logprobs = torch.zeros(targets["padding_mask"].shape, requires_grad=True)
    keep = targets["loss_mask"]
    # on-policy, no KL, token-mean: d loss / d logprob_j = -A_j / tokens, so the gradient is the token's advantage
    loss = get_loss("grpo", beta=0.0, aggregation="token-mean")(logprobs, None, targets["advantages"], keep, old_logprobs=logprobs.detach(),
                                      num_tokens=float(keep.sum()), num_seqs=3.0)
    loss.backward()
    for i, e in enumerate(episodes):
        n = len(e.token_advantages)
        grad = -logprobs.grad[i, :n] * keep.sum()
        want = torch.tensor(e.token_advantages) * keep[i, :n]
        torch.testing.assert_close(grad, want.float(), rtol=1e-5, atol=1e-6)
