"""The worker pool on the real Slurm cluster of the tests (infra/slurm/setup_cluster.sh --nodes 2), one node per job
wherever Slurm puts it (placement over both: tests/integration/test_slurm_nodes.py)."""

import subprocess
import time

import pytest

from tests.integration.pool_helpers import run_pool_iteration, tiny_config, tiny_splits
from workers.pool import WorkerPool
from workers.protocol import WorkerLost

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


@pytest.mark.parametrize("sync", ["fs", "broadcast"])
def test_slurm_pool_runs_two_iterations_and_sees_scancel(slurm_cluster, tmp_path, sync):
    # broadcast: the trainer's job hosts the weight group on its node's name; a new trainer hosts a new one
    cfg = tiny_config("slurm", **{"slurm.cpus_per_task": 1, "slurm.time": "00:30:00", "weightsync.backend": sync})
    splits = tiny_splits(cfg)
    with WorkerPool(cfg, tmp_path / "slurm-run") as pool:
        jobs = {role: [m.job.job_id for m in members] for role, members in pool.members.items()}
        queue = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True).stdout
        for ids in jobs.values():
            assert all(f"{i} RUNNING" in queue for i in ids), queue
        for step in range(2):
            m = run_pool_iteration(pool, splits, 4, 4, step=step)
            assert m["policy_version"] == step + 1 and m["rollout/policy_version"] == step
        subprocess.run(["scancel", jobs["trainer"][0]], check=True)
        t0 = time.monotonic()
        with pytest.raises(WorkerLost, match="trainer-0") as info:
            while time.monotonic() - t0 < 120:  # a liveness guard: SLURM ends the job asynchronously
                pool.call("trainer", "health")
                time.sleep(0.1)
        assert info.value.job_id == str(jobs["trainer"][0])
        pool.restart("trainer")
        assert pool.call("trainer", "health")["policy_version"] == 0
        m = run_pool_iteration(pool, splits, 4, 4, step=0)
        assert m["policy_version"] == 1 and "weights/publish_failed" not in m
        assert pool.health()["generator"][0]["policy_version"] == 1  # reached the generator (new group with broadcast)
