"""What Slurm says about its nodes and a worker's job: the nodes a run is placed on, and why a worker was lost.

A worker found dead is either a lost process (its job ends at once: slurmstepd sees the exit) or a lost node (the job
stays RUNNING until slurmctld stops hearing from the node's slurmd, marks it not responding — `idle*` — and after
SlurmdTimeout DOWN, ending its jobs NODE_FAIL). `await_job_verdict` waits for whichever comes first.
"""

from __future__ import annotations

import logging
import subprocess
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

USABLE = ("idle", "mix", "alloc", "comp")  # sinfo %t states a job can start on (no `*`: not responding)


@dataclass(frozen=True)
class NodeState:
    """A node and its sinfo short state (`idle`, `mix`, `down*`, `idle*`: not responding, …)."""

    name: str
    state: str

    @property
    def usable(self) -> bool:
        return self.state in USABLE


@dataclass(frozen=True)
class JobVerdict:
    """A worker job as the Slurm controller sees it: its state, its nodes and theirs."""

    job_id: str
    state: str  # RUNNING, NODE_FAIL, CANCELLED, FAILED, … ('' when Slurm no longer knows the job)
    nodes: tuple[str, ...] = ()
    node_states: dict = field(default_factory=dict)

    @property
    def lost_nodes(self) -> tuple[str, ...]:
        """The job's nodes that are down or not responding."""
        return tuple(n for n in self.nodes if not NodeState(n, self.node_states.get(n, "")).usable)

    def describe(self) -> str:
        nodes = ", ".join(f"{n} ({self.node_states.get(n, '?')})" for n in self.nodes) or "no node"
        return f"Slurm job {self.job_id} on {nodes}, job state {self.state or 'unknown'}"


def run_slurm(args: list[str]) -> str:
    """stdout of a Slurm command; RuntimeError naming it and its error when it fails."""
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def partition_nodes(partition: str | None = None) -> list[NodeState]:
    """Every node of `partition` (None: the default one) with its state, by name."""
    args = ["sinfo", "-h", "-N", "-o", "%N %t"] + (["-p", partition] if partition else [])
    rows = [line.split() for line in run_slurm(args).splitlines() if line.strip()]
    return sorted({NodeState(name, state) for name, state in rows}, key=lambda n: n.name)


def expand_hostlist(hostlist: str) -> tuple[str, ...]:
    """'ff-node[1-2]' → ('ff-node1', 'ff-node2') (Slurm's own expansion)."""
    if not hostlist or hostlist in ("(null)", "None assigned"):
        return ()
    return tuple(run_slurm(["scontrol", "show", "hostnames", hostlist]).split())


def job_verdict(job_id: str) -> JobVerdict:
    """The controller's view of a job (`scontrol show job`), with the state of each of its nodes."""
    out = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], capture_output=True, text=True, timeout=60)
    if out.returncode != 0 or not out.stdout.strip():
        return JobVerdict(str(job_id), "")
    fields = dict(tok.split("=", 1) for tok in out.stdout.split() if "=" in tok)
    nodes = expand_hostlist(fields.get("NodeList", ""))
    states = {n.name: n.state for n in partition_nodes(fields.get("Partition")) if n.name in nodes}
    return JobVerdict(str(job_id), fields.get("JobState", ""), nodes, states)


def slurmd_timeout_s() -> float:
    """The cluster's SlurmdTimeout: how long slurmctld waits for a silent node before marking it DOWN."""
    for line in run_slurm(["scontrol", "show", "config"]).splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "SlurmdTimeout":
            return float(value.split()[0])
    return 300.0  # Slurm's default


def await_job_verdict(job_id: str, wait_s: float, poll_s: float = 1.0) -> JobVerdict:
    """The job's verdict once Slurm has one (the job ended, or a node of it stopped answering), or after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        verdict = job_verdict(job_id)
        if verdict.state not in ("RUNNING", "COMPLETING") or verdict.lost_nodes or time.monotonic() > deadline:
            return verdict
        time.sleep(poll_s)
