"""Weight store: the trainer publishes policy version v, generators fetch it (`fs` default; `shared`: one node's
shared-memory slots, no serialization; `torchstore` optional; `broadcast` is a process group the WorkerPool forms
between live workers, see broadcast.py)."""

from __future__ import annotations

import os
from pathlib import Path

from infra.weightsync.fs import FSWeightStore
from infra.weightsync.shared import SharedWeightStore

BACKENDS = ("fs", "shared", "torchstore", "broadcast")
DIRECTORY_BACKENDS = ("fs", "shared")  # stores under weightsync.root (default /dev/shm/forgeflow-<run>)


def default_store_root(run_id: str, nodes_share_memory: bool = True) -> Path:
    """/dev/shm/forgeflow-<run_id> when /dev/shm exists and every worker shares it (one machine), else
    FORGEFLOW_HOME/weights/<run_id> (Slurm: every node reads FORGEFLOW_HOME; each node has its own /dev/shm)."""
    shm = Path("/dev/shm")
    if nodes_share_memory and shm.is_dir() and os.access(shm, os.W_OK):
        return shm / f"forgeflow-{run_id}"
    from infra.paths import forgeflow_home

    return forgeflow_home() / "weights" / run_id


def open_weight_store(backend: str = "fs", root: str | Path | None = None, keep: int = 2):
    """The weight store for `backend`; `root` is required for fs and shared."""
    if backend in DIRECTORY_BACKENDS and root is None:
        raise ValueError(f"weightsync.backend={backend} needs a root directory (weightsync.root)")
    if backend == "fs":
        return FSWeightStore(root, keep=keep)
    if backend == "shared":
        return SharedWeightStore(root, keep=keep)
    if backend == "torchstore":
        from infra.weightsync.torchstore_backend import TorchStoreWeightStore

        return TorchStoreWeightStore(keep=keep)
    if backend == "broadcast":
        raise ValueError("weightsync.backend=broadcast is a process group between live workers, not a store to "
                         "open: start the workers through WorkerPool, which forms it")
    raise ValueError(f"unknown weightsync.backend {backend!r}: choose one of {', '.join(BACKENDS)}")


def load_into_model(store, version: int | None, model) -> int:
    """Put weight `version` (None = the latest) of `store` into `model`; returns the version. A store with
    `fetch_into` copies each byte once, from the store into the parameters; the others fetch, then load."""
    if hasattr(store, "fetch_into"):
        return store.fetch_into(version, model.state_dict())
    version, state = store.fetch(version)
    model.load_state_dict(state)
    return version


__all__ = ["BACKENDS", "DIRECTORY_BACKENDS", "FSWeightStore", "SharedWeightStore", "default_store_root",
           "load_into_model", "open_weight_store"]
