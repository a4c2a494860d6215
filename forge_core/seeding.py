"""Seeding every random number generator a process uses, so a run's state is a function of its seed."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's `random`, NumPy's global generator and torch's CPU (and CUDA) generators with `seed`.

    Checkpoints save these states; a process that never seeded one would save an OS-random state, and a resumed run
    would then differ from an uninterrupted one in its saved bytes even with equal weights."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_states() -> dict:
    """The states of the generators `seed_everything` seeds (CPU torch, Python, NumPy)."""
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def restore_rng_states(states: dict) -> None:
    """Undo to what `rng_states` returned."""
    torch.set_rng_state(states["torch"].cpu())  # map_location may have moved it to the GPU
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])


def step_seed(run_seed: int, step: int, salt: int = 0) -> int:
    """Sampling seed for (run, step): re-running a step after a rollback samples the same rollouts."""
    return (run_seed * 1_000_003 + step * 7919 + salt) % (2**31 - 1)
