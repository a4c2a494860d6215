"""Real submitit LocalExecutor worker processes: start, serve a GRPO iteration, die, restart, clean up."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.integration.pool_helpers import run_pool_iteration, tiny_config, tiny_splits
from workers.pool import WorkerPool
from workers.protocol import WorkerLost, pid_alive
from workers.remote import remote_rollout

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    cfg = tiny_config("local", **{"generator.num_replicas": 2})
    with WorkerPool(cfg, tmp_path_factory.mktemp("run") / "pool-run") as p:
        yield p, tiny_splits(cfg)


def test_health_reports_identity(pool):
    p, _ = pool
    health = p.health()
    assert set(health) == {"trainer", "generator", "reward"} and len(health["generator"]) == 2
    for role, answers in health.items():
        for h in answers:
            assert h["role"] == role and h["pid"] != os.getpid() and h["host"] and "step" in h
            assert h["threads"] == 1


def test_two_iterations_move_the_policy_version(pool):
    p, splits = pool
    for step in range(2):
        m = run_pool_iteration(p, splits, 6, 4, step=step)
        assert m["policy_version"] == step + 1
        assert m["rollout/policy_version"] == step  # rollouts were sampled by the previous version
        assert 0.0 <= m["reward/mean"] <= 1.0 and m["rollout/num_episodes"] == 24
    assert [h["policy_version"] for h in p.health()["generator"]] == [2, 2]
    groups = remote_rollout(p, splits.train[:3], splits.train_prompts[:3], 2, seed=1)
    assert [g.prompt for g in groups] == splits.train_prompts[:3]  # order kept across replicas
    assert {e.completion.policy_version for g in groups for e in g.episodes} == {2}


def test_authkey_is_not_in_specs_or_logs(pool):
    p, _ = pool
    key = p.key_path.read_bytes()
    assert oct(p.key_path.stat().st_mode)[-3:] == "600"
    for path in p.workers_dir.rglob("*"):
        if path.is_file() and path != p.key_path:
            assert key not in path.read_bytes(), f"authkey leaked into {path}"


def test_sigkilled_worker_is_lost_then_restarted(pool):
    p, splits = pool
    victim = p.clients("generator")[0]
    pid = victim.call("health")["pid"]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerLost) as info:
        victim.call("rollout", splits.train[:2], splits.train_prompts[:2], 2, 0)
    assert "generator-0" in str(info.value) and info.value.last_health.get("pid") == pid
    p.restart("generator")
    fresh = [c.call("health")["pid"] for c in p.clients("generator")]
    assert pid not in fresh and all(pid_alive(x) for x in fresh)


def test_failed_start_shows_the_worker_stderr(tmp_path):
    broken = tmp_path / "not-a-model"  # exists (passes the config check) but holds no model: fails in the worker
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    cfg = tiny_config("local", **{"model.path": str(broken)})
    with pytest.raises(RuntimeError, match="exited during start-up") as info:
        with WorkerPool(cfg, tmp_path / "bad-run"):
            pass
    assert "not-a-model" in str(info.value)


CONTROLLER = textwrap.dedent("""
    import sys, time
    from workers.pool import WorkerPool
    from tests.integration.pool_helpers import tiny_config
    pool = WorkerPool(tiny_config("local"), sys.argv[1])
    pool.start()
    print(" ".join(str(c.call("health")["pid"]) for r in pool.members for c in pool.clients(r)), flush=True)
    time.sleep(600)
""")


def test_killed_controller_leaves_no_orphans(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(tmp_path / "orphan-run")], stdout=subprocess.PIPE,
                            text=True, cwd=os.getcwd())
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) == 3 and all(pid_alive(x) for x in pids)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 30
        while any(pid_alive(x) for x in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(pid_alive(x) for x in pids), "workers outlived their controller"
    finally:
        proc.kill()


def test_a_late_rendezvous_from_an_earlier_launch_is_never_used(tmp_path):
    # a worker of an earlier launch of the same run (orphaned by a killed controller, or still starting when that
    # pool start failed) can write its rendezvous after the next launch began; the new pool must not take it
    import threading

    from workers.protocol import Rendezvous, write_rendezvous

    cfg = tiny_config("local")
    with WorkerPool(cfg, tmp_path / "run", roles=("reward",)) as first:
        earlier = first.members["reward"][0].spec.rendezvous
    stop = threading.Event()

    def late_writer():  # the earlier launch's worker, pointing at a port nobody serves
        while not stop.is_set():
            write_rendezvous(Path(earlier), Rendezvous("reward", "127.0.0.1", 9, 999999))
            time.sleep(0.01)

    writer = threading.Thread(target=late_writer, daemon=True)
    writer.start()
    try:
        with WorkerPool(cfg, tmp_path / "run", roles=("reward",)) as second:
            assert second.members["reward"][0].spec.rendezvous != earlier
            assert second.health()["reward"][0]["pid"] != 999999
    finally:
        stop.set()
        writer.join()
