"""torch.distributed rendezvous stores that bind where they should and never race for a port.

A `TCPStore` master given a port number binds it later than whoever chose it, so a port picked at random (submitit's
MASTER_PORT) or probed free can be taken in between by any outgoing connection's ephemeral port: `EADDRINUSE`, and
the worker never comes up. Here the master's socket is bound first, on port 0 (the kernel picks a free one), and
handed to the store (`master_listen_fd`). It binds the loopback interface when every member is on this host, all
interfaces only when other nodes must reach it (TCPStore has no authentication: keep it off the network when it can
be). Members of a multi-task job learn the master's address from a file on the shared run directory.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from datetime import timedelta
from pathlib import Path

log = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
_LIVE_MASTERS: list = []  # a master's listening socket must live as long as its process group


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine's loopback interface (members on one host only)."""
    return host in LOOPBACK


def advertised_host(bind_host: str) -> str:
    """The name other members connect to: the loopback address itself, else this node's host name (a socket bound
    on all interfaces, 0.0.0.0, cannot be reached at that address from another node)."""
    return socket.gethostname() if bind_host in ("", "0.0.0.0") else bind_host


def bind_listen_socket(host: str) -> socket.socket:
    """A listening TCP socket on a free port: on loopback for a loopback `host`, on every interface otherwise."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1" if is_loopback(host) else "", 0))
    sock.listen(512)
    return sock


class MasterStore:
    """The master side of a TCPStore on a port that is already bound (keeps its socket alive with the store)."""

    def __init__(self, host: str, world_size: int, timeout_s: float):
        import torch.distributed as dist

        self.socket = bind_listen_socket(host)
        self.port = self.socket.getsockname()[1]
        self.host = advertised_host(host)
        self.store = dist.TCPStore(self.host, self.port, world_size, is_master=True,
                                   timeout=timedelta(seconds=timeout_s), wait_for_workers=False,
                                   master_listen_fd=self.socket.fileno())

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def connect_store(address: str, world_size: int, timeout_s: float):
    """The client side of the TCPStore at HOST:PORT (retries until the master is up, up to `timeout_s`)."""
    import torch.distributed as dist

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"store address {address!r} must be HOST:PORT")
    return dist.TCPStore(host, int(port), world_size, is_master=False, timeout=timedelta(seconds=timeout_s))


def publish_address(path: Path, address: str) -> None:
    """Write the master's HOST:PORT atomically for the other members of the job."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps({"address": address}))
    os.replace(tmp, path)


def await_address(path: Path, timeout_s: float, poll_s: float = 0.1) -> str:
    """The HOST:PORT rank 0 published at `path`; TimeoutError naming the file when it never appears."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return json.loads(path.read_text())["address"]
        except FileNotFoundError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 of this job did not publish its store address at {path} within "
                               f"{timeout_s:.0f}s: check rank 0's log in the job folder")
        time.sleep(poll_s)


def init_job_process_group(rank: int, world_size: int, bind_host: str, address_file: Path,
                           timeout_s: float = 600.0) -> None:
    """Form this job's default process group (NCCL on GPUs, gloo on CPU) over a store bound as above."""
    import torch
    import torch.distributed as dist

    if rank == 0:
        master = MasterStore(bind_host, world_size, timeout_s)
        publish_address(address_file, master.address)
        store = master.store
        _LIVE_MASTERS.append(master)
    else:
        store = connect_store(await_address(address_file, timeout_s), world_size, timeout_s)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
    log.info("process group of %d formed (%s, rank %d)", world_size, backend, rank)


def close_job_process_group() -> None:
    """Tear the job's process group down before the interpreter exits (left to teardown, gloo's threads and the
    store can abort the process: "terminate called without an active exception")."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    _LIVE_MASTERS.clear()
