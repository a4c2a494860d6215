"""trainer.procs: 2 (two ranks of one submitit job, FSDP2 over gloo) matches trainer.procs: 1 on the same batch."""

import pytest

from forge_core.generation import TorchGenerator
from forge_core.models import load_model_and_tokenizer
from forge_core.recipes import steps
from infra.weightsync import FSWeightStore
from tests.integration.pool_helpers import alternating_reward_groups, tiny_config, tiny_splits
from workers.pool import WorkerPool

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("update", [{}, {"trainer.mini_batches": 2, "trainer.epochs": 2,
                                         "rollout_correction.mode": "tis"},
                                    {"trainer.lora.rank": 4, "trainer.lr": 1e-2, "loss.beta": 0.04,
                                     "trainer.max_norm": 0.2},
                                    # 7 groups left after filtering: mini-batches of 7 rows split 4/3 over the ranks,
                                    # which micro-batches of 3 would run in 2 and 1 steps (a hang before padding)
                                    {"filter_groups": True, "trainer.mini_batches": 4, "trainer.micro_batch_size": 3}],
                         ids=["one-step", "ppo-2x2-tis", "lora-kl", "uneven-filtered"])
def test_two_rank_fsdp_step_equals_single_process(tmp_path, update):
    groups = alternating_reward_groups(tiny_config("local"))  # uneven token counts across ranks
    for e in groups[0].episodes:
        e.reward = 1.0  # all equal: filter_groups drops this group
    metrics, weights = {}, {}
    for procs in (1, 2):
        cfg = tiny_config("local", **{"trainer.procs": procs, "trainer.lr": 1e-4, "trainer.max_norm": 0.5,
                                      "trainer.micro_batch_size": 8, "workers.call_timeout_s": 120, **update})
        with WorkerPool(cfg, tmp_path / f"procs{procs}", roles=("trainer",)) as pool:
            metrics[procs] = pool.call("trainer", "train", 0, groups)
            weights[procs] = FSWeightStore(pool.store_root).fetch(1)[1]
            assert pool.health()["trainer"][0]["policy_version"] == 1
    assert metrics[1]["loss/loss"] == pytest.approx(metrics[2]["loss/loss"], abs=1e-5)
    assert metrics[1]["loss/grad_norm"] == pytest.approx(metrics[2]["loss/grad_norm"], rel=1e-5)
    assert metrics[1]["loss/grad_norm"] > update.get("trainer.max_norm", 0.5)  # clipping was active in both
    steps_per_batch = float(update.get("trainer.mini_batches", 1) * update.get("trainer.epochs", 1))
    assert metrics[1]["loss/optimizer_steps"] == metrics[2]["loss/optimizer_steps"] == steps_per_batch
    assert set(weights[1]) == set(weights[2])
    assert max((weights[1][k] - weights[2][k]).abs().max().item() for k in weights[1]) < 1e-5


def test_a_non_finite_loss_on_one_rank_raises_on_every_rank(tmp_path):
    """Rank 1's shard diverges: both ranks raise the same error (an all-reduced check) instead of rank 0 waiting
    for rank 1 in the next collective until the call times out."""
    from infra.config_checks import load_config
    from tests.plugin_config import write_plugin_config
    from workers.protocol import WorkerCallError

    plugin = "tests.unit.custom_loss_example:NaNOnOneRankLoss"
    splits = tiny_splits(tiny_config("local"))
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    groups = steps.rollout(TorchGenerator(model, tok), splits.train[:4], splits.train_prompts[:4], 4, seed=0)
    for g in groups:
        for i, e in enumerate(g.episodes):
            e.reward = float(i % 2)
    cfg = load_config(write_plugin_config(tmp_path, [plugin]), {
        "model.path": "tiny:qwen3-micro", "sft.steps": 0, "trainer.procs": 2, "trainer.micro_batch_size": 4,
        "workers.call_timeout_s": 120, "workers.threads": 1, "loss": {"name": plugin},
        "trainer.mini_batches": 1, "workers.start_timeout_s": 180})
    with WorkerPool(cfg, tmp_path / "nan", roles=("trainer",)) as pool:
        with pytest.raises(WorkerCallError, match="non-finite loss"):
            pool.call("trainer", "train", 0, groups)
        assert pool.health()["trainer"][0]["step"] == 0  # alive, answering, weights unchanged
