"""A canonical sha256 of a training state (weights, optimizer, scheduler, RNG): equal states hash equal.

The bytes torch.save writes are not canonical (a random serialization id, pickle memo choices), so "the same model"
is checked on the values instead."""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def state_sha256(state) -> str:
    """sha256 over a nested dict/list/tuple of tensors, arrays and scalars, keys in sorted order."""
    h = hashlib.sha256()
    update_digest(h, state)
    return h.hexdigest()


def update_digest(h, value) -> None:
    """Feed one value (recursively) into the hash object `h`, tagged with its type and shape."""
    if isinstance(value, dict):
        h.update(b"{")
        for key in sorted(value, key=str):
            h.update(repr(key).encode() + b":")
            update_digest(h, value[key])
        h.update(b"}")
    elif isinstance(value, (list, tuple)):
        h.update(b"[" if isinstance(value, list) else b"(")
        for item in value:
            update_digest(h, item)
        h.update(b"]")
    elif isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, np.ndarray):
        h.update(f"A{value.dtype}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    else:
        h.update(f"S{type(value).__name__}:{value!r}".encode())
