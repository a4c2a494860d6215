"""torch.distributed stores bind before they are used, and only loopback when every member is on this host."""

import socket
from datetime import timedelta

import pytest
import torch

from infra.dist_store import MasterStore, bind_listen_socket, connect_store
from infra.weightsync.broadcast import BroadcastWeightSync, form_weight_group


def non_loopback_address() -> str | None:
    """An address of this machine other than loopback (the one its default route leaves from), if any."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for a UDP connect
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


def reachable(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.fixture
def outside_address():
    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    return address


def test_job_store_on_loopback_is_unreachable_from_other_interfaces(outside_address):
    master = MasterStore("127.0.0.1", 1, timeout_s=10)
    assert master.address == f"127.0.0.1:{master.port}"
    master.store.set("k", "v")
    assert reachable("127.0.0.1", master.port) and not reachable(outside_address, master.port)


def test_weight_broadcast_store_in_local_mode_is_unreachable_from_other_interfaces(outside_address):
    group = BroadcastWeightSync("127.0.0.1:0", 0, 2, timeout_s=10)
    port = int(group.address.rpartition(":")[2])
    assert reachable("127.0.0.1", port) and not reachable(outside_address, port)


def test_a_non_loopback_host_binds_every_interface(outside_address):
    sock = bind_listen_socket(socket.gethostname())
    try:
        assert reachable(outside_address, sock.getsockname()[1])
    finally:
        sock.close()


def test_a_store_bound_on_every_interface_advertises_the_node_name():
    """Other nodes connect to the published address: 0.0.0.0 would send them to themselves."""
    master = MasterStore("0.0.0.0", 1, 10)
    assert master.address == f"{socket.gethostname()}:{master.port}"
    assert MasterStore("127.0.0.1", 1, 10).address.startswith("127.0.0.1:")


def test_a_weight_group_member_that_never_takes_part_fails_the_publish_after_the_configured_timeout():
    """A stalled generator must make publish raise after weightsync's timeout, not hang for the backend's default
    (gloo: 30 min). The group is formed by the code that forms the NCCL one on GPUs (form_weight_group); NCCL's own
    options are checked in tests/gpu, as this CPU build has no NCCL."""
    trainer = BroadcastWeightSync("127.0.0.1:0", 0, 2, timeout_s=3)
    # rank 1 joins the group and then never takes part in a collective
    silent = form_weight_group(connect_store(trainer.address, 2, 60), 1, 2, timedelta(seconds=600), torch.device("cpu"))
    assert trainer.wait_formed() and silent.size() == 2
    assert trainer.group.options._timeout == timedelta(seconds=3)
    with pytest.raises(RuntimeError, match="3000ms"):  # gloo's error names the wait it gave up after
        trainer.publish(1, {"w": torch.ones(4)})
