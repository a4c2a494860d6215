"""Calls that every rank of a multi-rank worker runs together, with failures that no rank can hide.

Rank 0 serves the controller; ranks > 0 `follow` what it broadcasts. After each call the ranks exchange whether it
raised, so an error on any rank reaches the controller from rank 0 (naming the rank), instead of being logged on a
rank whose log nobody reads while rank 0 reports success.
"""

from __future__ import annotations

import functools
import logging

import torch.distributed as dist

log = logging.getLogger(__name__)


def collective(method):
    """Decorator for a worker method all ranks run: rank 0 fans the call out, every rank runs it, then all agree
    on failure. Needs `self.rank` and `self.world`."""
    name = method.__name__

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if self.world == 1:
            return method(self, *args, **kwargs)
        if self.rank == 0:
            dist.broadcast_object_list([(name, args, kwargs)], src=0)
        try:
            result, error = method(self, *args, **kwargs), None
        except Exception as exc:  # raised below once every rank has said how its part went
            result, error = None, exc
        failures: list[str | None] = [None] * self.world
        dist.all_gather_object(failures, None if error is None else f"{type(error).__name__}: {error}")
        if error is not None:
            raise error
        failed = {rank: why for rank, why in enumerate(failures) if why}
        if failed and self.rank == 0:
            raise RuntimeError(f"{name} failed on rank(s) {sorted(failed)} of {self.world}: "
                               + "; ".join(f"rank {r}: {why}" for r, why in failed.items())
                               + " (each rank's log in the worker's job folder has its traceback)")
        return result

    return call


def follow_calls(worker) -> None:
    """Ranks > 0: run each call rank 0 broadcasts until `shutdown`. A failed call was reported to the controller by
    rank 0 (see `collective`); this rank logs it and serves the next call (a resume from a checkpoint, shutdown)."""
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        name, args, kwargs = box[0]
        try:
            getattr(worker, name)(*args, **kwargs)
        except Exception:
            log.exception("rank %d: %s failed (reported to the controller by rank 0)", worker.rank, name)
        if name == "shutdown":
            return
