"""weightsync.backend broadcast through the WorkerPool (real submitit local processes, gloo): the trainer hosts the
group, both generators join; weights arrive exactly as through the fs store; a killed generator or trainer is
replaced and the group re-formed, with the trainer's current version republished."""

import os
import signal

import pytest

from tasks.context import RunContext
from tasks.recovery import recover_role
from tests.integration.pool_helpers import run_pool_iteration, tiny_config, tiny_splits
from workers.pool import WorkerPool
from workers.protocol import WorkerLost
from workers.remote import RemoteRewardScorer, RemoteTrainer, remote_rollout, remote_sync

pytestmark = pytest.mark.integration

BROADCAST = {"generator.num_replicas": 2, "weightsync.backend": "broadcast"}


def two_iterations_and_a_sample(pool, splits) -> tuple[list[dict], list[list[int]]]:
    """Metrics of two iterations (the second trains on samples of version 1) and the tokens version 2 samples."""
    metrics = [run_pool_iteration(pool, splits, 6, 4, step=s)
               for s in range(2)]
    groups = remote_rollout(pool, splits.train[:4], splits.train_prompts[:4], 2, seed=7)
    untimed = [{k: v for k, v in m.items() if not k.startswith("timing/") and "per_s" not in k} for m in metrics]
    return untimed, [e.completion.token_ids for g in groups for e in g.episodes]


@pytest.fixture(scope="module")
def broadcast_run(tmp_path_factory):
    cfg = tiny_config("local", **BROADCAST)
    out = tmp_path_factory.mktemp("broadcast") / "run"
    with WorkerPool(cfg, out) as pool:
        yield RunContext("broadcast-run", cfg, pool, tiny_splits(cfg), out)


def test_generators_get_the_same_weights_as_through_the_fs_store(broadcast_run, tmp_path):
    ctx = broadcast_run
    got = two_iterations_and_a_sample(ctx.pool, ctx.splits)
    assert [h["policy_version"] for h in ctx.pool.health()["generator"]] == [2, 2]
    assert not list(ctx.pool.workers_dir.parent.glob("**/*.safetensors")), "broadcast wrote weight files"
    cfg = tiny_config("local", **{"generator.num_replicas": 2})
    with WorkerPool(cfg, tmp_path / "fs-run") as fs_pool:
        expected = two_iterations_and_a_sample(fs_pool, ctx.splits)
    assert got[1] == expected[1]  # version 2 reached both generators bit-exact: same samples
    assert got[0] == [pytest.approx(m, rel=1e-6, abs=1e-7) for m in expected[0]]


def test_a_killed_generator_is_replaced_and_the_group_re_formed(broadcast_run):
    ctx, splits = broadcast_run, broadcast_run.splits
    pool = ctx.pool
    step = pool.call("trainer", "health")["step"]
    groups = remote_rollout(pool, splits.train[:4], splits.train_prompts[:4], 4, seed=1)
    RemoteRewardScorer(pool).score(step, groups)
    victim = pool.clients("generator")[1].call("health")["pid"]
    os.kill(victim, signal.SIGKILL)
    metrics = RemoteTrainer(pool, ctx.checkpoint_dir).train(step, groups)  # the step trains; the broadcast to the dead member fails
    assert metrics["weights/publish_failed"] == 1.0 and metrics["policy_version"] == step + 1
    with pytest.raises(WorkerLost, match="generator-1"):
        remote_sync(pool, step + 1)  # finds the dead generator instead of waiting for a version that cannot come
    assert recover_role(ctx, "generator", reason="killed") == step + 1
    generators = pool.health()["generator"]
    assert victim not in [h["pid"] for h in generators]
    assert [h["policy_version"] for h in generators] == [step + 1, step + 1]
    m = run_pool_iteration(pool, splits, 4, 4, step=step + 1)
    assert "weights/publish_failed" not in m and m["rollout/policy_version"] == step + 1
    assert [h["policy_version"] for h in pool.health()["generator"]] == [step + 2, step + 2]


def test_a_killed_trainer_hosts_a_new_group(broadcast_run):
    ctx, splits = broadcast_run, broadcast_run.splits
    pool = ctx.pool
    os.kill(pool.clients("trainer")[0].call("health")["pid"], signal.SIGKILL)
    with pytest.raises(WorkerLost, match="trainer"):
        pool.call("trainer", "health")
    assert recover_role(ctx, "trainer", reason="killed") == 0  # no checkpoint: back to the initial weights
    assert [h["policy_version"] for h in pool.health()["generator"]] == [0, 0]
    m = run_pool_iteration(pool, splits, 4, 4, step=0)
    assert m["policy_version"] == 1 and "weights/publish_failed" not in m
    assert [h["policy_version"] for h in pool.health()["generator"]] == [1, 1]


def test_a_group_a_member_could_not_join_is_formed_again(tmp_path, monkeypatch):
    """A generator whose gloo connections fail reports it at once, and the pool forms a fresh group (new store,
    new port) instead of waiting workers.call_timeout_s for the member that never comes. Inline workers: the
    failure is injected into this process's first receiver."""
    from infra.weightsync.broadcast import BroadcastWeightSync

    real_run, failed = BroadcastWeightSync._run, []

    def refused_once(self):
        if self.rank > 0 and not failed:
            failed.append(self.address)
            self._fail(ConnectionRefusedError("injected: gloo connectFullMesh refused"), "could not form")
            self._formed.set()
            return
        real_run(self)

    monkeypatch.setattr(BroadcastWeightSync, "_run", refused_once)
    cfg = tiny_config("inline", **{"weightsync.backend": "broadcast", "workers.call_timeout_s": 600})
    with WorkerPool(cfg, tmp_path / "run", roles=("trainer", "generator")) as pool:
        assert len(failed) == 1
        assert pool.call("trainer", "publish_weights", 1) == 1
        assert pool.call_all("generator", "load_weights", 1) == [1]
