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
