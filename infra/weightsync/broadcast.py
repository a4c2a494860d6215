"""Collective weight broadcast (`weightsync.backend: broadcast`): the trainer sends each published version to every
generator over one process group of their own (NCCL between GPUs, gloo on CPU) — no disk and no store in between.

Trade-offs against the `fs` store: one broadcast reaches all generators at link speed (NVLink/InfiniBand with NCCL),
but every member must stay alive: a dead generator makes the next publish fail (after `timeout_s`). The WorkerPool
then forms a new group with the restarted worker (`open_weight_group` / `join_weight_group`) and the trainer
republishes its current version; versions sent before are gone with the dead group. The group is standalone (its own
TCPStore, hosted by the trainer), so it does not disturb the trainer's FSDP process group.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from forge_core.generation.decoder import GRAPH_CAPTURE
from infra.dist_store import MasterStore, connect_store

log = logging.getLogger(__name__)

STOP = -1  # header version that ends the receivers' loop
STORE_PREFIX = "forgeflow-weights"  # the group's keys in the rendezvous store
BUCKET_BYTES = 64 << 20  # tensors go in buckets of about this size: one collective each, one bucket on the device


ALIGN = 16  # each tensor starts at a multiple of this many bytes in its bucket (a view of any dtype is aligned)


def slot_bytes(entry: list) -> int:
    """Bytes a header entry [name, shape, dtype] takes in a bucket, rounded up to ALIGN."""
    _, shape, dtype = entry
    return -(-math.prod(shape) * getattr(torch, dtype).itemsize // ALIGN) * ALIGN


def plan_buckets(spec: list[list], limit: int) -> list[list[int]]:
    """Indices of the header's tensors ([name, shape, dtype]) grouped in order into buckets of at most `limit`
    bytes (a bigger tensor alone); sender and receivers derive the same plan from the header."""
    buckets: list[list[int]] = [[]]
    size = 0
    for i, entry in enumerate(spec):
        nbytes = slot_bytes(entry)
        if buckets[-1] and size + nbytes > limit:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return buckets if buckets[0] else []


def nccl_group(store, rank: int, world_size: int, timeout: timedelta):
    """A standalone NCCL group whose collectives give up after `timeout` instead of NCCL's default of 10 minutes or
    more. Unlike gloo's, NCCL's wait does not raise: its watchdog then ends the process (TORCH_NCCL_ASYNC_ERROR_HANDLING
    defaults to 3, tear down), which the worker pool handles as a lost worker."""
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout  # what init_process_group(timeout=…) sets on its NCCL backend too
    return dist.ProcessGroupNCCL(store, rank, world_size, options)


def form_weight_group(store, rank: int, world_size: int, timeout: timedelta, device: torch.device):
    """The weight-broadcast group over `store` (under its own key prefix): gloo on CPU, NCCL on CUDA, either one's
    collectives failing after `timeout` when a member does not take part."""
    prefixed = dist.PrefixStore(STORE_PREFIX, store)
    if device.type == "cpu":
        return dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    return nccl_group(prefixed, rank, world_size, timeout)


def allocate_outside_capture(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised [numel] buffer on `device`, allocated while no CUDA graph is being captured in this process
    (GRAPH_CAPTURE): a receiver thread's allocation during a capture would land in it or break it."""
    with GRAPH_CAPTURE:
        return torch.empty(numel, dtype=dtype, device=device)


