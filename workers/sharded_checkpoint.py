"""Checkpoints of a multi-rank trainer: model and optimizer shards through torch.distributed.checkpoint (DCP),
each rank writing its own; rank 0 adds the small state (step, scheduler, RNG) and the sha256 of every shard file."""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from forge_core.seeding import restore_rng_states, rng_states
from infra.records import file_sha256

SHARDS = "dcp"


def shard_digests(folder: Path) -> dict[str, str]:
    """{file name: sha256} of the DCP files in `folder`."""
    return {p.name: file_sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}


def save_sharded(trainer, out: Path) -> dict | None:
    """Collective: write model + optimizer shards to out/dcp. Rank 0 returns the small state that completes them
    (step, scheduler, RNG, shard digests); other ranks return None."""
    model_state, optim_state = get_state_dict(trainer.model, trainer.optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(out / SHARDS))
    dist.barrier()  # every rank's file is complete before rank 0 hashes them
    if dist.get_rank() != 0:
        return None
    return {"step": trainer.step, "scheduler": trainer.scheduler.state_dict(), "rng": rng_states(),
            "dcp_sha256": shard_digests(out / SHARDS)}


def load_sharded(trainer, path: Path, small_state: dict) -> None:
    """Collective: restore what save_sharded wrote (resharding to this job's ranks). Raises ValueError when a shard
    file does not match the digest recorded with it."""
    folder = path / SHARDS
    if dist.get_rank() == 0:
        found = shard_digests(folder) if folder.is_dir() else {}
        bad = sorted(name for name, digest in small_state["dcp_sha256"].items() if found.get(name) != digest)
        verdict = [f"checkpoint {path}: shard files missing or changed: {bad}; resume from an earlier checkpoint "
                   "(delete this step's COMPLETE marker)"] if bad else [None]
    else:
        verdict = [None]
    dist.broadcast_object_list(verdict, src=0)  # every rank raises, or none does
    if verdict[0]:
        raise ValueError(verdict[0])
    model_state, optim_state = get_state_dict(trainer.model, trainer.optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    trainer.scheduler.load_state_dict(small_state["scheduler"])
    trainer.step = small_state["step"]
    restore_rng_states(small_state["rng"])
