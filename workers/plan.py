"""The worker layout of a run — which jobs, how many nodes, ranks and GPUs each — computed from the config alone,
so `--dry-run` can print it (and refuse an impossible one) on a machine without the cluster or the GPUs."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from infra.config import RunConfig


@dataclass
class RolePlan:
    """How many workers of a role (replicas) and ranks per worker (procs)."""

    role: str
    replicas: int = 1
    procs: int = 1


def plan_roles(cfg: RunConfig, with_reference: bool) -> list[RolePlan]:
    """The roles a GRPO run needs, scaled by config."""
    if cfg.generator.procs > 1 and cfg.generator.backend == "torch":
        raise ValueError(f"generator.procs={cfg.generator.procs}: the torch generator runs one process per replica; "
                         "scale it with generator.num_replicas (procs > 1 is tensor parallelism, generator.backend: "
                         "vllm)")
    if cfg.ref_model.procs > 1:
        raise ValueError(f"ref_model.procs={cfg.ref_model.procs}: the reference worker runs in one process; set "
                         "ref_model.procs: 1 (it only does forward passes; ref_model.device: cpu frees accelerators)")
    plans = [RolePlan("trainer", 1, cfg.trainer.procs),
             RolePlan("generator", cfg.generator.num_replicas, cfg.generator.procs),
             RolePlan("reward", cfg.reward.num_replicas, 1)]
    if with_reference:
        plans.append(RolePlan("reference", 1, cfg.ref_model.procs))
    if cfg.distill.enabled:
        plans.append(RolePlan("teacher", cfg.distill.num_replicas, 1))
    if cfg.env.enabled:
        plans.append(RolePlan("env", cfg.env.num_replicas, 1))
    return plans


@dataclass
class JobPlan:
    """One worker job: `procs` ranks spread over `nodes` nodes, `gpus_per_node` accelerators on each."""

    name: str
    role: str
    procs: int
    nodes: int = 1
    gpus_per_node: int = 0
    devices: tuple[int, ...] = ()  # local launcher: the GPU indices this job sees (CUDA_VISIBLE_DEVICES)
    slots: tuple[int, ...] = ()  # slurm.nodes > 1: the nodes (0 … nodes-1) the job is placed on; () = Slurm's pick

    @property
    def tasks_per_node(self) -> int:
        return self.procs // self.nodes

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def gpus_offered(cfg: RunConfig) -> int:
    """GPUs per node the workers may use: slurm.gpus_per_node on SLURM, workers.gpus on this machine."""
    return cfg.slurm.gpus_per_node if cfg.launcher == "slurm" else cfg.workers.gpus if cfg.launcher == "local" else 0


def uses_gpu(cfg: RunConfig, role: str) -> bool:
    """Whether the role's model lives on an accelerator (rewards and environments never; the reference per
    ref_model.device, the teacher per distill.device)."""
    if gpus_offered(cfg) == 0:
        return False
    if role in ("reward", "env"):
        return False
    if role == "teacher":
        return cfg.distill.device != "cpu"
    return not (role == "reference" and cfg.ref_model.device == "cpu")


def sft_in_workers(cfg: RunConfig) -> bool:
    """Whether SFT runs on a trainer worker (trainer.procs ranks, on GPUs when offered) rather than in the flow's
    own process (one CPU process: the tiny recipes)."""
    return cfg.trainer.procs > 1 or uses_gpu(cfg, "trainer")


FIRST_NODE_ROLES = ("trainer", "reference", "teacher")  # the models that train or score beside the trainer


def placed_nodes(cfg: RunConfig, role: str, index: int) -> tuple[int, ...]:
    """The nodes replica `index` of `role` is placed on (slurm.nodes > 1): slurm.placement's, else the trainer,
    reference and teacher on node 0 and the other roles' replicas round-robin over nodes 1 …; () with one node."""
    nodes = cfg.slurm.nodes if cfg.launcher == "slurm" else 1
    if nodes == 1:
        return ()
    given = cfg.slurm.placement.get(role)
    if given is not None:
        return tuple(given) if isinstance(given, list) else (given,)
    return (0,) if role in FIRST_NODE_ROLES else (1 + index % (nodes - 1),)


