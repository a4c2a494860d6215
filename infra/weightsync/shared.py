"""Shared-memory weight store for one node: versions live in `keep` preallocated slot files under /dev/shm that the
trainer and the generators all map. Publishing copies each tensor's bytes into the slot (no serialization, and no
page allocation after the first version); fetching copies them out, `fetch_into` straight into a model's tensors.

A slot is reused every `keep` versions, so a reader could see a slot being overwritten under it: each slot has a
header file, replaced atomically, saying which version it holds and whether a write is under way. The writer marks
the slot `writing` before it touches the data and `ready` after; a reader checks the header before and after its
copy and raises KeyError when the version it copied is no longer the one there (as the fs store does for a version
it garbage-collected), so a torn copy is never returned.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
from pathlib import Path

import torch

from infra.weightsync.fs import (
    SAFETENSORS_DTYPES,
    byte_layout,
    split_aliases,
    store_directory,
    version_or_latest,
    write_text_atomic,
)

log = logging.getLogger(__name__)

DTYPE_NAMES = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}


class OverwrittenWhileRead(KeyError):
    """fetch_into's version was overwritten during the copy; the targets now hold version `held`, whole."""

    def __init__(self, message: str, held: int):
        super().__init__(message)
        self.held = held


class SharedWeightStore:
    """`publish(version, state_dict)` / `fetch(version)` through `keep` shared-memory slots under `root`."""

    def __init__(self, root: str | Path, keep: int = 2):
        self.root, self.keep = store_directory(root, keep), keep
        self._maps: dict[int, tuple[tuple[int, int], mmap.mmap, torch.Tensor]] = {}  # slot -> (inode, size), map

    def slot_of(self, version: int) -> int:
        return version % self.keep

    def publish(self, version: int, state_dict: dict[str, torch.Tensor]) -> int:
        """Copy `state_dict` into version's slot and move LATEST to it; returns the bytes written."""
        if version < 0:
            raise ValueError(f"policy version must be >= 0, got {version}")
        tensors, aliases = split_aliases({k: v.detach() for k, v in state_dict.items()})
        layout, total = byte_layout(tensors)
        slot = self.slot_of(version)
        self._write_header(slot, {"version": version, "state": "writing"})
        data = self._mapping(slot, total, create=True)
        for name, t in tensors.items():
            _, _, offset, size = layout[name]
            data[offset:offset + size].copy_(t.contiguous().reshape(-1).view(torch.uint8))
        self._write_header(slot, {"version": version, "state": "ready", "layout": layout, "aliases": aliases})
        write_text_atomic(self.root / "LATEST", str(version))
        return total

    def fetch(self, version: int | None = None) -> tuple[int, dict[str, torch.Tensor]]:
        """(version, state_dict) of `version` (None = the latest), copied out of its slot; KeyError when the slot
        holds another version (never published, or overwritten by a newer one, before or during the copy)."""
        version = version_or_latest(self, version)
        slot = self.slot_of(version)
        header = self._ready_header(slot, version)
        total = sum(size for *_, size in header["layout"].values())
        data = self._mapping(slot, total)
        state = {}
        for name, (dtype, shape, offset, size) in header["layout"].items():
            raw = data[offset:offset + size].clone()
            state[name] = raw.view(DTYPE_NAMES[dtype]).reshape(shape)
        self._ready_header(slot, version, during=True)  # still the same version: the copy is whole
        for name, target in header["aliases"].items():  # tied weights are held once
            state[name] = state[target]
        return version, state

    @torch.no_grad()
    def fetch_into(self, version: int | None, targets: dict[str, torch.Tensor]) -> int:
        """Copy `version` (None = the latest) straight from its slot into `targets` (a model's state_dict: same
        names, any device or dtype) — one copy of each byte, where fetch + load_state_dict make two; returns the
        version. KeyError as fetch; OverwrittenWhileRead when the slot was overwritten during the copy (the
        targets are then refilled with the newest version, whole, which it names)."""
        version = version_or_latest(self, version)
        slot = self.slot_of(version)
        header = self._ready_header(slot, version)
        layout, aliases = header["layout"], header["aliases"]
        missing = sorted(set(targets) - set(layout) - set(aliases))
        if missing or set(layout) - set(targets):
            raise KeyError(f"weight version {version} does not match the model: model-only names {missing[:5]}, "
                           f"store-only names {sorted(set(layout) - set(targets))[:5]}")
        data = self._mapping(slot, sum(size for *_, size in layout.values()))
        for name, (dtype, shape, offset, size) in layout.items():
            targets[name].copy_(data[offset:offset + size].view(DTYPE_NAMES[dtype]).reshape(shape))
        for name, source in aliases.items():
            if targets[name].data_ptr() != targets[source].data_ptr():  # tied in the store, not in this model
                targets[name].copy_(targets[source])
        try:
            self._ready_header(slot, version, during=True)
        except KeyError as exc:  # torn: refill the targets with the newest whole version before saying so
            held = self.fetch_into(None, targets)
            raise OverwrittenWhileRead(f"{exc.args[0]}; the model was refilled with version {held}", held) from exc
        return version

    def latest(self) -> int | None:
        pointer = self.root / "LATEST"
        return int(pointer.read_text()) if pointer.exists() else None

    def versions(self) -> list[int]:
        found = []
        for slot in range(self.keep):
            header = self._read_header(slot)
            if header and header.get("state") == "ready":
                found.append(header["version"])
        return sorted(found)

    def clear(self) -> None:
        """Forget every version (a new pool starts from what its trainer publishes)."""
        self.close()
        for path in self.root.glob("slot-*"):
            path.unlink(missing_ok=True)
        (self.root / "LATEST").unlink(missing_ok=True)

    def close(self) -> None:
        """Unmap the slots (the tensors handed out by fetch are copies and stay valid)."""
        for slot in list(self._maps):
            self._unmap(slot)

    # ---- internals ----

    def _ready_header(self, slot: int, version: int, during: bool = False) -> dict:
        header = self._read_header(slot)
        if not header or header.get("version") != version or header.get("state") != "ready":
            held = f"version {header['version']} ({header['state']})" if header else "nothing"
            when = "was overwritten while it was read" if during else "is not in the store"
            raise KeyError(f"weight version {version} {when}: slot {slot} of {self.root} holds {held} "
                           f"(weightsync.keep={self.keep} versions are kept; raise it for older ones)")
        return header

    def _read_header(self, slot: int) -> dict | None:
        path = self.root / f"slot-{slot}.json"
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None

    def _write_header(self, slot: int, header: dict) -> None:
        write_text_atomic(self.root / f"slot-{slot}.json", json.dumps(header))

    def _mapping(self, slot: int, size: int, create: bool = False) -> torch.Tensor:
        """The slot's bytes as a uint8 tensor over a shared mapping (kept while the file stays the same)."""
        path = self.root / f"slot-{slot}.bin"
        if create and (not path.exists() or path.stat().st_size != size):
            # a new file (new inode): readers mapping the old one keep their pages and see the header change
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            with open(tmp, "wb") as f:
                f.truncate(size)
            os.replace(tmp, path)
        stat = path.stat()
        if stat.st_size < size:
            raise KeyError(f"weight slot {path} holds {stat.st_size} bytes, the header says {size}")
        key = (stat.st_ino, stat.st_size)
        cached = self._maps.get(slot)
        if cached is None or cached[0] != key:
            if cached is not None:
                cached = None
                self._unmap(slot)
            with open(path, "r+b") as f:
                mm = mmap.mmap(f.fileno(), stat.st_size)
            cached = (key, mm, torch.frombuffer(mm, dtype=torch.uint8))
            self._maps[slot] = cached
        return cached[2]

    def _unmap(self, slot: int) -> None:
        _, mm, view = self._maps.pop(slot)
        del view  # the tensor holds the mapping's buffer: release it before closing
        mm.close()

