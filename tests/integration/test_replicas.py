"""Generator and reward replicas work at the same time, and a split batch is the batch one worker would make."""

from pathlib import Path

import pytest

from tests.integration.pool_helpers import tiny_config, tiny_splits
from workers.pool import WorkerPool
from workers.remote import remote_evaluate, remote_rollout, remote_score

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    cfg = tiny_config("local", **{"generator.num_replicas": 2, "reward.num_replicas": 2,
                                  "generator.max_new_tokens": 48})
    with WorkerPool(cfg, tmp_path_factory.mktemp("run") / "replicas") as p:
        yield p, tiny_splits(cfg)


def samples(groups):
    return [[(e.completion.token_ids, e.completion.stop_reason) for e in g.episodes] for g in groups]


def test_two_replicas_sample_what_one_samples_and_at_the_same_time(pool):
    p, splits = pool
    problems, prompts = splits.train[:7], splits.train_prompts[:7]
    split = remote_rollout(p, problems, prompts, 6, seed=13)
    spans = [h["last_calls"]["rollout"] for h in p.health()["generator"]]
    one = p.clients("generator")[1].call("rollout", problems, prompts, 6, 13)  # one replica, the whole batch
    assert samples(split) == samples(one)
    assert [g.prompt for g in split] == prompts
    for a, b in zip(split, one):
        for x, y in zip(a.episodes, b.episodes):
            assert x.completion.logprobs == pytest.approx(y.completion.logprobs, abs=1e-5)
    # both replicas were inside their rollout call at one moment: the later start came before the earlier end
    assert max(start for start, _ in spans) < min(end for _, end in spans), spans


def test_reward_workers_split_a_batch_and_report_one_workers_metrics(pool):
    p, splits = pool
    groups = remote_rollout(p, splits.train[:5], splits.train_prompts[:5], 4, seed=2)
    for g in groups[::2]:  # some right answers, so the rewards (and the merged metrics) are not all zero
        for e in g.episodes[:3]:
            e.completion.text = f"{e.target}"
    metrics = remote_score(p, groups)
    assert 0.0 < metrics["reward/mean"] < 1.0
    split_rewards = [[e.reward for e in g.episodes] for g in groups]
    spans = [h["last_calls"].get("score") for h in p.health()["reward"]]
    scores, want = p.clients("reward")[0].call("score", groups)
    assert split_rewards == [[total for total, *_ in row] for row in scores]
    assert all(spans), "each reward worker scored a shard"
    assert metrics == want


def test_split_evaluation_counts_like_one_generator(pool):
    p, splits = pool
    problems, prompts = splits.eval[:8], splits.eval_prompts[:8]
    split = remote_evaluate(p, problems, prompts, samples=3)
    one = p.clients("generator")[0].call("evaluate", problems, prompts, 3)
    for key in ("eval/accuracy", "eval/sampled_accuracy"):
        assert split[key] == one[key]
    assert all("evaluate" in h["last_calls"] for h in p.health()["generator"])


def test_shared_memory_weight_store_feeds_both_replicas(tmp_path):
    from tests.integration.pool_helpers import run_pool_iteration

    cfg = tiny_config("local", **{"generator.num_replicas": 2, "weightsync.backend": "shared"})
    with WorkerPool(cfg, tmp_path / "shared-run") as p:
        splits = tiny_splits(cfg)
        for step in range(2):
            assert run_pool_iteration(p, splits, 4, 2, step=step)["policy_version"] == step + 1
        assert [h["policy_version"] for h in p.health()["generator"]] == [2, 2]
        assert {path.name for path in Path(p.store_root).iterdir()} >= {"slot-0.bin", "slot-1.bin", "LATEST"}
    assert not Path(p.store_root).exists()  # RAM-backed: freed with the pool
