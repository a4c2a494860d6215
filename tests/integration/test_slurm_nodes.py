"""Runs across the two Slurm nodes `make services` starts (infra/slurm/setup_cluster.sh --nodes 2: each node a network
namespace with its own host name, address, /dev/shm and slurmd; Slurm's own accounting in MariaDB): roles placed
on both nodes, a trainer with one rank per node, a node whose plug is pulled mid-step, and a network partition."""

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from flows.grpo import grpo_flow
from infra.registry import repo, session_scope
from infra.tracking import default_tracking_uri
from infra.weightsync import FSWeightStore
from tests.integration.conftest import SETUP
from tests.integration.fault_helpers import act_in_step, wait_until
from tests.integration.pool_helpers import (
    alternating_reward_groups,
    run_pool_iteration,
    tiny_config,
    tiny_splits,
)
from tests.integration.test_faults import RUN, assert_records_complete, uninterrupted_sha
from tests.integration.test_grpo_flow import flow_run_view
from workers.pool import WorkerPool
from workers.protocol import pid_alive, read_rendezvous

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

TWO_NODES = {**RUN, "launcher": "slurm", "slurm.nodes": 2, "slurm.cpus_per_task": 1}


@pytest.fixture(scope="module")
def one_machine_sha():
    """state_sha256 of the same run uninterrupted with local workers on one machine."""
    return uninterrupted_sha("on-policy")


