"""WorkerPool: start every role's workers, wait until healthy, route calls, restart a role, shut all down.

    with WorkerPool(cfg, run_dir, init_path=sft_dir) as pool:
        groups = pool.call("generator", "rollout", problems, prompts, 8, seed)

workers/remote.py puts the role interfaces of forge_core.protocols over a pool; tasks and tests go through those.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from infra.config import RunConfig, config_to_dict, redact_secrets
from infra.launcher import make_executor
from infra.launcher.slurm_nodes import JobVerdict, await_job_verdict, partition_nodes, slurmd_timeout_s
from infra.weightsync import DIRECTORY_BACKENDS, default_store_root, open_weight_store
from workers.client import WorkerClient
from workers.entry import WorkerSpec, run_worker
from workers.plan import RolePlan, check_capacity, plan_jobs, plan_roles, uses_gpu
from workers.protocol import SecretKey, WorkerCallError, WorkerLost, new_authkey, read_rendezvous

log = logging.getLogger(__name__)


@dataclass
class Member:
    """One started worker: its spec, submitit job and client."""

    spec: WorkerSpec
    job: object
    client: WorkerClient | None = None
    started_s: float = 0.0


WEIGHT_GROUP_ATTEMPTS = 3  # a fresh group (new store, new port) per attempt
# a worker cut off from the controller exits after workers.heartbeat_stale_s of silence; the controller declares it
# lost this much later, so that the lost worker is gone before its replacement starts (no role runs twice)
PING_MARGIN_S = 5.0


def await_members(clients: list, patience_s: float, poll_s: float = 1.0) -> None:
    """Until every member of a forming weight-broadcast group says it has formed, asking each in turn for at most
    `poll_s`: a member that could not form raises (WorkerCallError) at once, even while another would still wait
    out the whole rendezvous timeout for it. After `patience_s`, the members left are waited for in full."""
    deadline = time.monotonic() + patience_s
    pending = list(clients)
    while pending and time.monotonic() < deadline:
        pending = [c for c in pending if not c.call("await_weight_group", poll_s)]
    for client in pending:
        client.call("await_weight_group")  # raises the member's own timeout


@dataclass
class WorkerPool:
    cfg: RunConfig
    run_dir: Path
    init_path: str | None = None
    with_reference: bool = False
    roles: tuple[str, ...] | None = None  # start only these roles (default: all the run needs)
    members: dict[str, list[Member]] = field(default_factory=dict)
    node_names: dict[int, str] = field(default_factory=dict)  # slurm.nodes > 1: the plan's node index → Slurm node
    lost_nodes: set[str] = field(default_factory=set)  # nodes that stopped answering (moved away from)
    losses: dict[str, JobVerdict] = field(default_factory=dict)  # worker name → Slurm's verdict on its lost job

    def __post_init__(self):
        self.run_dir = Path(self.run_dir)
        self.workers_dir = self.run_dir / "workers"
        self.workers_dir.mkdir(parents=True, exist_ok=True)
        self.key_path = self.workers_dir / "authkey"
        self._authkey = SecretKey(new_authkey())
        fd = os.open(self.key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(self._authkey)
        self.heartbeat_path = self.workers_dir / "controller.heartbeat"
        self.store_root = self.cfg.weightsync.root or str(
            default_store_root(self.run_dir.name, nodes_share_memory=self.cfg.launcher != "slurm"))
        self._stop = threading.Event()
        self._rr: dict[str, itertools.cycle] = {}
        self.startup_s: dict[str, float] = {}

    # ---- lifecycle ----

    def __enter__(self) -> WorkerPool:
        try:
            self.start()
        except BaseException:
            self.shutdown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()  # runs on errors and Ctrl-C too

    def start(self) -> None:
        """Submit every role's jobs, then wait until each answers `health`."""
        self._touch_heartbeat()
        if self.cfg.weightsync.backend in DIRECTORY_BACKENDS:  # versions left by an earlier pool are stale
            open_weight_store(self.cfg.weightsync.backend, self.store_root).clear()
        threading.Thread(target=self._heartbeat_loop, daemon=True, name="pool-heartbeat").start()
        check_capacity(self.cfg, plan_jobs(self.cfg, self.with_reference))
        self._assign_nodes()
        for plan in plan_roles(self.cfg, self.with_reference):
            if self.roles is not None and plan.role not in self.roles:
                continue
            self.members[plan.role] = [self._submit(plan, i) for i in range(plan.replicas)]
        for role in self.members:
            self._wait_role(role)
        self._form_weight_group()

    def restart(self, role: str) -> None:
        """Stop and relaunch every worker of `role` (e.g. after WorkerLost)."""
        if role not in self.members:
            raise ValueError(f"no role {role!r} in this pool (have {', '.join(self.members)})")
        plan = next(p for p in plan_roles(self.cfg, self.with_reference) if p.role == role)
        for m in self.members[role]:
            self._stop_member(m)
        self.members[role] = [self._submit(plan, i) for i in range(plan.replicas)]
        self._rr.pop(role, None)
        self._wait_role(role)
        if role in ("trainer", "generator"):
            self._form_weight_group()  # broadcast: the old group lost a member; the caller republishes

    def shutdown(self, grace_s: float = 10.0) -> None:
        """Ask every worker to stop, cancel jobs that do not, stop the heartbeat."""
        for members in self.members.values():
            for m in members:
                self._stop_member(m, grace_s)
        self.members.clear()
        self._stop.set()
        if self.cfg.weightsync.backend in DIRECTORY_BACKENDS and self.cfg.weightsync.root is None:
            shutil.rmtree(self.store_root, ignore_errors=True)  # RAM-backed and rebuilt on restore: free it

    # ---- routing ----

    def clients(self, role: str) -> list[WorkerClient]:
        return [m.client for m in self.members.get(role, []) if m.client is not None]

    def client(self, role: str) -> WorkerClient:
        """The next worker of `role`, round-robin over its replicas."""
        if role not in self._rr:
            if not self.clients(role):
                raise ValueError(f"role {role!r} has no running workers in this pool")
            self._rr[role] = itertools.cycle(self.clients(role))
        return next(self._rr[role])

    def job_ids(self, role: str) -> set[str]:
        """The job ids of `role`'s current workers (a restarted role has new ones)."""
        return {str(m.job.job_id) for m in self.members.get(role, [])}

    def dead_roles(self) -> set[str]:
        """Roles with a worker whose process or job is gone (a node failure takes several at once)."""
        return {role for role, members in self.members.items()
                if any(m.client is None or m.client.death_reason() for m in members)}

    def call(self, role: str, method: str, *args, **kwargs):
        return self.client(role).call(method, *args, **kwargs)

    def call_all(self, role: str, method: str, *args, **kwargs) -> list:
        """`method` on every replica of `role` at once (e.g. load_weights on all generators), in replica order."""
        calls = self.call_each(role, method, {i: args for i in range(len(self.clients(role)))}, **kwargs)
        return [calls[i] for i in sorted(calls)]

    def call_each(self, role: str, method: str, args_by_replica: dict[int, tuple], **kwargs) -> dict[int, object]:
        """`method` on replica i with args_by_replica[i], all replicas at once (a thread each; every worker is its
        own process); {replica: result}. When calls fail, all are waited for, then the lowest replica's error is
        raised (WorkerLost for a dead one, so recovery sees it as from a single call)."""
        clients = self.clients(role)
        if any(not 0 <= i < len(clients) for i in args_by_replica):
            raise ValueError(f"role {role!r} has replicas 0..{len(clients) - 1}; got {sorted(args_by_replica)}")
        if len(args_by_replica) <= 1:
            return {i: clients[i].call(method, *args, **kwargs) for i, args in args_by_replica.items()}
        with ThreadPoolExecutor(len(args_by_replica), thread_name_prefix=f"{role}-{method}") as pool:
            futures = {i: pool.submit(clients[i].call, method, *args, **kwargs)
                       for i, args in sorted(args_by_replica.items())}
        return {i: future.result() for i, future in futures.items()}  # the executor's exit waited for all

    def describe_losses(self, role: str) -> str | None:
        """What Slurm said of `role`'s lost jobs since the last time asked, and where its workers run now (None
        when no job of it was lost on Slurm)."""
        lost = [self.losses.pop(m.spec.name) for m in self.members.get(role, []) if m.spec.name in self.losses]
        if not lost:
            return None
        nodes = sorted({m.client.last_health.get("node") or "?" for m in self.members[role] if m.client})
        return f"{'; '.join(v.describe() for v in lost)}; replaced on {', '.join(nodes)}"

    def health(self) -> dict[str, list[dict]]:
        return {role: self.call_all(role, "health", timeout=30) for role in self.members}

    # ---- internals ----

    def _form_weight_group(self) -> None:
        """weightsync.backend broadcast: the trainer hosts a new weight-broadcast group and every generator joins
        it (rank = replica index + 1); returns once all have joined."""
        if self.cfg.weightsync.backend != "broadcast" or not self.clients("trainer"):
            return
        trainer, generators = self.clients("trainer")[0], self.clients("generator")
        # NCCL when the trainer and the generators hold their models on GPUs, gloo otherwise
        device = "cuda" if uses_gpu(self.cfg, "trainer") and uses_gpu(self.cfg, "generator") else "cpu"
        world = 1 + len(generators)
        for attempt in range(1, WEIGHT_GROUP_ATTEMPTS + 1):
            address = trainer.call("open_weight_group", trainer.rendezvous.host, world, device)
            for rank, client in enumerate(generators, start=1):
                client.call("join_weight_group", address, rank, world, device)
            try:  # a member that could not connect says so at once; the trainer would wait call_timeout_s for it
                await_members(generators, self.cfg.workers.call_timeout_s)
            except WorkerCallError as exc:
                log.warning("weight-broadcast group at %s did not form (attempt %d of %d): %s", address, attempt,
                            WEIGHT_GROUP_ATTEMPTS, str(exc).splitlines()[0])
                if attempt == WEIGHT_GROUP_ATTEMPTS:
                    raise
                continue
            trainer.call("await_weight_group")
            log.info("weight-broadcast group of %d formed at %s (%s)", world, address, device)
            return

    def _submit(self, plan: RolePlan, index: int) -> Member:
        name = f"{plan.role}-{index}"
        # one file per launch: a worker of an earlier launch of this run (orphaned by a killed controller, or still
        # starting when a pool start failed) may write its rendezvous late and must never be taken for this one
        stale_files = [*self.workers_dir.glob(f"{name}.*.rendezvous.json"), *self.workers_dir.glob(f"{name}.job*.store.json")]
        for stale in stale_files:
            stale.unlink(missing_ok=True)
        rendezvous = self.workers_dir / f"{name}.{secrets.token_hex(4)}.rendezvous.json"
        inline = self.cfg.launcher == "inline"
        spec = WorkerSpec(
            role=plan.role, name=name, cfg=worker_config(self.cfg), rendezvous=str(rendezvous),
            key_path=str(self.key_path), store_root=self.store_root, store_backend=self.cfg.weightsync.backend,
            init_path=self.init_path, threads=self.cfg.workers.threads, controller_pid=os.getpid(),
            controller_host=socket.gethostname(), heartbeat=None if inline else str(self.heartbeat_path),
            heartbeat_stale_s=self.cfg.workers.heartbeat_stale_s, network_liveness=self.cfg.launcher == "slurm",
            bind_host="0.0.0.0" if self.cfg.launcher == "slurm" else "127.0.0.1",
            env={"OMP_NUM_THREADS": str(self.cfg.workers.threads)})
        job_plan = next(j for j in plan_jobs(self.cfg, self.with_reference) if j.name == name)
        nodes = self._placement(job_plan)
        executor = make_executor(self.cfg, self.workers_dir / "jobs", tasks=job_plan.tasks_per_node,
                                 gpus=job_plan.gpus_per_node, name=f"ff-{name}", nodes=job_plan.nodes,
                                 devices=job_plan.devices, placement=nodes)
        job = executor.submit(run_worker, spec)
        log.info("submitted %s as job %s (%s launcher, %d proc%s)", name, job.job_id, self.cfg.launcher, plan.procs,
                 "".join(f", {k} {v}" for k, v in nodes.items()))
        return Member(spec, job, started_s=time.monotonic())

    def _wait_role(self, role: str) -> None:
        for m in self.members[role]:
            self._wait_member(m)
            self.startup_s[m.spec.name] = time.monotonic() - m.started_s

    def _wait_member(self, m: Member) -> None:
        deadline = m.started_s + self.cfg.workers.start_timeout_s
        path = Path(m.spec.rendezvous)
        while True:
            rv = read_rendezvous(path)
            if rv is not None:
                m.client = WorkerClient(m.spec.name, rv, self._authkey, m.job, self.cfg.workers.call_timeout_s)
                m.client.call("health", timeout=60)
                if m.spec.network_liveness:
                    m.client.start_pinging(self.cfg.workers.heartbeat_stale_s + PING_MARGIN_S)
                log.info("%s healthy: pid %d on %s:%d", m.spec.name, rv.pid, rv.host, rv.port)
                return
            if m.job.done():
                raise RuntimeError(f"{m.spec.name} worker (job {m.job.job_id}) exited during start-up.\n"
                                   f"--- stderr tail ---\n{stderr_tail(m.job)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{m.spec.name} worker (job {m.job.job_id}) not ready after "
                                   f"{self.cfg.workers.start_timeout_s:.0f}s (raise workers.start_timeout_s; for "
                                   f"SLURM check `squeue`).\n--- stderr tail ---\n{stderr_tail(m.job)}")
            time.sleep(0.1)

    def _assign_nodes(self) -> None:
        """slurm.nodes > 1: the Slurm nodes the plan's node indices stand for (the partition's first usable ones)."""
        if self.cfg.launcher != "slurm" or self.cfg.slurm.nodes == 1:
            return
        nodes = partition_nodes(self.cfg.slurm.partition)
        usable = [n.name for n in nodes if n.usable]
        if len(usable) < self.cfg.slurm.nodes:
            raise ValueError(f"slurm.nodes = {self.cfg.slurm.nodes} but partition "
                             f"{self.cfg.slurm.partition or '(default)'} has {len(usable)} node(s) up "
                             f"({', '.join(f'{n.name} {n.state}' for n in nodes) or 'none'}, `sinfo -N`): lower "
                             "slurm.nodes, or bring nodes back (`scontrol update nodename=… state=resume`)")
        self.node_names = dict(enumerate(usable[: self.cfg.slurm.nodes]))
        log.info("placing workers on Slurm nodes %s", ", ".join(f"{i}={n}" for i, n in self.node_names.items()))

    def _placement(self, job_plan) -> dict[str, str]:
        """The job's sbatch placement: its planned nodes (--nodelist), else away from lost nodes (--exclude)."""
        if job_plan.slots and self.node_names:
            return {"nodelist": ",".join(dict.fromkeys(self.node_names[i] for i in job_plan.slots))}
        if self.lost_nodes and self.cfg.slurm.on_node_loss == "move":
            return {"exclude": ",".join(sorted(self.lost_nodes))}
        return {}

    def _release_lost_job(self, m: Member) -> None:
        """A lost worker's Slurm job: wait for Slurm's verdict; a lost node's job is left to Slurm (it ends it
        NODE_FAIL; a cancel would hide that), any other is cancelled. slurm.on_node_loss `move` re-places the lost
        node's roles on the nodes still up; `wait` keeps them pinned there until Slurm returns it to service."""
        verdict = await_job_verdict(str(m.job.job_id), slurmd_timeout_s() + 5)
        self.losses[m.spec.name] = verdict
        log.warning("%s lost: %s", m.spec.name, verdict.describe())
        if not verdict.lost_nodes:
            if verdict.state in ("RUNNING", "PENDING", "COMPLETING"):
                m.job.cancel()
            return
        if m.client is not None:
            m.client.await_lease_end()  # the cut-off worker has exited by itself: no role runs twice
        if self.cfg.slurm.on_node_loss == "wait":
            log.warning("waiting for node %s to come back (slurm.on_node_loss: wait)", ", ".join(verdict.lost_nodes))
            return
        self.lost_nodes.update(verdict.lost_nodes)
        up = [n.name for n in partition_nodes(self.cfg.slurm.partition) if n.usable and n.name not in self.lost_nodes]
        if not up:
            raise RuntimeError(f"{m.spec.name}: node {', '.join(verdict.lost_nodes)} was lost and no other node of "
                               "the partition is up to move its roles to; set slurm.on_node_loss: wait to wait for "
                               "it (`sinfo -N`)")
        spare = [n for n in up if n not in self.node_names.values()] or up  # an unused node first, else share one
        for index, name in self.node_names.items():
            if name in self.lost_nodes:
                self.node_names[index] = spare[0]
                log.warning("node %d moves from %s to %s (slurm.on_node_loss: move)", index, name, spare[0])

    def _stop_member(self, m: Member, grace_s: float = 10.0) -> None:
        lost = m.client is None or m.client.death_reason() is not None
        if m.client is not None:
            m.client.stop_pinging()
        if not lost:
            try:
                m.client.call("shutdown", timeout=grace_s)
            except WorkerLost:
                lost = True  # already gone: nothing to stop
            m.client.close()
        if lost and self.cfg.launcher == "slurm":
            self._release_lost_job(m)
            return
        deadline = time.monotonic() + grace_s
        while not m.job.done() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not m.job.done():
            log.warning("%s did not stop within %.0fs: cancelling job %s", m.spec.name, grace_s, m.job.job_id)
            m.job.cancel()

    def _touch_heartbeat(self) -> None:
        self.heartbeat_path.touch()

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(2.0):
            self._touch_heartbeat()


def worker_config(cfg: RunConfig) -> dict:
    """The config a worker job receives. submitit pickles it into the job folder, so it carries no secret: workers
    never record to the registry or MLflow, and URL passwords are redacted (the controller keeps the real ones)."""
    return redact_secrets(config_to_dict(cfg))


def stderr_tail(job, lines: int = 30) -> str:
    """Last lines of a submitit job's stderr (or the inline job's error)."""
    try:
        text = job.stderr() or ""
    except Exception as exc:  # the log may not exist yet; say so rather than hide the start-up error
        return f"(stderr unavailable: {exc})"
    return "\n".join(text.splitlines()[-lines:])