class BroadcastWeightSync:
    """rank 0 (the trainer): `publish(version, state_dict)`; ranks 1..N (generators): `fetch(version)` / `latest()`
    of the versions received in the background, newest `keep` kept in memory.

    Construction never blocks on the other members: rank 0 hosts the rendezvous (port 0 picks a free one, see
    `address`) and every rank forms the group in the background; publish and fetch wait for it."""

    def __init__(self, address: str, rank: int, world_size: int, keep: int = 2, timeout_s: float = 600.0,
                 device: str = "cpu", bucket_bytes: int = BUCKET_BYTES):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"weight broadcast address {address!r} must be HOST:PORT")
        if device != "cpu" and not torch.cuda.is_available():
            raise ValueError(f"weight broadcast on {device!r} needs CUDA, which this process lacks; run the trainer "
                             "and generators on GPUs or use weightsync.backend: fs")
        self.rank, self.world_size, self.keep, self.timeout_s = rank, world_size, keep, timeout_s
        self.device, self.bucket_bytes = torch.device(device), bucket_bytes
        # the TCPStore server lives in rank 0 on a port bound before use, on loopback when `host` is (keep it
        # referenced); clients retry until it is up
        if rank == 0:
            self._master = MasterStore(host, world_size, timeout_s)
            self._store, self.address = self._master.store, self._master.address
        else:
            self._store, self.address = connect_store(address, world_size, timeout_s), address
        self.group = None
        self._versions: dict[int, dict[str, torch.Tensor]] = {}
        self._arrived = threading.Condition()
        self._formed = threading.Event()
        self._error: BaseException | None = None
        self._retired = False
        self._thread = threading.Thread(target=self._run, name="weight-broadcast", daemon=True)
        self._thread.start()

    # ---- sender (rank 0) ----

    def publish(self, version: int, state_dict: dict[str, torch.Tensor]) -> int:
        """Broadcast `state_dict` as `version` to every receiver (blocks until they all have it)."""
        if self.rank != 0:
            raise ValueError("only rank 0 of the weight-broadcast group (the trainer) publishes")
        self.wait_formed()
        names = list(state_dict)
        spec = [[k, list(state_dict[k].shape), str(state_dict[k].dtype).removeprefix("torch.")] for k in names]
        try:
            self._broadcast_header([version, spec, self.bucket_bytes])
            for bucket in plan_buckets(spec, self.bucket_bytes):
                # one bucket on the device at a time, its tensors' bytes side by side
                buffer = torch.zeros(sum(slot_bytes(spec[i]) for i in bucket), dtype=torch.uint8, device=self.device)
                at = 0
                for i in bucket:
                    data = state_dict[names[i]].detach().contiguous().reshape(-1).view(torch.uint8)
                    buffer[at:at + data.numel()].copy_(data)
                    at += slot_bytes(spec[i])
                self._broadcast(buffer)
        except RuntimeError as exc:
            raise RuntimeError(f"weight broadcast of version {version} failed ({exc}); a generator in the group is "
                               "gone: the worker pool re-forms the group when it restarts the generator (or use "
                               "weightsync.backend: fs, which needs no live group)") from exc
        return version

    def wait_formed(self, timeout_s: float | None = None) -> bool:
        """Block until every member has joined the group; raise what went wrong if it could not form. With
        `timeout_s`, give up after it and return False while the group is still forming."""
        if not self._formed.wait(self.timeout_s if timeout_s is None else timeout_s):
            if timeout_s is not None:
                return False
            raise TimeoutError(f"weight-broadcast group of {self.world_size} at {self.address} did not form within "
                               f"{self.timeout_s:.0f} s: a member never joined")
        if self.group is None:
            raise RuntimeError(f"weight-broadcast group at {self.address} failed to form: {self._error}") \
                from self._error
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Rank 0: tell the receivers to stop (at most `timeout_s` per message: a member may be gone already).
        Receivers: wait for that."""
        if self.rank == 0:
            if self._formed.is_set() and self.group is not None:
                self._broadcast_header([STOP, []], timeout_s)
        else:
            self._thread.join(self.timeout_s)

    def retire(self) -> None:
        """Drop this group (a new one replaces it): free the kept versions; its receiver's end is expected."""
        with self._arrived:
            self._retired = True
            self._versions.clear()

    # ---- receivers (ranks > 0) ----

    def fetch(self, version: int | None = None) -> tuple[int, dict[str, torch.Tensor]]:
        """(version, state_dict) once `version` (None: the newest received) has arrived; KeyError for a version
        older than the ones kept; TimeoutError after timeout_s."""
        if self.rank == 0:
            raise ValueError("rank 0 of the weight-broadcast group publishes; generators fetch")
        with self._arrived:
            ready = lambda: self._error or (self._versions and (version is None or max(self._versions) >= version))  # noqa: E731
            if not self._arrived.wait_for(ready, self.timeout_s):
                raise TimeoutError(f"weight version {version} did not arrive within {self.timeout_s} s")
            if self._error:
                raise RuntimeError(f"weight broadcast receiver failed: {self._error}") from self._error
            version = max(self._versions) if version is None else version
            if version not in self._versions:
                raise KeyError(f"weight version {version} is not kept (have {sorted(self._versions)})")
            return version, self._versions[version]

    def latest(self) -> int | None:
        with self._arrived:
            return max(self._versions) if self._versions else None

    def _run(self) -> None:
        try:
            self.group = form_weight_group(self._store, self.rank, self.world_size,
                                           timedelta(seconds=self.timeout_s), self.device)
        except BaseException as exc:  # reported by wait_formed / fetch
            self._fail(exc, "could not form")
            return
        finally:
            self._formed.set()
        if self.rank > 0:
            self._receive_loop()

    def _receive_loop(self) -> None:
        # on CUDA the receiver works on a stream of its own, beside the generator's decoding
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        try:
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                while True:
                    version, spec, *rest = self._broadcast_header(None)
                    if version == STOP:
                        return
                    state = self._receive_tensors(spec, rest[0] if rest else self.bucket_bytes)
                    if stream is not None:
                        stream.synchronize()  # complete before any fetch hands the tensors out
                    if not self._keep(version, state):
                        return
        except BaseException as exc:  # reported to the next fetch, which raises it
            self._fail(exc, "receiver stopped")

    def _receive_tensors(self, spec: list[list], bucket_bytes: int) -> dict[str, torch.Tensor]:
        """One version's tensors, bucket by bucket as published (each bucket allocated outside any graph capture)."""
        state = {}
        for bucket in plan_buckets(spec, bucket_bytes):
            nbytes = sum(slot_bytes(spec[i]) for i in bucket)
            buffer = allocate_outside_capture(nbytes, torch.uint8, self.device)
            self._broadcast(buffer)
            at = 0
            for i in bucket:
                name, shape, dtype = spec[i]
                kind = getattr(torch, dtype)
                state[name] = buffer[at:at + math.prod(shape) * kind.itemsize].view(kind).reshape(shape)
                at += slot_bytes(spec[i])
        return state

    def _keep(self, version: int, state: dict[str, torch.Tensor]) -> bool:
        """Hand a received version to fetch (newest `keep` kept); False once this group was retired."""
        with self._arrived:
            if self._retired:
                return False
            self._versions[version] = state
            for old in sorted(self._versions)[:-self.keep]:
                del self._versions[old]
            self._arrived.notify_all()
            return True

    def _fail(self, exc: BaseException, what: str) -> None:
        with self._arrived:
            self._error = exc
            self._arrived.notify_all()
            retired = self._retired
        if retired:  # the pool replaced this group: its members going away is expected
            log.info("retired weight-broadcast group %s ended: %s", self.address, exc)
        else:
            log.error("weight-broadcast group %s %s: %s", self.address, what, exc)

    # ---- wire format: a JSON header (length, then bytes), then each tensor in header order ----

    def _broadcast(self, tensor: torch.Tensor, timeout_s: float | None = None) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        work = self.group.broadcast([tensor], opts)
        if timeout_s is None:
            work.wait()
        elif not work.wait(timedelta(seconds=timeout_s)):
            raise TimeoutError(f"weight broadcast did not complete within {timeout_s} s")

    def _broadcast_header(self, header, timeout_s: float | None = None):
        """Rank 0 sends `header` (JSON: its length [1], then its bytes); receivers return it. A receiver allocates
        both buffers outside any graph capture (the generator may be capturing while it waits here)."""
        if self.rank == 0:
            payload = json.dumps(header).encode()
            self._broadcast(torch.tensor([len(payload)], dtype=torch.long, device=self.device), timeout_s)
            self._broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(self.device), timeout_s)
            return header
        length = allocate_outside_capture(1, torch.long, self.device)
        self._broadcast(length, timeout_s)
        buffer = allocate_outside_capture(int(length.item()), torch.uint8, self.device)
        self._broadcast(buffer, timeout_s)
        return json.loads(buffer.cpu().numpy().tobytes())
