"""File-system weight store: one safetensors file per policy version, written atomically.

On one node the default root is /dev/shm (RAM-backed, so publish/fetch is a memory copy plus a syscall);
across nodes point it at a shared filesystem. Readers never see a partial file: the writer writes `v.tmp`
and renames it, and the `LATEST` pointer is replaced the same way after the file exists.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

log = logging.getLogger(__name__)

_VERSION_FILE = re.compile(r"^v(\d{8})\.safetensors$")


class FSWeightStore:
    """Versioned `publish(version, state_dict)` / `fetch(version)` under `root`, keeping the newest `keep`."""

    def __init__(self, root: str | Path, keep: int = 2):
        self.root, self.keep = store_directory(root, keep), keep

    def path_for(self, version: int) -> Path:
        return self.root / f"v{version:08d}.safetensors"

    def publish(self, version: int, state_dict: dict[str, torch.Tensor]) -> Path:
        """Write `state_dict` as `version` atomically, move LATEST to it, drop versions older than `keep`."""
        if version < 0:
            raise ValueError(f"policy version must be >= 0, got {version}")
        tensors, aliases = split_aliases({k: v.detach() for k, v in state_dict.items()})
        final = self.path_for(version)
        tmp = final.with_suffix(f".tmp{os.getpid()}")
        write_safetensors(tensors, tmp, {"policy_version": str(version), "aliases": json.dumps(aliases)})
        os.replace(tmp, final)
        write_text_atomic(self.root / "LATEST", str(version))
        self.collect_garbage(current=version)
        return final

    def fetch(self, version: int | None = None) -> tuple[int, dict[str, torch.Tensor]]:
        """(version, state_dict) of `version` (None = the latest); raises KeyError naming what exists."""
        version = version_or_latest(self, version)
        path = self.path_for(version)
        if not path.exists():
            raise KeyError(f"weight version {version} is not in {self.root} (have {self.versions()}); "
                           f"it was garbage-collected or never published")
        with safe_open(str(path), framework="pt") as f:
            aliases = json.loads((f.metadata() or {}).get("aliases", "{}"))
        tensors = load_file(str(path))
        for name, target in aliases.items():  # tied weights (e.g. lm_head = embed_tokens) are stored once
            tensors[name] = tensors[target]
        return version, tensors

    def latest(self) -> int | None:
        pointer = self.root / "LATEST"
        return int(pointer.read_text()) if pointer.exists() else None

    def versions(self) -> list[int]:
        found = (_VERSION_FILE.match(p.name) for p in self.root.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def collect_garbage(self, current: int | None = None) -> list[int]:
        """Keep the newest `keep` versions up to `current`; versions above it belong to an abandoned timeline
        (a run resumed from an earlier checkpoint) and go too. Returns the deleted versions."""
        versions = self.versions()
        if current is not None:
            newer = [v for v in versions if v > current]
            versions = [v for v in versions if v <= current]
        else:
            newer = []
        old = versions[: -self.keep] + newer
        for v in old:
            self.path_for(v).unlink(missing_ok=True)
        return old

    def clear(self) -> None:
        """Delete every version (a new pool starts from what its trainer publishes)."""
        for v in self.versions():
            self.path_for(v).unlink(missing_ok=True)
        (self.root / "LATEST").unlink(missing_ok=True)

    def close(self) -> None:
        """Nothing to release for files; present for the store interface."""


def split_aliases(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Keep one name per shared storage (safetensors refuses duplicates); return (unique tensors, alias → kept)."""
    seen: dict[tuple, str] = {}
    unique, aliases = {}, {}
    for name, t in tensors.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        if key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
            unique[name] = t
    return unique, aliases


SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                      torch.bool: "BOOL"}


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """Write a safetensors file streaming each tensor's bytes straight from its memory (safetensors' save_file first
    builds the whole file in one bytes object: a second copy of the model, at half the speed). GPU tensors are
    staged through one pinned host buffer."""
    layout, _ = byte_layout(tensors)
    header: dict = {"__metadata__": metadata}
    for name, (dtype, shape, offset, size) in layout.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    staging = _pinned_staging(tensors)
    with open(path, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for t in tensors.values():
            f.write(memoryview(_host_bytes(t, staging).numpy()))


def version_or_latest(store, version: int | None) -> int:
    """`version`, or the store's latest when None; KeyError when nothing was published."""
    if version is None:
        version = store.latest()
        if version is None:
            raise KeyError(f"weight store {store.root} is empty: nothing was published yet")
    return version


def store_directory(root: str | Path, keep: int) -> Path:
    """The store's directory (created), after checking `keep`."""
    if keep < 1:
        raise ValueError(f"weight store keep={keep}: keep at least 1 version (set weightsync.keep >= 1)")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    return root


def byte_layout(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, list], int]:
    """{name: [safetensors dtype, shape, byte offset, bytes]} of the tensors laid end to end, and the total bytes;
    ValueError naming a tensor of a dtype the stores cannot hold."""
    layout, offset = {}, 0
    for name, t in tensors.items():
        if t.dtype not in SAFETENSORS_DTYPES:
            raise ValueError(f"weight {name!r} has dtype {t.dtype}, which the weight store cannot hold "
                             f"(supported: {', '.join(str(d) for d in SAFETENSORS_DTYPES)})")
        size = t.numel() * t.element_size()
        layout[name] = [SAFETENSORS_DTYPES[t.dtype], list(t.shape), offset, size]
        offset += size
    return layout, offset


def _pinned_staging(tensors: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """One pinned byte buffer as large as the largest GPU tensor (None when all are on the host)."""
    sizes = [t.numel() * t.element_size() for t in tensors.values() if t.device.type == "cuda"]
    return torch.empty(max(sizes), dtype=torch.uint8, pin_memory=True) if sizes else None


def _host_bytes(t: torch.Tensor, staging: torch.Tensor | None) -> torch.Tensor:
    """The tensor's bytes as a flat uint8 CPU tensor (a view when it is already contiguous on the host)."""
    flat = t.contiguous().reshape(-1).view(torch.uint8)
    if flat.device.type == "cpu":
        return flat
    host = staging[:flat.numel()]
    host.copy_(flat)  # synchronous: the buffer is reused for the next tensor
    return host


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` so that readers see the old or the new content, never a part."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
