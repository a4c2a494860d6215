"""The function a submitit job runs: build one role's worker and serve it until shutdown.

Everything a worker needs arrives in a `WorkerSpec` except the authkey, which it reads from a 0600 file in the run
directory, so the secret is never pickled into submitit's job folder, put in a config, or logged.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

# before torch: busy-waiting OpenMP threads make processes that share cores many times slower
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from workers.protocol import SecretKey, require_authkey  # noqa: E402

log = logging.getLogger(__name__)

ROLE_CLASSES = {
    "generator": "workers.generator:GeneratorWorker",
    "trainer": "workers.trainer:TrainerWorker",
    "reference": "workers.reference:ReferenceWorker",
    "teacher": "workers.reference:TeacherWorker",
    "reward": "workers.reward:RewardWorker",
    "env": "workers.env:EnvWorker",
}


@dataclass
class WorkerSpec:
    """One worker's launch description (picklable; holds no secret)."""

    role: str
    name: str  # unique per replica, e.g. generator-0
    cfg: dict
    rendezvous: str
    key_path: str
    store_root: str | None = None
    store_backend: str = "fs"
    init_path: str | None = None
    threads: int = 1
    controller_pid: int | None = None
    controller_host: str | None = None
    heartbeat: str | None = None
    heartbeat_stale_s: float = 60.0
    network_liveness: bool = False  # exit also when the controller's pings stop for heartbeat_stale_s (other nodes)
    bind_host: str = "127.0.0.1"
    env: dict = field(default_factory=dict)


def read_authkey(path: str | Path) -> SecretKey:
    """The run's worker key from its 0600 file; an empty file is refused (it would disable authentication)."""
    return SecretKey(require_authkey(Path(path).read_bytes(), f"authkey file {path}"))


def build_worker(spec: WorkerSpec):
    """Instantiate the role's worker class from the spec."""
    import importlib

    from infra.config import config_from_dict
    from infra.weightsync import open_weight_store

    if spec.role not in ROLE_CLASSES:
        raise ValueError(f"unknown worker role {spec.role!r}: choose one of {', '.join(ROLE_CLASSES)}")
    module, cls = ROLE_CLASSES[spec.role].split(":")
    worker_cls = getattr(importlib.import_module(module), cls)
    # broadcast: the pool forms the group once every worker is up (open_weight_group / join_weight_group)
    opens_store = spec.store_root and spec.store_backend != "broadcast"
    store = open_weight_store(spec.store_backend, spec.store_root) if opens_store else None
    return worker_cls(config_from_dict(spec.cfg), store=store, init_path=spec.init_path, threads=spec.threads)


def run_worker(spec: WorkerSpec) -> int:
    """Entry point of a worker job (every task of the job calls it; rank 0 serves, others follow)."""
    os.environ.update(spec.env)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s [{spec.name}] %(name)s: %(message)s")
    exit_on_sigterm(spec.name)
    rank, world = init_distributed(spec)
    from workers.server import ContactClock, WorkerServer, watch_controller

    contact = ContactClock()
    watch_controller(spec.controller_pid, spec.controller_host,
                     Path(spec.heartbeat) if spec.heartbeat else None, spec.heartbeat_stale_s,
                     contact=contact if spec.network_liveness and rank == 0 else None)
    worker = build_worker(spec)
    log.info("%s built on %s (pid %d, rank %d/%d)", spec.name, socket.gethostname(), os.getpid(), rank, world)
    try:
        if rank > 0:
            worker.follow()
        else:
            WorkerServer(worker, spec.role, Path(spec.rendezvous), read_authkey(spec.key_path),
                         spec.bind_host, contact=contact).serve_forever()
    finally:
        if world > 1:
            from infra.dist_store import close_job_process_group

            close_job_process_group()
    return 0


def exit_on_sigterm(name: str) -> None:
    """scancel / preemption sends SIGTERM: stop now (submitit's own handler would ignore it until SIGKILL)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return  # inline launcher: a thread cannot own signals

    def stop(signum, _frame):
        log.warning("%s received signal %d: exiting", name, signum)
        logging.shutdown()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def init_distributed(spec: WorkerSpec) -> tuple[int, int]:
    """(rank, world) of this task; forms the job's process group when the job has several tasks."""
    try:
        import submitit

        env = submitit.JobEnvironment()
        world, job_id = env.num_tasks, env.job_id
    except RuntimeError:  # not inside a submitit job (inline launcher)
        return 0, 1
    if world <= 1:
        return 0, 1
    import torch
    from submitit.helpers import TorchDistributedEnvironment

    from infra.dist_store import init_job_process_group

    # RANK, LOCAL_RANK, WORLD_SIZE for code that reads them; the store is ours (submitit's MASTER_PORT is random)
    env = TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    if torch.cuda.is_available():  # one GPU per rank, before NCCL binds one
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
    address_file = Path(spec.rendezvous).with_name(f"{spec.name}.job{job_id}.store.json")
    init_job_process_group(env.rank, world, spec.bind_host, address_file)
    return env.rank, world