def slurm(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout


def sacct_state(job_id: str) -> str:
    """The job's state in Slurm's accounting database (sacct, not the controller)."""
    rows = slurm("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State").split()
    return rows[0] if rows else ""


def node_pids(node: str) -> list[int]:
    return [int(p) for p in slurm("ip", "netns", "pids", node).split()]


def bring_nodes_back() -> None:
    """Start the slurmd of a node whose plug was pulled, bring a cut link up, and wait until both nodes are idle."""
    for link in ("ffv1", "ffv2"):
        subprocess.run(["ip", "link", "set", link, "up"], check=True)
    out = subprocess.run([str(SETUP), "--nodes", "2"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def run_workers(run_id: str) -> dict[str, tuple[str, str]]:
    """worker name → (node, job id) as the registry holds them."""
    with session_scope() as s:
        return {w.name: (w.host, w.job_id) for w in repo.get_run(s, run_id).workers}


def test_the_cluster_has_two_nodes_and_slurms_own_accounting(slurm_cluster):
    nodes = dict(line.split() for line in slurm("sinfo", "-h", "-N", "-o", "%N %t").splitlines())
    assert set(nodes) == {"ff-node1", "ff-node2"} and set(nodes.values()) <= {"idle", "mix", "alloc"}, nodes
    assert "forgeflow" in slurm("sacctmgr", "-n", "-P", "list", "cluster", "format=cluster").split()
    job = slurm("sbatch", "--parsable", "-w", "ff-node2", "-o", "/dev/null", "--wrap",
                "test $(hostname) = ff-node2 && ip -4 -o addr show eth0 | grep -q 10.77.77.12").strip()
    wait_until(lambda: sacct_state(job) in ("COMPLETED", "FAILED"), f"job {job} in sacct")
    assert sacct_state(job) == "COMPLETED"  # ran inside node 2's namespace, under its name and address
    assert slurm("sacct", "-n", "-X", "-P", "-j", job, "-o", "NodeList").strip() == "ff-node2"


def test_a_trainer_with_one_rank_per_node_equals_one_process(slurm_cluster, tmp_path):
    """trainer.procs 2 placed on nodes [0, 1]: FSDP2 over gloo between the namespaces, the same step as one
    process (the tolerance of tests/integration/test_trainer_fsdp.py)."""
    groups = alternating_reward_groups(tiny_config("local"))
    two_nodes = {"trainer.procs": 2, "slurm.nodes": 2, "slurm.placement": {"trainer": [0, 1]},
                 "slurm.cpus_per_task": 1, "slurm.time": "00:30:00"}
    metrics, weights = {}, {}
    for name, launcher, layout in (("one", "local", {}), ("two", "slurm", two_nodes)):
        cfg = tiny_config(launcher, **{"trainer.lr": 1e-4, "trainer.max_norm": 0.5, "trainer.micro_batch_size": 8,
                                      "workers.call_timeout_s": 120, **layout})
        with WorkerPool(cfg, tmp_path / name, roles=("trainer",)) as pool:
            metrics[name] = pool.call("trainer", "train", 0, groups)
            weights[name] = FSWeightStore(pool.store_root).fetch(1)[1]
            job = str(pool.members["trainer"][0].job.job_id)
        if name == "two":  # the weights go to the shared disk: each node has its own /dev/shm
            assert "/dev/shm" not in pool.store_root
            assert slurm("sacct", "-n", "-X", "-P", "-j", job, "-o", "NodeList").strip() == "ff-node[1-2]"
    assert metrics["one"]["loss/loss"] == pytest.approx(metrics["two"]["loss/loss"], abs=1e-5)
    assert metrics["one"]["loss/grad_norm"] == pytest.approx(metrics["two"]["loss/grad_norm"], rel=1e-5)
    assert max((weights["one"][k] - weights["two"][k]).abs().max().item() for k in weights["one"]) < 1e-5


@pytest.mark.parametrize("sync", ["fs", "broadcast"])
def test_roles_run_on_the_nodes_the_plan_names(slurm_cluster, tmp_path, sync):
    cfg = tiny_config("slurm", **{"slurm.nodes": 2, "slurm.cpus_per_task": 1, "slurm.time": "00:30:00",
                                  "weightsync.backend": sync})
    splits = tiny_splits(cfg)
    with WorkerPool(cfg, tmp_path / "run") as pool:
        nodes = {role: {m.client.last_health["node"] for m in members} for role, members in pool.members.items()}
        assert nodes == {"trainer": {"ff-node1"}, "generator": {"ff-node2"}, "reward": {"ff-node2"}}
        assert {m.client.rendezvous.host for m in pool.members["trainer"]} == {"ff-node1"}  # advertised name
        for step in range(2):  # weights cross the bridge: the fs store on the shared disk, or gloo broadcast
            m = run_pool_iteration(pool, splits, 4, 4, step=step)
            assert m["policy_version"] == step + 1 and "weights/publish_failed" not in m
        assert pool.health()["generator"][0]["policy_version"] == 2


def pull_plug_when(monkeypatch, node: str, after_step: int, cut: list, partition_s: float = 0.0) -> threading.Thread:
    """In a thread, at a random moment of the step after `after_step`: kill every process of `node`'s namespace,
    slurmd included (partition_s 0), or take its link down for `partition_s` seconds. `cut` receives (the time, the
    pids of the node's forgeflow workers before, and each of those workers' exit time)."""
    link = "ffv" + node[-1]

    def pull(run: Path) -> None:
        workers = [read_rendezvous(p) for p in (run / "workers").glob("*.rendezvous.json")]
        mine = {rv.role: rv.pid for rv in workers if rv is not None and rv.host == node and pid_alive(rv.pid)}
        cut.append({"at": time.time(), "workers": mine})
        if partition_s:
            subprocess.run(["ip", "link", "set", link, "down"], check=True)
        else:
            subprocess.run(["kill", "-9", *map(str, node_pids(node))], check=True)

    def heal() -> None:  # the run goes on meanwhile; note when each cut-off worker exits by itself
        exits = {}
        while time.time() - cut[-1]["at"] < partition_s:
            exits |= {role: time.time() for role, pid in cut[-1]["workers"].items()
                      if role not in exits and not pid_alive(pid)}
            time.sleep(0.1)
        cut[-1]["exits"] = exits
        subprocess.run(["ip", "link", "set", link, "up"], check=True)

    return act_in_step(monkeypatch, after_step, pull, then=heal if partition_s else None)


def test_a_node_pulled_mid_step_is_replaced_on_the_other_and_the_run_ends_exact(slurm_cluster_alone, one_machine_sha,
                                                                                monkeypatch):
    """Node 2 (generator and reward) loses every process, slurmd included: slurmctld marks it DOWN, its jobs end
    NODE_FAIL in sacct, forgeflow moves both roles to node 1 and the run ends bit-identical to the one on one
    machine."""
    cut = []
    thread = pull_plug_when(monkeypatch, "ff-node2", after_step=2, cut=cut)
    try:
        summary = grpo_flow(overrides={**TWO_NODES, "workers.heartbeat_stale_s": 8}, run_name="pulled-plug")
        monkeypatch.undo()
        thread.join(timeout=60)
        check_pulled_plug(summary, cut, one_machine_sha)
    finally:
        bring_nodes_back()


def check_pulled_plug(summary: dict, cut: list, one_machine_sha: str) -> None:
    print(f"plug pulled at {cut[0]['at']:.1f}: recoveries {summary['recoveries']}")  # measured in the closing note
    assert cut and set(cut[0]["workers"]) == {"generator", "reward"}, cut
    recoveries = {r["role"]: r for r in summary["recoveries"]}
    assert set(recoveries) == {"generator", "reward"}, summary["recoveries"]
    for r in recoveries.values():  # the message names the node, what Slurm said, and where the role went
        assert "on ff-node2 (" in r["slurm"] and "job state" in r["slurm"] and r["slurm"].endswith("ff-node1")
    info = assert_records_complete(summary["run_id"], one_machine_sha)
    workers = run_workers(summary["run_id"])
    assert {workers[n][0] for n in ("generator-0", "reward-0")} == {"ff-node1"}  # the replacements
    lost_jobs = [r["slurm"].split()[2] for r in recoveries.values()]
    wait_until(lambda: sinfo_state("ff-node2").startswith("down"), "Slurm marking node 2 DOWN", 120)
    for job in lost_jobs:
        wait_until(lambda job=job: sacct_state(job) == "NODE_FAIL", f"job {job} NODE_FAIL in sacct")
    tags = MlflowClient(default_tracking_uri()).get_run(info["mlflow_run_id"]).data.tags
    assert tags["worker/generator-0"].startswith("ff-node1") and tags["worker/trainer-0"].startswith("ff-node1")
    artifacts = flow_run_view(summary["flow_run_id"])[2]  # the Prefect UI's table, rewritten after the recovery
    table = next(data for key, data in artifacts.items() if key and key.endswith("-workers"))
    table = json.loads(table) if isinstance(table, str) else table
    assert {row["worker"]: row["node"] for row in table} == {"trainer-0": "ff-node1", "generator-0": "ff-node1",
                                                             "reward-0": "ff-node1"}


def sinfo_state(node: str) -> str:
    return slurm("sinfo", "-h", "-n", node, "-o", "%t").strip()


def test_a_partitioned_node_is_replaced_after_its_workers_exit_and_the_run_ends_exact(slurm_cluster_alone,
                                                                                      one_machine_sha,
                                                                                      monkeypatch):
    """Node 1's link (the trainer's) is down for 25 s, longer than workers.heartbeat_stale_s (8 s) and Slurm's
    SlurmdTimeout (10 s): the cut-off trainer exits by itself (its orphan guard), the controller replaces it on
    node 2 only after that, and the run ends bit-identical. Node 1 returns to service when the link is back."""
    cut = []
    thread = pull_plug_when(monkeypatch, "ff-node1", after_step=2, cut=cut, partition_s=25.0)
    try:
        summary = grpo_flow(overrides={**TWO_NODES, "workers.heartbeat_stale_s": 8}, run_name="partition")
    finally:
        monkeypatch.undo()
        thread.join(timeout=60)
    print(f"link cut at {cut[0]['at']:.1f}: {cut[0]}; recoveries {summary['recoveries']}")
    assert cut and set(cut[0]["workers"]) == {"trainer"} and "trainer" in cut[0]["exits"], cut
    assert [r["role"] for r in summary["recoveries"]] == ["trainer"], summary["recoveries"]
    assert "on ff-node1 (" in summary["recoveries"][0]["slurm"]
    assert_records_complete(summary["run_id"], one_machine_sha)
    run = summary["checkpoint"].split("/checkpoints/")[0]
    launches = sorted(Path(run, "workers").glob("trainer-0.*.rendezvous.json"),
                      key=lambda p: p.stat().st_mtime)
    replacement = read_rendezvous(launches[-1])
    assert replacement.host == "ff-node2"
    # no role ran twice: the old trainer was gone before its replacement served
    assert cut[0]["exits"]["trainer"] < launches[-1].stat().st_mtime
    wait_until(lambda: sinfo_state("ff-node1") in ("idle", "mix", "alloc"), "node 1 back in service")


def test_with_on_node_loss_wait_a_lost_nodes_role_waits_for_it_to_return(slurm_cluster_alone, tmp_path):
    """slurm.on_node_loss wait: the generator's replacement stays PENDING on its node while the node is DOWN, and
    runs there once the node is back."""
    cfg = tiny_config("slurm", **{"slurm.nodes": 2, "slurm.cpus_per_task": 1, "slurm.time": "00:30:00",
                                  "slurm.on_node_loss": "wait", "workers.heartbeat_stale_s": 5})
    splits = tiny_splits(cfg)
    try:
        with WorkerPool(cfg, tmp_path / "run") as pool:
            run_pool_iteration(pool, splits, 4, 4, step=0)
            subprocess.run(["kill", "-9", *map(str, node_pids("ff-node2"))], check=True)
            lost_job = str(pool.members["generator"][0].job.job_id)
            restart = threading.Thread(target=pool.restart, args=("generator",))
            restart.start()
            wait_until(lambda: pool.members["generator"][0].job.job_id != lost_job, "the replacement submitted", 120)
            new_job = str(pool.members["generator"][0].job.job_id)
            wait_until(lambda: slurm("squeue", "-h", "-j", new_job, "-o", "%T %N").split() == ["PENDING"],
                       "the replacement pending", 60)
            assert sinfo_state("ff-node2").endswith("*") or sinfo_state("ff-node2").startswith("down")
            bring_nodes_back()
            restart.join(timeout=300)
            assert pool.members["generator"][0].client.last_health["node"] == "ff-node2"
            assert pool.call("trainer", "health")["step"] == 1  # the trainer on node 1 never stopped
    finally:
        bring_nodes_back()
