"""Placing roles over Slurm nodes (slurm.placement, slurm.on_node_loss), the sbatch options a worker job gets, Slurm's
verdict on a lost job, and the network liveness that catches a partition (controller pings, the worker's own
silence limit). The real cluster: tests/integration/test_slurm_nodes.py."""

import threading
import time

import pytest

from infra import components as C
from infra.config_checks import load_config
from infra.launcher.executors import make_executor
from infra.launcher.slurm_nodes import JobVerdict
from tests.unit.test_worker_channel import EchoWorker
from workers.client import WorkerClient
from workers.plan import plan_jobs, render_plan
from workers.protocol import SecretKey, new_authkey, read_rendezvous
from workers.server import ContactClock, WorkerServer, watch_controller

TINY = "configs/grpo_math_tiny.yaml"


def placed(**overrides) -> dict[str, tuple]:
    cfg = load_config(TINY, {"launcher": "slurm", **overrides})
    return {j.name: (j.slots, j.nodes, j.tasks_per_node) for j in plan_jobs(cfg, C.needs_reference(cfg))}


def test_two_nodes_put_the_trainer_and_reference_on_one_and_the_rest_on_the_other():
    assert placed(**{"slurm.nodes": 2, "generator.num_replicas": 2}) == {
        "trainer-0": ((0,), 1, 1), "reference-0": ((0,), 1, 1), "generator-0": ((1,), 1, 1),
        "generator-1": ((1,), 1, 1), "reward-0": ((1,), 1, 1)}
    three = placed(**{"slurm.nodes": 3, "generator.num_replicas": 2})
    assert three["generator-0"][0] == (1,) and three["generator-1"][0] == (2,)  # replicas round-robin
    assert all(slots == () for slots, _, _ in placed().values())  # one node: Slurm's pick


def test_a_list_spreads_a_roles_ranks_over_nodes_and_the_plan_says_where():
    jobs = placed(**{"slurm.nodes": 2, "trainer.procs": 2, "slurm.placement": {"trainer": [0, 1], "reward": 0}})
    assert jobs["trainer-0"] == ((0, 1), 2, 1) and jobs["reward-0"] == ((0,), 1, 1)
    cfg = load_config(TINY, {"launcher": "slurm", "slurm.nodes": 2})
    text = render_plan(cfg, plan_jobs(cfg, True), TINY)
    assert "trainer-0" in text and "on node 0" in text and "on node 1" in text


@pytest.mark.parametrize("overrides,message", [
    ({"slurm.placement": {"trainer": 2}}, r"slurm.placement.trainer = 2: give a node index 0 … 1"),
    ({"slurm.placement": {"trainer": [0, 0]}}, r"a list of distinct ones"),
    ({"slurm.placement": {"judge": 0}}, r"slurm.placement.judge: no such role"),
    ({"slurm.on_node_loss": "retry"}, r"slurm.on_node_loss = 'retry' is not one of \['move', 'wait'\]"),
])
def test_bad_placement_is_refused_naming_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(TINY, {"launcher": "slurm", "slurm.nodes": 2, **overrides})


def test_ranks_that_do_not_split_over_the_listed_nodes_are_refused():
    with pytest.raises(ValueError, match=r"3 ranks \(trainer.procs\) do not split evenly over 2 nodes"):
        placed(**{"slurm.nodes": 2, "trainer.procs": 3, "slurm.placement": {"trainer": [0, 1]}})


def test_worker_jobs_are_never_requeued_and_carry_their_placement(tmp_path):
    cfg = load_config(TINY, {"launcher": "slurm"})
    ex = make_executor(cfg, tmp_path, name="ff-trainer-0", placement={"nodelist": "ff-node1"})
    script = ex._make_submission_file_text("python -m x", "%j")
    assert "#SBATCH --no-requeue" in script and "#SBATCH --nodelist=ff-node1" in script


def test_a_job_on_a_node_that_stopped_answering_is_a_lost_node():
    alive = JobVerdict("7", "RUNNING", ("ff-node1",), {"ff-node1": "mix"})
    cut = JobVerdict("7", "RUNNING", ("ff-node1", "ff-node2"), {"ff-node1": "mix*", "ff-node2": "idle"})
    down = JobVerdict("7", "NODE_FAIL", ("ff-node2",), {"ff-node2": "down*"})
    assert alive.lost_nodes == () and cut.lost_nodes == ("ff-node1",) and down.lost_nodes == ("ff-node2",)
    assert cut.describe() == "Slurm job 7 on ff-node1 (mix*), ff-node2 (idle), job state RUNNING"


def test_a_worker_unheard_over_the_network_exits_and_the_controller_sees_the_silence(tmp_path):
    key = SecretKey(new_authkey())
    contact, lost = ContactClock(), []
    server = WorkerServer(EchoWorker(), "echo", tmp_path / "echo.json", key, contact=contact)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    while (rv := read_rendezvous(tmp_path / "echo.json")) is None:
        time.sleep(0.02)
    watch_controller(None, None, None, stale_after_s=0.6, on_lost=lost.append, interval_s=0.05, contact=contact)
    client = WorkerClient("echo-0", rv, key)
    assert client.call("ping") is True and contact.age() < 0.5
    client.start_pinging(silent_after_s=1.0, interval_s=0.1)
    time.sleep(1.0)
    assert lost == [] and client.death_reason() is None  # pinged: heard on both sides
    client.stop_pinging()
    time.sleep(1.3)
    assert lost and "no word from the controller over the network" in lost[0]
    assert "no answer to pings" in client.death_reason()
    server.stop.set()


def test_a_lost_worker_is_replaced_only_after_its_lease(monkeypatch):
    """The controller waits until the worker has been unheard for silent_after_s (it exits after a shorter silence)."""
    from workers.protocol import Rendezvous

    slept = []
    monkeypatch.setattr("workers.client.time.sleep", slept.append)
    client = WorkerClient("trainer-0", Rendezvous("trainer", "ff-node1", 1, 1), SecretKey(new_authkey()))
    client.silent_after_s, client.last_contact = 13.0, time.monotonic() - 4.0
    client.await_lease_end()
    assert len(slept) == 1 and 8.5 < slept[0] <= 9.0
    client.last_contact = time.monotonic() - 20.0
    client.await_lease_end()
    assert len(slept) == 1  # past the lease: no wait
    client.last_contact, client.peer_closed = time.monotonic() - 4.0, True
    client.await_lease_end()
    assert len(slept) == 1  # its connection was closed by its kernel: the process is gone, nothing to wait for
