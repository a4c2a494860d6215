import pytest
import torch

from forge_core.advantages import (
    assign_group_advantages,
    collect_informative_groups,
    compute_advantages,
    filter_informative_groups,
)
from forge_core.types import Completion, Episode, Group


def group(rewards, prompt="p"):
    eps = [Episode(prompt, "t", [1], Completion("x", [2], [-0.1]), reward=r) for r in rewards]
    return Group(prompt, "t", eps)


def test_grpo_advantages_match_formula():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 5.0, 4.0])
    ids = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    adv = compute_advantages("grpo", r, ids)
    g0 = r[:4]
    want0 = (g0 - g0.mean()) / (g0.std(unbiased=True) + 1e-4)
    g1 = r[4:]
    want1 = (g1 - g1.mean()) / (g1.std(unbiased=True) + 1e-4)
    torch.testing.assert_close(adv, torch.cat([want0, want1]))


def test_dr_grpo_and_rloo():
    r = torch.tensor([1.0, 2.0, 6.0])
    ids = torch.zeros(3, dtype=torch.long)
    torch.testing.assert_close(compute_advantages("dr_grpo", r, ids), r - 3.0)
    torch.testing.assert_close(compute_advantages("rloo", r, ids), torch.tensor([1 - 4.0, 2 - 3.5, 6 - 1.5]))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_singleton_and_all_equal_groups_are_zero(name):
    r = torch.tensor([0.7, 0.3, 0.3, 0.3, 1.0, 0.0])
    ids = torch.tensor([0, 1, 1, 1, 2, 2])
    adv = compute_advantages(name, r, ids)
    assert adv[:4].abs().max() == 0
    assert adv[4] > 0 > adv[5]


def test_non_contiguous_group_ids():
    r = torch.tensor([1.0, 0.0, 5.0, 1.0])
    ids = torch.tensor([3, 7, 3, 7])
    adv = compute_advantages("dr_grpo", r, ids)
    torch.testing.assert_close(adv, torch.tensor([-2.0, -0.5, 2.0, 0.5]))


def test_unknown_advantage_name():
    with pytest.raises(ValueError, match="unknown advantage.name 'ppo'.*grpo"):
        compute_advantages("ppo", torch.zeros(2), torch.zeros(2, dtype=torch.long))


def test_assign_group_advantages_in_place():
    groups = [group([1.0, 0.0]), group([1.0, 1.0])]
    assign_group_advantages(groups, "dr_grpo")
    assert [e.advantage for e in groups[0].episodes] == [0.5, -0.5]
    assert [e.advantage for e in groups[1].episodes] == [0.0, 0.0]


def test_dynamic_filter_drops_all_equal_groups():
    kept, dropped = filter_informative_groups([group([1, 1, 1]), group([0, 1, 0]), group([0, 0]), group([2])])
    assert dropped == 3 and len(kept) == 1 and kept[0].rewards == [0, 1, 0]


def test_collect_keeps_sampling_until_full_or_limit():
    calls = []

    def sample(n):
        calls.append(n)
        # every other group is uninformative
        return [group([0, 1]) if i % 2 == 0 else group([1, 1]) for i in range(n)]

    groups, stats = collect_informative_groups(sample, 4, max_rounds=10)
    assert len(groups) == 4 and stats.filled
    assert calls == [4, 2, 1]
    assert stats.dropped == 3 and stats.sampled == 7

    groups, stats = collect_informative_groups(lambda n: [group([1, 1])] * n, 4, max_rounds=3)
    assert groups == [] and not stats.filled and stats.rounds == 3 and stats.dropped == 12


def test_grpo_loop_refills_dropped_groups():
    from forge_core.data import make_arith_problems
    from forge_core.generation import SamplingParams, TorchGenerator
    from forge_core.losses import get_loss
    from forge_core.models import load_model_and_tokenizer
    from forge_core.recipes.config import EvalConfig, GRPOConfig
    from forge_core.recipes.grpo import GRPOLoop
    from forge_core.rewards import CombinedReward
    from forge_core.training import Trainer, TrainerConfig

    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    problems = make_arith_problems(40, seed=0)
    prompts = [p.question for p in problems]
    params = SamplingParams(max_new_tokens=2)
    flip = iter(range(10_000))
    # a reward that is informative for every other sampled episode pair: half the groups stay all-equal
    reward = CombinedReward([("coin", lambda p, r, t: float(next(flip) % 16 < 2), 1.0)])
    loop = GRPOLoop(TorchGenerator(model, tok, params), Trainer(model, get_loss("grpo"), TrainerConfig(), 0),
                    reward, problems, prompts, problems[:2], prompts[:2],
                    GRPOConfig(steps=1, prompts_per_step=8, group_size=8, filter_groups=True, fill_rounds=4),
                    tok.pad_token_id, eval=EvalConfig(every=0))
    m = loop.run_step(0)
    assert m["rollout/fill_rounds"] > 1
    assert m["rollout/dropped_groups"] > 0
    kept = m["rollout/num_episodes"] / 8
    assert m["rollout/sampled_groups"] > 8 and kept > 4  # refilling kept more than the first round's 4
    assert m["rollout/dropped_groups"] == m["rollout/sampled_groups"] - kept


def test_a_step_whose_refills_keep_no_group_trains_nothing_and_goes_on():
    """Every sampled group all-equal in every round (a cold start where nothing is ever right): the step makes no
    optimizer step and reports it, instead of failing on statistics of no episodes."""
    import torch

    from forge_core.data import make_arith_problems
    from forge_core.generation import SamplingParams, TorchGenerator
    from forge_core.losses import get_loss
    from forge_core.models import load_model_and_tokenizer
    from forge_core.recipes.config import EvalConfig, GRPOConfig
    from forge_core.recipes.grpo import GRPOLoop
    from forge_core.rewards import CombinedReward
    from forge_core.training import Trainer, TrainerConfig

    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    problems = make_arith_problems(40, seed=0)
    prompts = [p.question for p in problems]
    params = SamplingParams(max_new_tokens=2)
    never = CombinedReward([("never", lambda p, r, t: 0.0, 1.0)])
    trainer = Trainer(model, get_loss("grpo"), TrainerConfig(), 0)
    before = [p.detach().clone() for p in model.parameters()]
    loop = GRPOLoop(TorchGenerator(model, tok, params), trainer, never, problems, prompts, problems[:2], prompts[:2],
                    GRPOConfig(steps=2, prompts_per_step=4, group_size=4, filter_groups=True, fill_rounds=2),
                    tok.pad_token_id, eval=EvalConfig(every=0))
    m = loop.run_step(0)
    assert m["rollout/num_episodes"] == 0.0 and m["loss/skipped"] == 1.0 and m["rollout/fill_rounds"] == 2.0
    assert trainer.step == 0 and all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