def place_job(job: JobPlan, cfg: RunConfig, index: int) -> None:
    """Set the job's placement: a list of nodes in slurm.placement spreads its ranks evenly over them."""
    job.slots = placed_nodes(cfg, job.role, index)
    if len(job.slots) > 1:
        if job.procs % len(job.slots):
            raise ValueError(f"slurm.placement.{job.role} = {list(job.slots)}: {job.procs} ranks "
                             f"({job.role}.procs) do not split evenly over {len(job.slots)} nodes; use a multiple "
                             f"of {len(job.slots)} ranks or fewer nodes")
        job.nodes = len(job.slots)


def plan_jobs(cfg: RunConfig, with_reference: bool) -> list[JobPlan]:
    """One JobPlan per worker; a multi-rank GPU role larger than a node spans ceil(procs / gpus_per_node) nodes."""
    jobs, next_device = [], 0
    for role in plan_roles(cfg, with_reference):
        # a vLLM generator is one process that starts its own tensor-parallel workers on its job's GPUs
        vllm = role.role == "generator" and cfg.generator.backend == "vllm"
        for index in range(role.replicas):
            job = JobPlan(f"{role.role}-{index}", role.role, 1 if vllm else role.procs)
            place_job(job, cfg, index)
            if uses_gpu(cfg, role.role):
                gpn = cfg.slurm.gpus_per_node
                if cfg.launcher == "local" or (role.procs <= gpn and job.nodes == 1):
                    job.gpus_per_node = role.procs
                elif vllm:
                    raise ValueError(f"generator.procs = {role.procs} exceeds slurm.gpus_per_node ({gpn}): vLLM "
                                     "tensor parallelism stays within one node; lower generator.procs")
                else:
                    if job.nodes == 1:  # larger than a node: Slurm picks the nodes
                        job.nodes, job.slots = math.ceil(role.procs / gpn), ()
                        if role.procs % job.nodes:
                            raise ValueError(f"{role.role}: {role.procs} ranks do not split evenly over "
                                             f"{job.nodes} nodes of {gpn} GPUs; use a multiple of "
                                             f"slurm.gpus_per_node ({gpn}) for {role.role}.procs")
                    job.gpus_per_node = job.tasks_per_node
                if cfg.launcher == "local":  # one machine: hand out device indices
                    job.devices = tuple(range(next_device, next_device + job.gpus))
                    next_device += job.gpus
            jobs.append(job)
    return jobs


def check_capacity(cfg: RunConfig, jobs: list[JobPlan]) -> None:
    """Refuse a layout that needs more GPUs than offered (slurm.nodes × slurm.gpus_per_node, or workers.gpus on
    this machine), naming the ways out."""
    if gpus_offered(cfg) == 0:
        return
    slurm = cfg.launcher == "slurm"
    need, have = sum(j.gpus for j in jobs), cfg.slurm.nodes * cfg.slurm.gpus_per_node if slurm else cfg.workers.gpus
    if need > have:
        detail = ", ".join(f"{j.name} {j.gpus}" for j in jobs if j.gpus)
        offered = "slurm.nodes × slurm.gpus_per_node" if slurm else "workers.gpus"
        raise ValueError(f"the layout needs {need} GPUs ({detail}) but {offered} = {have}; "
                         "put the reference model on CPU (ref_model.device: cpu) or drop it (loss.beta: 0), lower "
                         "generator.num_replicas / trainer.procs, or raise slurm.nodes")


def titan_layout(cfg) -> str:
    """' (FSDP d x TP t[ x PP p], AC mode)' for trainer.backend titan, else ''."""
    t = cfg.trainer
    if t.backend != "titan":
        return ""
    dp = t.procs // (t.tensor_parallel_degree * t.pipeline_parallel_degree)
    pp = f" x PP {t.pipeline_parallel_degree}" if t.pipeline_parallel_degree > 1 else ""
    return (f" (FSDP {dp} x TP {t.tensor_parallel_degree}{pp}, activation checkpointing "
            f"{t.activation_checkpointing})")


