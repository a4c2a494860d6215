"""Checkpoints of a multi-rank trainer: model and optimizer shards through torch.distributed.checkpoint (DCP),
each rank writing its own; rank 0 adds the small state (step, scheduler, RNG) and the sha256 of every shard file."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from forge_core.seeding import restore_rng_states, rng_states
from infra.checkpoints import SHARDS, STATE, file_sha256


def shard_digests(folder: Path) -> dict[str, str]:
    """{file name: sha256} of the DCP files in `folder`."""
    return {p.name: file_sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}


def save_sharded(trainer, out: Path) -> dict | None:
    """Collective: write model + optimizer shards to out/dcp. Rank 0 returns the small state that completes them
    (step, scheduler, RNG, shard digests); other ranks return None."""
    import torch.distributed.checkpoint as dcp  # 0.7 s of imports: only multi-rank trainers need them
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(trainer.model, trainer.optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(out / SHARDS))
    dist.barrier()  # every rank's file is complete before rank 0 hashes them
    if dist.get_rank() != 0:
        return None
    return {"step": trainer.step, "scheduler": trainer.scheduler.state_dict(), "rng": rng_states(),
            "dcp_sha256": shard_digests(out / SHARDS)}


def load_sharded(trainer, path: Path) -> None:
    """Collective: restore what save_sharded wrote (resharding to this job's ranks). Rank 0 reads the small state
    from path/trainer.pt and checks the shard digests; every rank raises ValueError when a shard does not match."""
    import torch.distributed.checkpoint as dcp  # 0.7 s of imports: only multi-rank trainers need them
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    folder = path / SHARDS
    box = [None, None]  # (small state, error)
    if dist.get_rank() == 0:
        small_state = torch.load(path / STATE, weights_only=False, map_location="cpu")
        small_state.pop("model")  # the gathered copy: the shards hold the same weights
        found = shard_digests(folder) if folder.is_dir() else {}
        bad = sorted(name for name, digest in small_state["dcp_sha256"].items() if found.get(name) != digest)
        box = [small_state, f"checkpoint {path}: shard files missing or changed: {bad}; resume from an earlier "
                            "checkpoint (delete this step's COMPLETE marker)" if bad else None]
    dist.broadcast_object_list(box, src=0)  # every rank raises, or none does
    small_state, error = box
    if error:
        raise ValueError(error)
    model_state, optim_state = get_state_dict(trainer.model, trainer.optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    trainer.scheduler.load_state_dict(small_state["scheduler"])
    trainer.step = small_state["step"]
    restore_rng_states(small_state["rng"])