def render_plan(cfg: RunConfig, jobs: list[JobPlan], config_path: str, sft: bool = False) -> str:
    """A human-readable plan: the resolved recipe (GRPO, or with `sft` its SFT phase) and one line per worker job."""
    dataset = f"dataset {cfg.dataset.kind}" + (f" {cfg.dataset.path}" if cfg.dataset.path else "")
    if sft:
        title = (f"plan for {config_path}: SFT {cfg.sft.steps} steps of {cfg.model.path} ({cfg.model.dtype}), batch "
                 f"{cfg.sft.batch_size}, lr {cfg.sft.lr}, {dataset}")
        backends = f"  trainer backend {cfg.trainer.backend}{titan_layout(cfg)}"
    else:
        title = (f"plan for {config_path}: {cfg.steps} GRPO steps ({cfg.loss.name}), {cfg.prompts_per_step} "
                 f"prompts x {cfg.group_size} samples, model {cfg.model.path} ({cfg.model.dtype}), {dataset}")
        backends = (f"  generator backend {cfg.generator.backend}, trainer backend {cfg.trainer.backend}"
                    f"{titan_layout(cfg)}, weight sync {cfg.weightsync.backend} every {cfg.weightsync.sync_every} "
                    "step(s)")
    lines = [title,
             f"  launcher {cfg.launcher}" + (f": partition {cfg.slurm.partition or '(default)'}, "
                                             f"{cfg.slurm.nodes} node(s) x {cfg.slurm.gpus_per_node} GPU, "
                                             f"time {cfg.slurm.time}" if cfg.launcher == "slurm" else
                                             f" ({cfg.workers.gpus} GPUs offered)" if cfg.workers.gpus else ""),
             backends,
             f"  {'job':<14}{'role':<11}{'ranks':>6}{'nodes':>7}{'GPUs/node':>11}{'GPUs':>6}"]
    for j in jobs:
        placed = f"  on node {','.join(map(str, j.slots))}" if j.slots else ""
        lines.append(f"  {j.name:<14}{j.role:<11}{j.procs:>6}{j.nodes:>7}{j.gpus_per_node:>11}{j.gpus:>6}{placed}")
    for j in jobs:
        if j.devices:
            lines.append(f"  {j.name} sees CUDA devices {','.join(map(str, j.devices))}")
    lines.append(f"  total GPUs {sum(j.gpus for j in jobs)}" + ("" if sft else f"; SFT warm-up steps {cfg.sft.steps}"))
    return "\n".join(lines)


def sbatch_script(cfg: RunConfig, config_path: str, overrides: list[str], command: str = "grpo") -> str:
    """The equivalent batch script: the controller (`forgeflow grpo|sft`) runs in a small CPU job and submits the
    worker jobs itself."""
    s = cfg.slurm
    head = ["#!/bin/bash", "#SBATCH --job-name=forgeflow-controller", "#SBATCH --nodes=1", "#SBATCH --ntasks=1",
            "#SBATCH --cpus-per-task=4", f"#SBATCH --time={s.time}"]
    head += [f"#SBATCH --{key}={getattr(s, key)}" for key in ("partition", "account", "qos") if getattr(s, key)]
    args = " ".join(shlex.quote(a) for a in ["--config", config_path, *overrides])
    return "\n".join(head + [
        f"# The controller needs no GPU: it submits one SLURM job per worker (see `forgeflow {command} --dry-run`).",
        "# FORGEFLOW_HOME and weightsync.root must be on a filesystem every node can read.",
        "set -euo pipefail",
        'cd "${SLURM_SUBMIT_DIR}"',
        'export FORGEFLOW_HOME="${FORGEFLOW_HOME:-$PWD/.forgeflow}"',
        f".venv/bin/forgeflow {command} {args}",
        ""])
